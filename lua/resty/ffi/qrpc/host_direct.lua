-- resty.ffi.qrpc.host_direct: the calls of the built-in host that get
-- their answer at once, on the nginx thread, and that both hosts use:
-- event and close (qrpc_query), queries (PEERS, CONFIGURE, ...), a
-- connection's counters (qrpc_stats), and cancels (through the submit
-- queue, behind the call they cancel).

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"

local ffi_new = ffi.new
local ffi_string = ffi.string
local ffi_cast = ffi.cast

local ngx_now = ngx.now

local tonumber = tonumber
local pairs = pairs
local next = next

local OP_EVENT = abi.OP_EVENT
local OP_CLOSE = abi.OP_CLOSE
local OP_CANCEL = abi.OP_CANCEL
local QRPC_OK = abi.QRPC_OK
local QRPC_ERR_FULL = abi.QRPC_ERR_FULL
local cmd_t = abi.cmd_t
local new_errbuf = abi.new_errbuf
local ERRBUF_LEN = abi.ERRBUF_LEN
local status_err = abi.status_err
local submit_err = abi.submit_err
local fill_cmd = abi.fill_cmd

local _M = {}

local lib               -- the loaded library; nil until init()

local vm = 0            -- this Lua VM's index (qrpc_vm_open)

-- Every command, answer pointer and error buffer below is the call's own
-- (ffi.new per call): nothing filled for one call can be seen by another,
-- whatever yields in between.


-- init(lib, vm): the library, and this Lua VM's index (qrpc_vm_open).
function _M.init(l, v)
    lib = l
    vm = v
end


-- vm_token() tells this Lua VM from another of the process (qrpc_vm_open):
-- the address of a block of this VM's heap, mixed with the time, so that
-- a VM made later at a freed VM's address is still another (one per VM:
-- host_builtin, which holds this module, is kept in the registry). Never 0.
local token_anchor = ffi_new("char[1]")
function _M.vm_token()
    local t = ffi_cast("uint64_t", ffi_cast("uintptr_t", token_anchor)) * 1000003ULL
              + ffi_cast("uint64_t", ngx_now() * 1e6)
    return t == 0ULL and 1ULL or t
end


-- Through the C submit queue, like the UNARY it cancels: queued after it,
-- it cannot overtake it.
-- A cancel the queue refuses as full is kept and sent again by the
-- dispatcher's next sweep: dropped, Go would hold the call (and its
-- server's in-flight slot) until its deadline. late_cancels[id] = handle.
local late_cancels = {}
-- How many: the dispatcher asks after every call, and a loop that counts
-- them (it loops 0 times) got hot and aborted its root trace on leaving
-- ("leaving loop in root trace"), in some runs.
local nlate = 0

local function cancel(handle, id)
    local rc = lib.qrpc_submit_async(fill_cmd(ffi_new(cmd_t), {
        op = OP_CANCEL, conn = handle, id = id, vm = vm }))
    if rc == QRPC_ERR_FULL then
        if late_cancels[id] == nil then
            nlate = nlate + 1
        end
        late_cancels[id] = handle or 0
    end
    return rc
end


-- Sends the cancels a full queue refused; stops at the first refusal.
local function retry_cancels()
    if next(late_cancels) == nil then
        return
    end
    for id, handle in pairs(late_cancels) do
        late_cancels[id] = nil
        nlate = nlate - 1
        if cancel(handle, id) == QRPC_ERR_FULL then
            return
        end
    end
end
_M.cancel = cancel
_M.retry_cancels = retry_cancels
_M.late_cancels = function()
    return nlate
end


-- Runs the command c (abi.fill_cmd) with qrpc_query: returns the status
-- and, on failure, the error; on success the answer, freed.
local function run_now(c)
    local qout = ffi_new("char *[1]")
    local qlen = ffi_new("size_t[1]")
    local errbuf = new_errbuf()
    local rc = lib.qrpc_query(fill_cmd(ffi_new(cmd_t), c), qout, qlen, errbuf,
                              ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return rc, submit_err(rc, errbuf)
    end
    local p = qout[0]
    if p == nil then
        return rc, ""
    end
    local out = ffi_string(p, qlen[0])
    lib.qrpc_release(p)
    return rc, out
end


-- Runs c when its answer is no data (EVENT, CLOSE).
local function run_nodata(c)
    local rc, err = run_now(c)
    if rc ~= QRPC_OK then
        return rc, err
    end
    return rc
end


local function close_handle(handle)
    local rc, err = run_nodata({ op = OP_CLOSE, conn = handle, vm = vm })
    if rc ~= QRPC_OK then
        return nil, err
    end
    return true
end
_M.close_handle = close_handle


-- Sends an event; returns the library's status and, on failure, the error.
function _M.event(handle, method, body, nh, hdrs, hlen, req_type, flags,
                  hash_key)
    return run_nodata({ op = OP_EVENT, conn = handle, method = method,
                        body = body, nh = nh, hdrs = hdrs, hlen = hlen,
                        req_type = req_type, flags = flags,
                        hash_key = hash_key, vm = vm })
end


-- Runs a qrpc_query op (PEERS, CONFIGURE, ...) now, with an opts record
-- block if given; returns the answer as a string.
function _M.query(op, handle, opts)
    local rc, out = run_now({ op = op, conn = handle, opts = opts, vm = vm })
    if rc ~= QRPC_OK then
        return nil, out
    end
    return out
end


-- Counters of a connection (handle 0: the whole runtime of this worker).
function _M.stats(handle)
    local s = ffi_new("qrpc_stats_t")
    local rc = lib.qrpc_stats(handle, s)
    if rc ~= QRPC_OK then
        return nil, status_err(rc)
    end
    return {
        inflight = tonumber(s.inflight),
        calls = tonumber(s.calls),
        events = tonumber(s.events),
        dropped = tonumber(s.dropped),
        reconnects = tonumber(s.reconnects),
        queued = tonumber(s.queued),
    }
end


return _M
