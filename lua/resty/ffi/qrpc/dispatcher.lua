-- resty.ffi.qrpc.dispatcher: the built-in host's dispatcher. One per Lua
-- VM of a worker, in a timer: a reader light thread blocks on the VM's
-- wake-up socket (Go writes a byte when its completion queue goes from
-- empty to non-empty) and drains on each byte; while calls are in flight
-- the dispatcher itself wakes every POLL_S to notice the worker exiting,
-- to drain anyway and to sweep abandoned calls. With none in flight it
-- sleeps until something happens: a call (ensure), the reader ending, or
-- the worker exiting (a watch timer, which nginx runs early on exit).
-- resty.ffi.qrpc.host_builtin gives it the functions that drain and sweep
-- (hooks) and starts it (ensure).

local ffi = require "ffi"
local semaphore = require "ngx.semaphore"
local abi = require "resty.ffi.qrpc.abi"

local ffi_new = ffi.new
local ffi_string = ffi.string
local sema_new = semaphore.new

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local ngx_NOTICE = ngx.NOTICE
local ngx_INFO = ngx.INFO
local worker_exiting = ngx.worker.exiting
local timer_at = ngx.timer.at
local ngx_now = ngx.now
local ngx_sleep = ngx.sleep
local socket_tcp = ngx.socket.tcp
local thread_spawn = ngx.thread.spawn
local thread_kill = ngx.thread.kill

local tostring = tostring
local pcall = pcall
local pairs = pairs
local setmetatable = setmetatable
local math_max = math.max
local str_match = string.match

local QRPC_OK = abi.QRPC_OK
local char_arr_t = abi.char_arr_t
local new_errbuf = abi.new_errbuf
local ERRBUF_LEN = abi.ERRBUF_LEN
local submit_err = abi.submit_err

local PATHBUF_LEN = 256
-- While calls are in flight the dispatcher wakes this often to notice a
-- worker exit (nginx -s reload/quit), lost wake-ups and abandoned calls.
local POLL_S = 0.5
-- With none in flight it waits this long for a kick (a new call, the
-- reader ending, the exit watch): an idle worker's nginx thread then
-- wakes twice a minute for it. The wait bounds what a kick that never
-- comes costs: the exit watch is a timer, and at exit nginx cannot run it
-- while lua_max_running_timers are all taken (the worker's exit then
-- waits this long).
local IDLE_S = 30
-- The exit watch: a timer of this delay, re-armed when it runs in time.
-- nginx runs pending timers at once, premature, when the worker exits;
-- the watch then kicks the dispatcher out of its idle wait.
local WATCH_S = 3600
local SWEEP_EVERY_S = 1
local STALE_S = 5
-- The reader blocks on the wake-up socket with the longest timeout ngx_lua
-- accepts: a read timeout logs an [error] line, so it must almost never fire.
local READ_TIMEOUT_MS = 2147483647

local _M = { SWEEP_EVERY_S = SWEEP_EVERY_S }

local lib
local vm = 0
local socket_dir = "/tmp"
local wake_path         -- a wake-up socket opened by init(), for the dispatcher
local wake_broken       -- init() could not open one: do not try again

-- The hooks of the module instances of this VM (see hold, add_hooks):
-- the dispatcher is the VM's (kept with resty.ffi.qrpc.host_builtin in
-- the registry) and serves every instance a re-require left; held
-- weakly, each by its instance's module table, so that it keeps none
-- alive.
local holds = setmetatable({}, { __mode = "k" })
local share_hooks = setmetatable({}, { __mode = "k" })
local exit_hooks = setmetatable({}, { __mode = "k" })

-- Calls of the lua-resty-ffi host in flight (see hold): they wait in
-- lua-resty-ffi, not here, but the dispatcher must outlive them too.
local function others()
    local n = 0
    for f in pairs(holds) do
        n = n + f()
    end
    return n
end

local disp_gen = 0      -- generation of the live dispatcher; 0: none
local disp_seq = 0
local disp_beat = 0
local disp_fails = 0
-- The live dispatcher's semaphore, and whether it waits on it with nothing
-- in flight (then its beat is not due: ensure kicks it instead).
local kick
local disp_idle = false
local watch_armed = false

local ensure_dispatcher

-- host_builtin's: drain (raises what a completion raised), safe_drain,
-- complete_failed, sweep(now), the count of its calls in flight, and
-- whether it has work for later sweeps (cancels a full queue refused).
local drain, safe_drain, complete_failed, sweep
local npending = function() return 0 end
local deferred = function() return false end
local exit_told = false

-- the worker is exiting: shared pools give up their leases
local function on_exiting()
    for f in pairs(exit_hooks) do
        f()
    end
end

function _M.hooks(h)
    drain, safe_drain, complete_failed = h.drain, h.safe_drain, h.failed
    sweep, npending = h.sweep, h.pending
    deferred = h.deferred or deferred
end

-- The VM could not be registered: no wake-up socket will open.
function _M.broken()
    wake_broken = true
end


local function wake_listen()
    local dir = socket_dir
    local pathbuf = ffi_new(char_arr_t, PATHBUF_LEN)
    local errbuf = new_errbuf()
    local rc = lib.qrpc_vm_wake_open(vm, dir, #dir, pathbuf, PATHBUF_LEN,
                                     errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, submit_err(rc, errbuf)
    end
    return ffi_string(pathbuf)
end



local function open_wake()
    local path = wake_path
    wake_path = nil
    if not path then
        local err
        path, err = wake_listen()
        if not path then
            return nil, "qrpc_vm_wake_open(" .. socket_dir .. "): " .. err
        end
    end
    local sock = socket_tcp()
    sock:settimeouts(2000, 2000, READ_TIMEOUT_MS)
    local ok, err = sock:connect("unix:" .. path)
    if not ok then
        return nil, "connect unix:" .. path .. ": " .. tostring(err)
    end
    return sock
end


-- Returns the socket's error; raises what a completion raised.
local function read_loop(sock)
    while true do
        local data, err = sock:receiveany(256)
        if not data then
            return err
        end
        drain()
    end
end


local function read_wake(sock, st)
    while true do
        -- outside the loop: see drain
        local ok, err = pcall(read_loop, sock)
        if ok then
            if not worker_exiting() then
                ngx_log(ngx_WARN, "qrpc: wake-up socket: ", err)
            end
            sock:close()
            st.ended = true
            st.kick:post(1)
            return
        end
        complete_failed(err)
        safe_drain()
    end
end


-- The exit watch (see WATCH_S): kicks the dispatcher when the worker
-- exits, re-arms itself otherwise.
local watch
watch = function(premature)
    watch_armed = false
    if premature or worker_exiting() then
        if kick then
            kick:post(1)
            -- nginx runs premature timers from its cycle, outside the
            -- event loop's handlers: the post is an event it processes
            -- only once epoll returns, and with the dispatcher idle the
            -- next timer is an hour away. A short sleep is a timer that
            -- makes it return.
            ngx_sleep(0.001)
        end
        return
    end
    watch_armed = timer_at(WATCH_S, watch) and true or false
end


-- The dispatcher: one per worker, in a timer. A reader light thread blocks
-- on the wake-up socket (draining on each byte). While calls are in flight
-- this thread wakes every POLL_S to notice the worker exiting, to drain
-- anyway (a lost wake-up costs at most POLL_S) and to sweep abandoned calls;
-- with none it waits for a kick (see IDLE_S), as long as the exit watch is
-- armed. It stops once the worker exits and no call waits: a light thread
-- that lingers keeps an old worker "shutting down" forever (Kong#6904).
local function supervise(gen)
    local st = { kick = sema_new(0), ended = false }
    kick = st.kick
    disp_idle = false
    local sock, reader
    local last_sweep = ngx_now()
    local last_exit_log = 0
    while gen == disp_gen do
        if not reader and not wake_broken then
            local err
            sock, err = open_wake()
            if sock then
                reader = thread_spawn(read_wake, sock, st)
                disp_fails = 0
            else
                disp_fails = disp_fails + 1
                if disp_fails <= 3 or disp_fails % 100 == 0 then
                    ngx_log(ngx_ERR, "qrpc: dispatcher: ", err)
                end
            end
        end
        -- completions queued before the socket was connected wake nobody
        safe_drain()
        disp_beat = ngx_now()

        if worker_exiting() then
            if not exit_told then
                exit_told = true
                local ok, err = pcall(on_exiting)
                if not ok then
                    ngx_log(ngx_ERR, "qrpc: dispatcher: on exit: ", err)
                end
            end
            local n = npending() + others()
            if n == 0 then
                break
            end
            local now = ngx_now()
            if now - last_exit_log >= 2 then
                last_exit_log = now
                ngx_log(ngx_NOTICE, "qrpc: worker exiting; waiting for ", n,
                        " call(s) in flight")
            end
        end
        local wait = reader and POLL_S or math_max(POLL_S, 0.1 * disp_fails)
        if reader and npending() + others() == 0 and not deferred()
           and not worker_exiting()
        then
            if not watch_armed then
                watch_armed = timer_at(WATCH_S, watch) and true or false
            end
            if watch_armed then
                wait = IDLE_S
                disp_idle = true
            end
        end
        st.kick:wait(wait)
        disp_idle = false
        if st.ended then
            st.ended = false
            reader, sock = nil, nil
        end
        safe_drain()
        local now = ngx_now()
        disp_beat = now
        if now - last_sweep >= SWEEP_EVERY_S then
            last_sweep = now
            sweep(now)
        end
    end
    if reader then
        thread_kill(reader)
        sock:close()
    end
    ngx_log(ngx_INFO, "qrpc: dispatcher stopped")
end


local function dispatcher(premature, gen)
    if premature and npending() + others() == 0 then
        if gen == disp_gen then
            disp_gen = 0
        end
        return
    end
    local ok, err = pcall(supervise, gen)
    if gen == disp_gen then
        disp_gen = 0
    end
    if not ok then
        ngx_log(ngx_ERR, "qrpc: dispatcher died: ", err)
    end
    if npending() + others() > 0 and not worker_exiting() then
        ensure_dispatcher()
    end
end


-- Starts the dispatcher unless a live one runs; true, or nil and the
-- error of ngx.timer.at (the worker is exiting, too many timers). now:
-- ngx.now(), when the caller has it (one FFI call less per call).
ensure_dispatcher = function(now)
    if disp_gen ~= 0 then
        if disp_idle then
            -- out of its idle wait: a call is in flight now (the kick
            -- resumes it in this turn of the event loop, after the caller
            -- has registered its call)
            disp_idle = false
            disp_beat = now or ngx_now()
            kick:post(1)
            return true
        end
        if (now or ngx_now()) - disp_beat < STALE_S then
            return true
        end
        ngx_log(ngx_WARN, "qrpc: dispatcher silent for ", STALE_S,
                " s; starting another")
    end
    local gen = disp_seq + 1
    local ok, err = timer_at(0, dispatcher, gen)
    if not ok then
        return nil, err
    end
    disp_seq = gen
    disp_gen = gen
    disp_beat = ngx_now()
    return true
end
_M.ensure = ensure_dispatcher


-- Coroutines waiting for a completion (of either host), and whether the
-- dispatcher runs.
function _M.waiting()
    return npending() + others(), disp_gen ~= 0
end


-- The lua-resty-ffi host's calls wait in lua-resty-ffi, which arms no
-- nginx timer: an exiting worker (nginx -s reload / quit) would not wait
-- for them and would cut their requests. f() counts them; the dispatcher
-- (whose waits are timers) keeps running while it is not 0.
function _M.hold(f)
    holds[f] = true
end


-- add_hooks(share, exit): a module instance's (resty.ffi.qrpc.share)
-- step of its shared pools, called with each QRPC_SHARE completion (it
-- ignores the pools it does not know), and its end of them when the
-- worker exits.
function _M.add_hooks(share, exit)
    share_hooks[share] = true
    exit_hooks[exit] = true
end


-- A shared pool asks for a step, or a step's exchange that went through
-- the queue is answered: handed to every instance's hook.
function _M.on_share(handle, code, id, data)
    for f in pairs(share_hooks) do
        f(handle, code, id, data)
    end
end


-- init(lib, vm, dir) opens the VM's first wake-up socket now, so that an
-- unusable socket_dir fails the call that loads the library at once,
-- rather than leaving every call to wait for the dispatcher's slow poll.
-- Returns true, or nil and "qrpc: socket_dir <dir>: <reason>" (the
-- library stays usable for the direct calls; the dispatcher then only
-- polls).
function _M.init(l, v, dir)
    lib, vm, socket_dir = l, v, dir
    local path, err = wake_listen()
    if not path then
        wake_broken = true
        return nil, "qrpc: socket_dir " .. dir .. ": "
                    .. (str_match(err, "^wake socket: (.*)$") or err)
    end
    wake_path = path
    return true
end


return _M
