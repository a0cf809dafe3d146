-- resty.ffi.qrpc.host_builtin: the built-in host, on stock ngx_lua. Commands go
-- in through qrpc_submit_async on the nginx thread (plain C: a queue that
-- Go's submitter takes from); results come back on a per-worker
-- completion queue, announced by a byte on a unix socket that one
-- background light thread (the dispatcher) reads, drains with qrpc_vm_poll
-- and turns into ngx.semaphore posts for the waiting calls. Events,
-- closes and queries, whose callers get their answer at once, go through
-- qrpc_query.
--
-- Each Lua VM of a worker (ngx_http_lua's, ngx_stream_lua's) registers
-- with qrpc_vm_open and gets its own completion queue, wake-up socket and
-- dispatcher: its commands carry its VM index (qrpc_cmd_t.vm), so that no
-- VM drains another's completions.
--
-- The lua-resty-ffi host uses parts of it too: the direct calls that never
-- wait (event, close, cancel, stats) and the dispatcher, through which Go's
-- log lines arrive with either host.

local ffi = require "ffi"

-- Kept in the VM's registry: a VM that clears package.loaded and requires
-- the modules again (hot reload) gets the host it runs already.
local debug_getregistry = debug.getregistry
local registry = debug_getregistry()
if registry["resty.ffi.qrpc.host_builtin"] then
    return registry["resty.ffi.qrpc.host_builtin"]
end

local semaphore = require "ngx.semaphore"
local abi = require "resty.ffi.qrpc.abi"
local direct = require "resty.ffi.qrpc.host_direct"
local disp = require "resty.ffi.qrpc.dispatcher"

local ffi_new = ffi.new
local ffi_string = ffi.string
local sema_new = semaphore.new

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local ngx_NOTICE = ngx.NOTICE
local ngx_now = ngx.now
local ngx_sleep = ngx.sleep

local tostring = tostring
local tonumber = tonumber
local pairs = pairs
local pcall = pcall
local unpack = unpack

local OP_CONNECT = abi.OP_CONNECT
local QRPC_OK = abi.QRPC_OK
local QRPC_PENDING = abi.QRPC_PENDING
local QRPC_LOG = abi.QRPC_LOG
local QRPC_SHARE = abi.QRPC_SHARE
local QRPC_BAD_RESPONSE = abi.QRPC_BAD_RESPONSE
local QRPC_ERR = abi.QRPC_ERR
local QRPC_ERR_TIMEOUT = abi.QRPC_ERR_TIMEOUT
local cmd_t = abi.cmd_t
local new_errbuf = abi.new_errbuf
local ERRBUF_LEN = abi.ERRBUF_LEN
local status_err = abi.status_err
local submit_err = abi.submit_err
local decode_result = abi.decode_result
local decode_bad_response = abi.decode_bad_response
local fill_cmd = abi.fill_cmd

-- How much longer than Go's deadline Lua waits before it gives up on its
-- own; Go enforces deadlines, this only guards against a lost completion.
local SAFETY_SLACK_S = 1
-- ngx.semaphore waits take an int of milliseconds: a longer wait (a
-- timeout near the 2^31-1 ms maximum, plus slack) would overflow it and
-- end at once.
local MAX_WAIT_S = 2147483
local BATCH = 64
local SWEEP_EVERY_S = disp.SWEEP_EVERY_S


local _M = {
    SAFETY_SLACK_S = SAFETY_SLACK_S,
    MAX_WAIT_S = MAX_WAIT_S,
    SWEEP_EVERY_S = SWEEP_EVERY_S,
}


local lib               -- the loaded library; nil until init()
local vm = 0            -- this Lua VM's index (qrpc_vm_open)
local comps             -- qrpc_completion_t[BATCH]
-- The result blocks of the batch being completed, released together with
-- qrpc_release_n: one take of the queues' lock per batch instead of one
-- per completion (the lock's cache line moves between the nginx thread's
-- CPU and Go's on every take).
local rels              -- void *[BATCH]
local nrel = 0

local pend = {}         -- call id -> waiter of a call in flight
local npend = 0
local pool = {}         -- idle waiters
local npool = 0
local last_id = 0
local orphan_connects = {}  -- call ids of CONNECTs whose result must be closed


-- Called once the library is loaded, before any other function here;
-- subsystem is ngx.config.subsystem ("http", "stream"): this VM's name.
-- Opens the first wake-up socket now, so that an unusable socket_dir fails
-- the call that loads the library at once, rather than leaving every call
-- to wait for the dispatcher's slow poll. Returns true, or nil and
-- "qrpc: socket_dir <dir>: <reason>" (the library stays usable for the
-- direct calls; the dispatcher then only polls), or nil, "qrpc: <subsystem>
-- Lua VM: <reason>", true when the VM could not register (no host can
-- serve it). Once per VM: an instance required again gets the first answer.
local function init(l, dir, subsystem)
    lib = l
    -- this VM's completion queue: every command names it
    local errbuf = new_errbuf()
    local idx = lib.qrpc_vm_open(subsystem, #subsystem, direct.vm_token(), errbuf, ERRBUF_LEN)
    if idx < 0 then
        disp.broken()
        -- fatal with either host: the VM has no queue of its own
        return nil, "qrpc: " .. subsystem .. " Lua VM: " .. submit_err(idx, errbuf), true
    end
    vm = idx
    direct.init(lib, vm)
    comps = ffi_new("qrpc_completion_t[?]", BATCH)
    rels = ffi_new("void *[?]", BATCH)
    return disp.init(lib, vm, dir)
end

local inited
function _M.init(l, dir, subsystem)
    inited = inited or { init(l, dir, subsystem) }
    return unpack(inited, 1, 3)
end

-- The direct calls (both hosts): resty.ffi.qrpc.host_direct.
local cancel = direct.cancel
local retry_cancels = direct.retry_cancels
local close_handle = direct.close_handle
_M.close_handle = close_handle
_M.event = direct.event
_M.query = direct.query
_M.stats = direct.stats
_M.late_cancels = direct.late_cancels


-------------------------------------------------------------------------
-- Completions
-------------------------------------------------------------------------

-- Go's log lines arrive as completions; they already start with "qrpc: ".
local function log_go(level, msg)
    if level < 1 or level > 8 then
        level = ngx_NOTICE
    end
    ngx_log(level, msg)
end


-- data: a completion's block, released with the rest of its batch (drain).
local function release_later(data)
    rels[nrel] = data
    nrel = nrel + 1
end


-- Hands a call its outcome (an inline waiter polls for it instead).
local function wake(w, status, val, info)
    w.status = status
    w.val = val
    w.info = info
    if not w.inline then
        w.sema:post(1)
    end
end


local function complete(c)
    local status = c.status
    local data = c.data
    local len = tonumber(c.len)
    if data ~= nil then
        -- Released after the batch (drain), so it can be read
        -- below; queued first, so that an error below leaks no block.
        release_later(data)
    end

    if status == QRPC_LOG then
        if data ~= nil then
            log_go(c.code, ffi_string(data, len))
        end
        return
    end
    if status == QRPC_SHARE then
        -- a shared pool asks for a step, or a step's exchange that went
        -- through the queue is answered (resty.ffi.qrpc.share)
        disp.on_share(c.handle, c.code, tonumber(c.call_id),
                      data ~= nil and ffi_string(data, len) or nil)
        return
    end

    local id = tonumber(c.call_id)
    local w = pend[id]
    if w == nil then
        -- Nobody waits any more (timed out in Lua, killed, cancelled).
        if orphan_connects[id] then
            orphan_connects[id] = nil
            if status == QRPC_OK then
                close_handle(c.handle)
            end
        end
        return
    end

    local op = w.op
    local val, info
    if status == QRPC_OK then
        if op == OP_CONNECT then
            val = c.handle
        else
            val = decode_result(data, len)
            if not val then
                status, val = QRPC_ERR, "qrpc: malformed result from the library"
            end
        end
    elseif status == QRPC_BAD_RESPONSE then
        val = decode_bad_response(data, len)
    else
        val, info = status_err(status, data ~= nil and ffi_string(data, len)
                                       or nil)
    end
    -- forgotten only now: a completion that raised above is still pending
    -- for complete_failed
    pend[id] = nil
    npend = npend - 1

    if op == OP_CONNECT then
        w.done(w.entry, status, val, info)
        return
    end
    wake(w, status, val, info)
end


-- Where drain is in the batch it polled: comps[pos .. npolled-1] are still
-- to complete. After an error, pos is one past the completion that raised.
-- Shared, like comps: drain is never re-entered (complete does not drain).
local pos, npolled = 0, 0


-- The completion that raised (a bug, or no memory): logged, and its call,
-- if still pending, ends with the error now rather than at its timeout.
local function complete_failed(err)
    err = tostring(err) -- an error object need not be a string
    if pos == 0 then
        ngx_log(ngx_ERR, "qrpc: completing calls failed: ", err)
        return
    end
    local id = tonumber(comps[pos - 1].call_id)
    ngx_log(ngx_ERR, "qrpc: completion of call ", id, " failed: ", err)
    local w = pend[id]
    if w == nil then
        return
    end
    pend[id] = nil
    npend = npend - 1
    local msg = "qrpc: completion failed: " .. err
    if w.op == OP_CONNECT then
        local ok, derr = pcall(w.done, w.entry, QRPC_ERR, msg)
        if not ok then
            ngx_log(ngx_ERR, "qrpc: completion of connect ", id, " failed: ",
                    tostring(derr))
        end
        return
    end
    wake(w, QRPC_ERR, msg)
end


-- The rest of drain's work once a poll returned n > 1 completions: the
-- loops that a batch of several needs. Apart from drain because a loop
-- that runs once per drain never closes into a trace: LuaJIT starts
-- recording at a loop that got hot and aborts when that loop is left
-- before it looped ("leaving loop in root trace"), again and again.
local function drain_batch(n)
    while n > 0 do
        pos, npolled = 0, n
        for i = 0, n - 1 do
            pos = i + 1
            complete(comps[i])
        end
        if nrel > 0 then
            local r = nrel
            nrel = 0
            lib.qrpc_release_n(rels, r)
        end
        if n < BATCH then
            break
        end
        n = lib.qrpc_vm_poll(vm, comps, BATCH)
    end
end


-- Raises what a completion raised; the caller's pcall reports it
-- (complete_failed) and drains again, which finishes the batch first. No
-- pcall in here: a hot trace returning into a pcall frame aborts (NYI:
-- return to lower frame), so the reader's pcall sits outside its loop.
--
-- The batch's blocks are released here, not in a function of their own: a
-- side trace starting in such a function returns into drain's frame, which
-- LuaJIT does not compile either (NYI: return to lower frame).
--
-- One call at a time, each poll returns one completion: that case runs no
-- loop (see drain_batch), so the call path compiles into traces.
local function drain()
    -- the rest of a batch cut short by an error
    while pos < npolled do
        local i = pos
        pos = i + 1
        complete(comps[i])
    end
    if nrel > 0 then
        local r = nrel
        nrel = 0
        lib.qrpc_release_n(rels, r)
    end
    local n = lib.qrpc_vm_poll(vm, comps, BATCH)
    if n ~= 1 then
        if n > 1 then
            return drain_batch(n)
        end
        return
    end
    -- a batch of one is not a full one (BATCH > 1): the queue is empty
    pos, npolled = 1, 1
    complete(comps[0])
    if nrel > 0 then
        local r = nrel
        nrel = 0
        lib.qrpc_release_n(rels, r)
    end
end


-- drain for the callers off the hot path: an error in one completion must
-- not lose the rest of its batch (their calls would wait for their
-- timeouts) nor stop the caller. Each round completes at least one more.
local function safe_drain()
    -- The poll runs outside the pcall: a drain that finds nothing, called
    -- through pcall often enough to get hot (the dispatcher after each
    -- kick), would start a trace that aborts returning into the pcall
    -- frame (NYI: return to lower frame).
    if pos >= npolled and nrel == 0 then
        local n = lib.qrpc_vm_poll(vm, comps, BATCH)
        if n <= 0 then
            return
        end
        pos, npolled = 0, n
    end
    for _ = 1, BATCH + 1 do
        local ok, err = pcall(drain)
        if ok then
            return
        end
        complete_failed(err)
    end
end
_M.drain = safe_drain


-------------------------------------------------------------------------
-- The dispatcher
-------------------------------------------------------------------------

-- A call whose waiter is gone (its light thread was killed, or the client
-- aborted the request with lua_check_client_abort on) is cancelled here, so
-- Go forgets it without waiting for its deadline. A waiting semaphore has a
-- negative count; nginx's cleanup of a killed waiter brings it back to 0.
-- Past its deadline (plus slack), any waiter is dropped.
local function sweep(now)
    retry_cancels()
    for id, w in pairs(pend) do
        if w.op ~= OP_CONNECT and w.status == nil
           and ((not w.inline and w.sema:count() >= 0)
                or now > w.deadline + SAFETY_SLACK_S)
        then
            pend[id] = nil
            npend = npend - 1
            w.id = nil
            cancel(w.handle, id)
        end
    end
end


-- The dispatcher (resty.ffi.qrpc.dispatcher) drains and sweeps this
-- host's calls.
disp.hooks({
    drain = drain, safe_drain = safe_drain, failed = complete_failed,
    sweep = sweep, pending = function() return npend end,
    deferred = function() return direct.late_cancels() > 0 end,
})
local ensure_dispatcher = disp.ensure
_M.ensure_dispatcher = ensure_dispatcher
_M.waiting = disp.waiting
_M.hold = disp.hold
_M.add_hooks = disp.add_hooks
_M.on_share = disp.on_share

-------------------------------------------------------------------------
-- Waiting for a call
-------------------------------------------------------------------------

local function get_waiter()
    local w
    if npool > 0 then
        w = pool[npool]
        pool[npool] = nil
        npool = npool - 1
    else
        -- cmd: the command of the call that holds the waiter
        w = { sema = sema_new(0), cmd = ffi_new(cmd_t) }
    end
    return w
end


-- A waiter goes back to the pool only with a semaphore that counts 0: when
-- a call's answer and the end of its wait are handled in one turn of the
-- event loop (a stalled loop), the wait's timer resumes the call first and
-- the dispatcher's post stays counted, which would end the next wait on
-- that semaphore at once with no answer. unsure: the wait did not end with
-- the post (a wait that took the post leaves 0), so the count is looked
-- at. Not on every call: sema:count, called once per call after the
-- resume, got hot on its own and its root trace aborted on returning
-- ("leaving loop in root trace"), in some runs.
local function put_waiter(w, unsure)
    if unsure and w.sema:count() ~= 0 then
        w.sema = sema_new(0)
    end
    w.id = nil
    w.status = nil
    w.val = nil
    w.info = nil
    w.handle = nil
    w.inline = nil
    npool = npool + 1
    pool[npool] = w
end


-- Without a dispatcher (a zero-delay timer refused while the worker exits),
-- the caller polls the completion queue itself.
local function wait_inline(w, id, secs)
    local deadline = ngx_now() + secs
    local pause = 0.001
    while true do
        safe_drain()
        if w.status ~= nil or w.id ~= id then
            return true
        end
        if ngx_now() >= deadline then
            return nil, "timeout"
        end
        ngx_sleep(pause)
        if pause < 0.05 then
            pause = pause * 2
        end
    end
end


local function next_call_id()
    last_id = last_id + 1
    return last_id
end


-- Queues a command nobody waits for: POOL_SHARE, whose answer comes as a
-- QRPC_SHARE completion. Returns its call id, or nil and the error.
function _M.post(op, handle, opts)
    local id = next_call_id()
    local rc = lib.qrpc_submit_async(fill_cmd(ffi_new(cmd_t), {
        op = op, conn = handle, opts = opts, id = id, vm = vm }))
    if rc ~= QRPC_PENDING then
        return nil, status_err(rc)
    end
    return id
end


-- Submits a call (UNARY or ECHO: the command table c of abi.fill_cmd)
-- and waits up to secs for its completion. Returns status, value (a
-- result table, or an error string).
function _M.call(c, secs)
    local id = next_call_id()
    local handle = c.conn
    c.id = id
    -- The waiter's own command: the waiter belongs to this call alone
    -- until put_waiter, so no other call can see the command.
    local w = get_waiter()
    local cmd = fill_cmd(w.cmd, c)
    cmd.vm = vm
    -- Queued in C without entering Go (qrpc_submit_async in qrpc.h): Go's
    -- refusals come back as the completion; this fails only when the host
    -- is closed or its queue full, and writes no message.
    local rc = lib.qrpc_submit_async(cmd)
    if rc ~= QRPC_PENDING then
        put_waiter(w)
        return rc, status_err(rc)
    end

    local now = ngx_now()
    local disp_ok = ensure_dispatcher(now)

    w.id = id
    w.op = c.op
    w.handle = handle
    w.deadline = now + secs
    pend[id] = w
    npend = npend + 1

    local ok, err
    if disp_ok then
        ok, err = w.sema:wait(secs < MAX_WAIT_S and secs or MAX_WAIT_S)
    else
        w.inline = true
        ok, err = wait_inline(w, id, secs)
    end

    if w.id ~= id then
        -- swept as abandoned while its own timeout was waking it up
        return QRPC_ERR_TIMEOUT, "timeout"
    end
    local status = w.status
    if status == nil then
        -- Go never answered in time (it enforces the deadline itself), or
        -- the wait failed: forget the call.
        if pend[id] == w then
            pend[id] = nil
            npend = npend - 1
        end
        cancel(handle, id)
        put_waiter(w, true)
        if err == "timeout" or ok then
            ngx_log(ngx_WARN, "qrpc: no completion for call ", id, " within ",
                    secs, " s; cancelled")
            return QRPC_ERR_TIMEOUT, "timeout"
        end
        return QRPC_ERR, "qrpc: wait: " .. tostring(err)
    end
    local val, info = w.val, w.info
    put_waiter(w, not ok)
    return status, val, info
end


-- Submits a CONNECT command for connection cache entry e (through the
-- C submit queue, like a call; a refusal by Go is its completion); its
-- completion calls done(e, status, handle | err). Returns the call id, or
-- nil, status, err when the queue refused it (closed or full). inline: no
-- dispatcher runs, the waiters must poll with drain().
function _M.connect(cmd, e, done)
    local id = next_call_id()
    cmd.call_id = id
    cmd.vm = vm
    local rc = lib.qrpc_submit_async(cmd)
    if rc ~= QRPC_PENDING then
        return nil, rc, status_err(rc), {}
    end
    local disp_ok = ensure_dispatcher()
    pend[id] = { op = OP_CONNECT, entry = e, id = id, done = done }
    npend = npend + 1
    return id, not disp_ok
end


-- A CONNECT whose waiters gave up: its late success is closed.
function _M.abandon_connect(id)
    if pend[id] then
        pend[id] = nil
        npend = npend - 1
        orphan_connects[id] = true
    end
end


registry["resty.ffi.qrpc.host_builtin"] = _M
return _M
