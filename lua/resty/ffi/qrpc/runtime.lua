-- resty.ffi.qrpc.runtime: this worker's runtime: the configuration read
-- when the library loads, loading it (never in the master: a Go runtime
-- does not survive fork()), and the functions of the module that are not
-- about one connection: configure, stats, metrics, debug_profile,
-- init_worker, and the testing module's echo. resty.ffi.qrpc re-exports
-- them.

local abi = require "resty.ffi.qrpc.abi"
local args = require "resty.ffi.qrpc.args"
local loader = require "resty.ffi.qrpc.loader"
local builtin = require "resty.ffi.qrpc.host_builtin"
local resty_ffi = require "resty.ffi.qrpc.resty_ffi"
local cache = require "resty.ffi.qrpc.cache"
local metrics = require "resty.ffi.qrpc.metrics"
local pool = require "resty.ffi.qrpc.pool"
local share = require "resty.ffi.qrpc.share"
local limits = require "resty.ffi.qrpc.limits"
local proto = require "resty.ffi.qrpc.proto"
local wire = require "resty.ffi.qrpc.wire"
local new, put, decode, K = wire.new, wire.put, wire.decode, wire.keys
local ffi = require "ffi"

local ffi_new = ffi.new

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local get_phase = ngx.get_phase
local ngx_sleep = ngx.sleep

local type = type
local pairs = pairs
local math_floor = math.floor
local str_sub = string.sub

local OP_ECHO = abi.OP_ECHO
local OP_PROFILE = abi.OP_PROFILE
local QRPC_OK = abi.QRPC_OK
local cmd_t = abi.cmd_t
local bad = abi.bad
local fill_cmd = abi.fill_cmd
local plain = args.plain
local check_count = args.check_count
local ERR_INIT = loader.ERR_INIT
local DEFAULT_TIMEOUT_MS = cache.DEFAULT_TIMEOUT_MS
local SAFETY_SLACK_S = builtin.SAFETY_SLACK_S

local _M = {}

-- The nginx subsystem of this Lua VM: "http" (ngx_http_lua) or "stream"
-- (ngx_stream_lua). A worker runs one Lua VM per subsystem, and each VM
-- has its own connections, completion queue and dispatcher.
local subsystem = ngx.config and ngx.config.subsystem or "http"
local in_stream = subsystem == "stream"

-- What the facade reads on every call: S.loaded, S.use_builtin (the
-- host is the built-in one), S.max_connections.
local S = { loaded = false, use_builtin = false }
_M.S = S

-- Phases in which a light thread may yield (http's and stream's names:
-- ngx_stream_lua yields in preread, content and timers).
_M.yieldable = {
    rewrite = true, server_rewrite = true, access = true, content = true,
    timer = true, ssl_cert = true, ssl_client_hello = true,
    ssl_session_fetch = true, preread = true,
}
local yieldable = _M.yieldable

-- The phase as error messages name it: stream's are marked, since http
-- has phases of the same names.
local function phase_name(phase)
    if in_stream then
        return "stream " .. phase
    end
    return phase
end
_M.phase_name = phase_name

-- Where a call that yields can be made, for error messages.
_M.YIELD_WHERE = in_stream and "preread, content or a timer"
                 or "rewrite, access, content or a timer"


-- Configuration (read at load time) and the loaded state of this worker.
local cfg_host, cfg_lib, cfg_socket_dir = nil, nil, "/tmp"
-- QUIC connections a worker may hold (every pool's servers × conns);
-- beyond it connect closes the least recently used idle pools.
S.max_connections = 256
-- configure{ metrics }: false = pools dialled from then on are not
-- recorded (Go gives them a no-op observer); applied when the library
-- loads, and at once when it is loaded.
local metrics_on = true
local loaded            -- true once the library is loaded
local load_err          -- loaded, but the built-in host cannot run (socket_dir)
local host              -- "builtin" or "resty_ffi", once loaded
local lib_where         -- where the library was found


-- configure{ gomaxprocs }: held here until the library loads, then sent
-- to Go (bridge.Configure); nil leaves the library's default.
local gomaxprocs

-- apply_settings sends the Go-side settings of configure to the library:
-- whether to record the pools it dials next, and gomaxprocs when given.
local function apply_settings()
    local b = put(new(), K.METRICS, metrics_on and 1 or 0)
    if gomaxprocs then
        put(b, K.GOMAXPROCS, gomaxprocs)
    end
    local _, err = builtin.query(abi.OP_CONFIGURE, 0, b:tostring())
    if err then
        return nil, "qrpc: configure: " .. err
    end
    return true
end


local function ensure_loaded()
    -- (S.loaded: the facade's fast check)
    if loaded then
        if load_err then
            return nil, load_err
        end
        return true
    end
    local f = builtin.in_force
    if f then
        -- an instance a re-require made: what the VM loaded with
        cfg_host, cfg_lib, cfg_socket_dir = f.host, f.lib, f.socket_dir
    end
    local st, err = loader.load(cfg_host, cfg_lib, subsystem)
    if not st then
        return nil, err
    end
    local wake_ok, wake_err, fatal = builtin.init(st.lib, cfg_socket_dir, subsystem)
    proto.attach(st.lib)
    if st.rt then
        resty_ffi.init(st.rt)
    end
    loaded, host, lib_where = true, st.host, st.where
    -- what is in force in this VM, for a module instance a re-require
    -- makes later (the host is the VM's: resty.ffi.qrpc.host_builtin)
    builtin.in_force = f or { host = host, where = lib_where, lib = cfg_lib,
                              socket_dir = cfg_socket_dir }
    metrics.init(st.lib, builtin)
    S.use_builtin = host == "builtin"
    S.loaded = true
    local use_builtin = S.use_builtin
    if gomaxprocs or not metrics_on then
        -- before any connection can be dialled
        local ok, serr = apply_settings()
        if not ok then
            ngx_log(ngx_ERR, serr)
        end
    end
    if not wake_ok then
        -- Logged once: every later call returns the same error at once.
        -- The lua-resty-ffi host only loses its prompt log lines (the
        -- dispatcher still polls for them).
        ngx_log(ngx_ERR, wake_err)
        if use_builtin or fatal then
            load_err = wake_err
            return nil, wake_err
        end
    end
    if not use_builtin then
        -- Go's log lines come through the completion queue with either host.
        builtin.ensure_dispatcher()
    end
    return true
end
proto.init(ensure_loaded)
_M.ensure_loaded = ensure_loaded


-- qrpc.stats(): the counters of this worker's whole runtime, and the
-- state of this VM.
function _M.stats()
    local s
    if loaded then
        local err
        s, err = builtin.stats(0)
        if not s then
            return nil, err
        end
    else
        s = { inflight = 0, calls = 0, events = 0, dropped = 0,
              reconnects = 0, queued = 0 }
    end
    s.loaded = loaded == true
    s.host = host
    s.subsystem = subsystem
    s.lib = lib_where
    s.waiting, s.dispatcher = builtin.waiting()
    s.connections = 0
    if loaded then
        -- real QUIC connections, every pool's servers counted
        s.connections = pool.parse_connections(
                            builtin.query(abi.OP_PEERS, 0))
    end
    s.pools = cache.count()
    if loaded then
        -- the GOMAXPROCS of this worker's Go runtime
        local ks, vs, n = decode(builtin.query(abi.OP_CONFIGURE, 0) or "")
        for i = 1, ks and n or 0 do
            if ks[i] == K.GOMAXPROCS then
                s.gomaxprocs = vs[i]
            elseif ks[i] == K.SYSMON then
                -- "lazy" or "go": see loader.lua's set_godebug
                s.sysmon = vs[i]
            end
        end
    end
    return s
end


-- configure's options (resty.ffi.qrpc.schema)
local configure_opts = args.configure_opts

-- qrpc.configure{ host = "builtin" | "resty_ffi", lib = path, socket_dir = dir }
-- Omitted fields take their defaults: host chosen at load (lua-resty-ffi
-- when ngx.load_ffi exists and loads the library, else built-in); lib
-- searched (see resty.ffi.qrpc.loader); socket_dir "/tmp". Usable in any
-- phase, including init_by_lua; it takes effect when the library loads, so
-- after that it only accepts the settings already in force.
function _M.configure(opts)
    if type(opts) ~= "table" then
        return bad(1, "opts must be a table (got " .. type(opts) .. ")")
    end
    local err
    opts, err = plain(opts, configure_opts, 1, "opts")
    if not opts then
        return nil, err
    end
    for k in pairs(opts) do
        if type(k) ~= "string" then
            return bad(1, "option names must be strings (got " .. type(k) .. ")")
        end
        if not configure_opts[k] then
            return bad(1, "unknown option '" .. k .. "'")
        end
    end
    -- metrics_dict, pools_dict, max_connections, gomaxprocs and metrics may
    -- change at any time, alone or with the library's settings.
    local md = opts.metrics_dict
    if md ~= nil then
        if type(md) ~= "string" or md == "" then
            return bad(1, "metrics_dict must be the name of a lua_shared_dict")
        end
        local ok
        ok, err = metrics.set_dict(md)
        if not ok then
            return bad(1, err)
        end
    end
    local pd = opts.pools_dict
    if pd ~= nil then
        local ok
        ok, err = share.check(pd, 1, "pools_dict")
        if not ok then
            return nil, err
        end
        share.set_default(pd)
    end
    local mc = opts.max_connections
    if mc ~= nil then
        if type(mc) ~= "number" or mc < 1 or mc > 65536
           or math_floor(mc) ~= mc
        then
            return bad(1, "max_connections must be an integer 1..65536")
        end
        -- it applies to the next connect that dials
        S.max_connections = mc
    end
    local gp = opts.gomaxprocs
    if gp ~= nil then
        if type(gp) ~= "number" or gp < 1 or gp > limits.GOMAXPROCS
           or math_floor(gp) ~= gp
        then
            return bad(1, "gomaxprocs must be an integer 1.."
                          .. limits.GOMAXPROCS)
        end
    end
    local me = opts.metrics
    if me ~= nil and type(me) ~= "boolean" then
        return bad(1, "metrics must be true or false (got " .. type(me) .. ")")
    end
    if gp ~= nil or me ~= nil then
        gomaxprocs = gp or gomaxprocs
        -- metrics applies to the connections dialled from now on
        if me ~= nil then
            metrics_on = me
        end
        if loaded then
            local ok
            ok, err = apply_settings()
            if not ok then
                return nil, err
            end
        end
    end
    if md ~= nil or mc ~= nil or gp ~= nil or me ~= nil or pd ~= nil then
        if opts.host == nil and opts.lib == nil and opts.socket_dir == nil then
            return true
        end
    end
    local h, l, d = opts.host, opts.lib, opts.socket_dir
    if h ~= nil and h ~= "builtin" and h ~= "resty_ffi" then
        return bad(1, "host must be \"builtin\" or \"resty_ffi\"")
    end
    if h == "resty_ffi" and in_stream then
        -- lua-resty-ffi patches ngx_http_lua only
        return nil, "qrpc: host resty_ffi is not available in the stream "
                    .. "subsystem (lua-resty-ffi serves ngx_http_lua only); "
                    .. "stream uses the built-in host"
    end
    if l ~= nil and (type(l) ~= "string" or l == "") then
        return bad(1, "lib must be a path")
    end
    if d ~= nil and (type(d) ~= "string" or d == "") then
        return bad(1, "socket_dir must be a directory path")
    end
    d = d or "/tmp"
    -- loaded in this VM, maybe by an instance of these modules that a
    -- re-require (package.loaded cleared) left behind
    local f = builtin.in_force
    if f then
        if (h and h ~= f.host) or (l and l ~= f.where) or d ~= f.socket_dir
        then
            return nil, "qrpc: already loaded in this worker (" .. f.where
                        .. ", host " .. f.host .. "); configure before the "
                        .. "first call"
        end
        return true
    end
    cfg_host, cfg_lib, cfg_socket_dir = h, l, d
    return true
end


-- worker_loaded() -> true | nil, err: the library loaded in this worker
-- (never in the master: Go does not survive nginx's fork).
local function worker_loaded()
    if get_phase() == "init" then
        return nil, ERR_INIT
    end
    return ensure_loaded()
end


-- qrpc.metrics() -> text | nil, err: the Prometheus text format: the sum
-- over all workers with configure{ metrics_dict }, else this worker's.
function _M.metrics()
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    return metrics.text()
end


-- Profiles qrpc.debug_profile answers at once; "cpu" takes seconds.
local instant_profiles = {
    heap = true, allocs = true, goroutine = true, threadcreate = true,
}
local MAX_PROFILE_S = limits.PROFILE_SECONDS


-- qrpc.debug_profile(kind [, seconds]) -> bytes | nil, err: a pprof profile
-- (gzipped protobuf, for go tool pprof) of this worker's Go runtime. "cpu"
-- profiles for seconds (default 10), sleeping meanwhile; the others answer
-- at once. Opt-in by design: nothing is exposed unless a location calls it.
function _M.debug_profile(kind, seconds)
    if type(kind) ~= "string" then
        return bad(1, "kind must be a string (got " .. type(kind) .. ")")
    end
    if kind ~= "cpu" and not instant_profiles[kind] then
        return bad(1, "kind must be cpu, heap, allocs, goroutine or"
                      .. " threadcreate (got '" .. str_sub(kind, 1, 64) .. "')")
    end
    if kind ~= "cpu" and seconds ~= nil then
        return bad(2, "seconds is only for kind cpu")
    end
    if kind == "cpu" then
        if seconds == nil then
            seconds = 10
        end
        local _, err = check_count(seconds, 2, "seconds", 1, MAX_PROFILE_S)
        if err then
            return nil, err
        end
        local phase = get_phase()
        if not yieldable[phase] then
            return nil, "qrpc: a cpu profile cannot be taken in the "
                        .. phase_name(phase) .. " phase (it sleeps)"
        end
    end
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    if kind ~= "cpu" then
        local out, qerr = builtin.query(OP_PROFILE, 0,
                                        put(new(), K.PROFILE_KIND, kind):tostring())
        if not out then
            return nil, "qrpc: " .. qerr
        end
        return out
    end
    local start = put(put(new(), K.PROFILE_KIND, "cpu"), K.PROFILE_SECONDS,
                      seconds)
    local _, qerr = builtin.query(OP_PROFILE, 0, start:tostring())
    if qerr then
        return nil, "qrpc: " .. qerr
    end
    -- If this light thread is killed while it sleeps, Go stops the
    -- profile by itself 5 s after its seconds.
    ngx_sleep(seconds)
    local out
    out, qerr = builtin.query(OP_PROFILE, 0,
                              put(new(), K.PROFILE_KIND, "cpu-stop"):tostring())
    if not out then
        return nil, "qrpc: " .. qerr
    end
    return out
end


-- qrpc.init_worker() -> true | nil, err. Optional, from init_worker_by_lua:
-- loads the library and starts the dispatcher now rather than at the first
-- call, so that a missing library shows at start-up.
function _M.init_worker()
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    return builtin.ensure_dispatcher()
end


local echo_cmd = { op = OP_ECHO, timeout = DEFAULT_TIMEOUT_MS }

-- echo(body) -> body | nil, err: resty.ffi.qrpc.testing's echo (see
-- there), a round trip through the library with no network.
local function echo(body)
    if type(body) ~= "string" then
        return bad(1, "body must be a string")
    end
    local phase = get_phase()
    if phase == "init" then
        return nil, ERR_INIT
    end
    if not yieldable[phase] then
        return nil, "qrpc: echo cannot be used in the " .. phase_name(phase)
                    .. " phase"
    end
    local ok, err = ensure_loaded()
    if not ok then
        return nil, err
    end
    local status, val
    if S.use_builtin then
        -- one command table for every echo, as conn:unary has: the host
        -- copies the command before the call yields, so that the IPC
        -- benchmark times the hand-off, not a table per call
        local c = echo_cmd
        c.body = body
        status, val = builtin.call(c, DEFAULT_TIMEOUT_MS / 1000 + SAFETY_SLACK_S)
        c.body = nil
    else
        local c = { op = OP_ECHO, body = body, timeout = DEFAULT_TIMEOUT_MS }
        local cmd = fill_cmd(ffi_new(cmd_t), c)
        status, val = resty_ffi.decode(resty_ffi.call(cmd, c,
                                        DEFAULT_TIMEOUT_MS / 1000))
    end
    if status == QRPC_OK then
        return val.body
    end
    return nil, val
end
_M.echo = echo
require("resty.ffi.qrpc.testing").echo = echo


return _M
