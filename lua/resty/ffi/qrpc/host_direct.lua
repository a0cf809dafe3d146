-- resty.ffi.qrpc.host_direct: the calls of the built-in host that get
-- their answer at once, on the nginx thread, and that both hosts use:
-- event and close (qrpc_query), queries (PEERS, CONFIGURE, ...), a
-- connection's counters (qrpc_stats), and cancels (through the submit
-- queue, behind the call they cancel).

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"

local ffi_new = ffi.new
local ffi_string = ffi.string

local tonumber = tonumber
local pairs = pairs
local next = next

local CMD_VERSION = abi.CMD_VERSION
local OP_EVENT = abi.OP_EVENT
local OP_CLOSE = abi.OP_CLOSE
local OP_CANCEL = abi.OP_CANCEL
local QRPC_OK = abi.QRPC_OK
local QRPC_ERR_FULL = abi.QRPC_ERR_FULL
local cmd_t = abi.cmd_t
local errbuf = abi.errbuf
local ERRBUF_LEN = abi.ERRBUF_LEN
local status_err = abi.status_err
local submit_err = abi.submit_err
local fill_cmd = abi.fill_cmd

local _M = {}

local lib               -- the loaded library; nil until init()

-- Reused: qrpc_submit_async and qrpc_query copy or read a command before
-- they return, never after, and nothing yields between filling one and
-- that call.
local ecmd = ffi_new(cmd_t)
local xcmd = ffi_new(cmd_t)
local qcmd = ffi_new(cmd_t)
local stats_buf = ffi_new("qrpc_stats_t")


-- init(lib, vm): the library, and this Lua VM's index (qrpc_vm_open).
function _M.init(l, vm)
    lib = l
    ecmd.vm = vm
    xcmd.vm = vm
    qcmd.vm = vm
end


-- Through the C submit queue, like the UNARY it cancels: queued after it,
-- it cannot overtake it.
-- A cancel the queue refuses as full is kept and sent again by the
-- dispatcher's next sweep: dropped, Go would hold the call (and its
-- server's in-flight slot) until its deadline. late_cancels[id] = handle.
local late_cancels = {}

local function cancel(handle, id)
    xcmd.version = CMD_VERSION
    xcmd.op = OP_CANCEL
    xcmd.conn = handle or 0
    xcmd.call_id = id
    local rc = lib.qrpc_submit_async(xcmd)
    if rc == QRPC_ERR_FULL then
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
        if cancel(handle, id) == QRPC_ERR_FULL then
            return
        end
    end
end
_M.cancel = cancel
_M.retry_cancels = retry_cancels
_M.late_cancels = function()
    local n = 0
    for _ in pairs(late_cancels) do
        n = n + 1
    end
    return n
end


-- qrpc_query's answer.
local qout = ffi_new("char *[1]")
local qlen = ffi_new("size_t[1]")


-- Runs cmd with qrpc_query when its answer is no data (EVENT, CLOSE):
-- returns the status and, on failure, the error.
local function run_now(cmd)
    local rc = lib.qrpc_query(cmd, qout, qlen, errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return rc, submit_err(rc)
    end
    local p = qout[0]
    if p ~= nil then
        lib.qrpc_release(p)
    end
    return rc
end


local function close_handle(handle)
    xcmd.version = CMD_VERSION
    xcmd.op = OP_CLOSE
    xcmd.conn = handle
    xcmd.call_id = 0
    local rc, err = run_now(xcmd)
    if rc ~= QRPC_OK then
        return nil, err
    end
    return true
end
_M.close_handle = close_handle


-- Sends an event; returns the library's status and, on failure, the error.
function _M.event(handle, method, body, nh, hdrs, hlen, req_type, flags,
                  hash_key)
    fill_cmd(ecmd, OP_EVENT, handle, 0, method, body, nh, hdrs, hlen, 0,
             req_type, nil, flags, hash_key)
    return run_now(ecmd)
end


-- Runs a qrpc_query op (PEERS, CONFIGURE, ...) now, with opts lines if
-- given; returns the answer as a string.
function _M.query(op, handle, opts)
    fill_cmd(qcmd, op, handle, 0, "", "", 0, nil, 0, 0)
    -- fill_cmd clears opts (the command is reused): the query's go in after
    qcmd.opts = opts
    qcmd.opts_len = opts and #opts or 0
    local rc = lib.qrpc_query(qcmd, qout, qlen, errbuf, ERRBUF_LEN)
    qcmd.opts = nil
    qcmd.opts_len = 0
    if rc ~= QRPC_OK then
        return nil, submit_err(rc)
    end
    local p = qout[0]
    if p == nil then
        return ""
    end
    local out = ffi_string(p, qlen[0])
    lib.qrpc_release(p)
    return out
end


-- Counters of a connection (handle 0: the whole runtime of this worker).
function _M.stats(handle)
    local rc = lib.qrpc_stats(handle, stats_buf)
    if rc ~= QRPC_OK then
        return nil, status_err(rc)
    end
    local s = stats_buf
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
