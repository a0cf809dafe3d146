-- resty.ffi.qrpc: a qrpc (RPC over QUIC) client for OpenResty / nginx Lua.
--
-- The protocol runs in Go, in libffi_qrpc.so, inside the nginx worker. This
-- module hands work to it through the C ABI in ffi/qrpc.h, with one of two
-- hosts:
--   "builtin"   stock ngx_lua only: qrpc_submit, a per-worker completion
--               queue, a unix-socket wake-up read by one background light
--               thread (the dispatcher), one ngx.semaphore per waiting call;
--   "resty_ffi" lua-resty-ffi's ngx.load_ffi runtime (a rebuilt nginx):
--               connect, unary and _echo go through its task queue; event,
--               close and stats still call qrpc_submit/qrpc_stats directly
--               (they never wait), and Go's log lines still come through
--               the dispatcher.
--
--   local qrpc = require "resty.ffi.qrpc"
--   local conn, err = qrpc.connect("127.0.0.1:8081", { ca = pem, timeout = 3000 })
--   local res, err = conn:unary("greet", body, { headers = { ["x-id"] = "7" } })
--   -- res.code (number), res.body (string), res.headers ({ name = value })
--   local ok, err = conn:event("notify", body)
--
-- API
--   qrpc.configure{ host = "builtin" | "resty_ffi", lib = path, socket_dir = dir }
--       Before the first call (any phase, init_by_lua included). Omitted
--       fields take their defaults: host: "resty_ffi" when ngx.load_ffi
--       exists and loads the library, else "builtin"; lib: searched (the
--       Lua root of this file and its parent, PREFIX/lib for a
--       PREFIX/share/lua/5.1 install, package.cpath, /usr/local/lib,
--       /usr/local/openresty/lualib, then the dynamic linker's path);
--       socket_dir: "/tmp" (where the worker creates its wake-up socket).
--   qrpc.init_worker()            optional, in init_worker_by_lua: load now
--   qrpc.connect(addr, opts?)     -> conn; yields while dialling. The same
--       addr + opts in one worker return the same connection (concurrent
--       callers share one dial); a ready one is returned in any phase,
--       which is how log_by_lua and filters get one. opts:
--         server_name  SNI and verified name (default: host part of addr)
--         ca           PEM roots replacing the system's
--         cert, key    PEM client certificate for mTLS (both or neither)
--         pins         { sha256-of-SPKI, ... } as 64 hex digits or base64
--                      ("sha256//" prefix allowed), checked after the chain
--         insecure     true to skip verification (default false)
--         conns        QUIC connections (default 1)
--         streams      streams per connection (default 32)
--         timeout      ms: dial timeout and default call timeout (5000)
--         idle_timeout ms (Go's default 30000)
--         max_frame_size bytes (default 16 MiB; larger bodies are refused)
--   conn:unary(method, body?, opts?) -> res; yields (rewrite, access,
--       content, timer, ssl_* phases). opts: headers ({ name = value },
--       numbers allowed; duplicate names in a response: the last wins),
--       timeout (ms, 0 = the connection's). Go enforces the deadline; Lua
--       waits 1 s longer before giving up on its own.
--   conn:event(method, body?, opts?) -> true; never yields, any worker
--       phase. opts: headers.
--   conn:close() -> true (also on a closed conn); conn:stats() -> { inflight,
--       calls, events, dropped, reconnects, queued }; qrpc.stats() -> the
--       worker's totals plus loaded, host, lib, waiting, dispatcher,
--       connections.
--
-- Error rule. Nothing here throws because of what a caller passed in: every
-- function returns nil plus an error string. Misuse gives
-- "bad argument #N: <what>", where N counts arguments as in a plain call with
-- the connection as #1: conn:unary(method, body, opts) is unary(conn #1,
-- method #2, body #3, opts #4); qrpc.connect(addr #1, opts #2). Failures at
-- run time give short, stable strings:
--   "timeout"                      the call's deadline passed
--   "closed"                       the connection (or the runtime) is closed
--   "queue full"                   event refused, counted as a drop
--   "connect: <reason>"            dialling or the TLS handshake failed
--   "unavailable: <reason>"        connection lost, re-dialling in background
--   "connection lost: <reason>"    the connection died with the call in flight
--   "too large: <what>"            the request does not fit in one frame
--   "qrpc: <what>"                 anything else (library not found, phase, ...)
-- A response with a non-zero code is an answer, not an error.
--
-- A call whose light thread is killed, or whose request the client aborts
-- (with lua_check_client_abort on), is cancelled in Go within about a
-- second; otherwise the call's deadline frees it.
--
-- The library is never loaded in the nginx master: a Go runtime does not
-- survive fork(). Requiring this module in init_by_lua loads nothing; it is
-- loaded on first use in a worker. http subsystem only, one Lua VM per
-- worker (the wake-up socket and the completion queue are per process).

local ffi = require "ffi"
local base = require "resty.core.base"
local semaphore = require "ngx.semaphore"

local ffi_new = ffi.new
local ffi_string = ffi.string
local ffi_cast = ffi.cast
local ffi_copy = ffi.copy
local ffi_sizeof = ffi.sizeof
local ffi_load = ffi.load
local ffi_typeof = ffi.typeof
local new_tab = base.new_tab
local sema_new = semaphore.new

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local ngx_NOTICE = ngx.NOTICE
local ngx_INFO = ngx.INFO
local get_phase = ngx.get_phase
local worker_exiting = ngx.worker.exiting
local timer_at = ngx.timer.at
local ngx_now = ngx.now
local ngx_sleep = ngx.sleep
local socket_tcp = ngx.socket.tcp
local thread_spawn = ngx.thread.spawn
local thread_kill = ngx.thread.kill
local decode_base64 = ngx.decode_base64

local type = type
local tostring = tostring
local tonumber = tonumber
local pairs = pairs
local ipairs = ipairs
local pcall = pcall
local rawget = rawget
local setmetatable = setmetatable
local getmetatable = getmetatable
local io_open = io.open
local str_byte = string.byte
local str_sub = string.sub
local str_match = string.match
local str_gmatch = string.gmatch
local str_gsub = string.gsub
local str_find = string.find
local str_char = string.char
local math_floor = math.floor
local math_ceil = math.ceil
local math_max = math.max
local tab_concat = table.concat
local tab_remove = table.remove
local unpack = unpack
local debug_getinfo = debug.getinfo
local package_cpath = package.cpath


-- Keep in sync with ffi/qrpc.h (nginx/abi_test.go compares them).
if not pcall(ffi_typeof, "qrpc_cmd_t") then
ffi.cdef[[
typedef struct {
    uint32_t    version;
    uint32_t    op;
    uint64_t    conn;
    uint64_t    call_id;
    int32_t     timeout_ms;
    uint32_t    nhdrs;
    const char *method;  size_t method_len;
    const char *body;    size_t body_len;
    const char *hdrs;    size_t hdrs_len;
    const char *addr;        size_t addr_len;
    const char *server_name; size_t server_name_len;
    const char *ca;          size_t ca_len;
    const char *cert;        size_t cert_len;
    const char *key;         size_t key_len;
    const char *pins;        size_t pins_len;
    int32_t     insecure;
    int32_t     conns;
    int32_t     streams;
    int32_t     idle_timeout_ms;
    int32_t     max_frame_size;
    int32_t     retries;
    const char *hash_key;    size_t hash_key_len;
    const char *req_type;    size_t req_type_len;
    const char *resp_type;   size_t resp_type_len;
    uint32_t    flags;
    uint32_t    reserved2;
    const char *opts;        size_t opts_len;
} qrpc_cmd_t;

typedef struct {
    uint64_t call_id;
    uint64_t handle;
    int32_t  status;
    uint32_t code;
    char    *data;
    size_t   len;
} qrpc_completion_t;

typedef struct {
    uint64_t inflight;
    uint64_t calls;
    uint64_t events;
    uint64_t dropped;
    uint64_t reconnects;
    uint64_t queued;
} qrpc_stats_t;

int qrpc_init(char *err, size_t err_len);
int qrpc_wake_open(const char *dir, size_t dir_len, char *path, size_t path_len,
                   char *err, size_t err_len);
int qrpc_submit(const qrpc_cmd_t *cmd, char *err, size_t err_len);
int qrpc_stats(uint64_t conn, qrpc_stats_t *out);
int qrpc_query(const qrpc_cmd_t *cmd, char **out, size_t *out_len, char *err, size_t err_len);
int qrpc_drain(qrpc_completion_t *out, int max);
void qrpc_free(void *p);
void qrpc_shutdown(void);
]]
end

-- Used to keep nginx's process signals away from Go's threads (see
-- load_library). pcall: another module may have declared them already.
pcall(ffi.cdef, [[
int sigemptyset(void *set);
int sigaddset(void *set, int signum);
int pthread_sigmask(int how, const void *set, void *oldset);
]])

local CMD_VERSION = 2

local OP_CONNECT = 1
local OP_UNARY = 2
local OP_EVENT = 3
local OP_CLOSE = 4
local OP_CANCEL = 5
local OP_ECHO = 6

local QRPC_OK = 0
local QRPC_PENDING = 1
local QRPC_LOG = 2
local QRPC_ERR = -1
local QRPC_ERR_TIMEOUT = -2
local QRPC_ERR_CLOSED = -3
local QRPC_ERR_FULL = -4

local status_names = {
    [-1] = "qrpc: error",
    [-2] = "timeout",
    [-3] = "closed",
    [-4] = "queue full",
    [-5] = "qrpc: malformed command",
    [-6] = "connect: failed",
    [-7] = "unavailable",
    [-8] = "too large",
    [-9] = "connection lost",
}

local LIBNAME = "libffi_qrpc.so"
local ERR_INIT = "qrpc: not available in the init phase (the Go runtime "
                 .. "must load in workers: call it from a worker phase)"
local DEFAULT_TIMEOUT_MS = 5000       -- dial timeout and call timeout
local DEFAULT_MAX_FRAME = 16 * 1024 * 1024
local MAX_MS = 2147483647
-- How much longer than Go's deadline Lua waits before it gives up on its
-- own; Go enforces deadlines, this only guards against a lost completion.
local SAFETY_SLACK_S = 1
local BATCH = 64
local ERRBUF_LEN = 512
local PATHBUF_LEN = 256
-- The dispatcher wakes this often to notice a worker exit (nginx -s
-- reload/quit), lost wake-ups and abandoned calls.
local POLL_S = 0.5
local SWEEP_EVERY_S = 1
local STALE_S = 5
-- The reader blocks on the wake-up socket with the longest timeout ngx_lua
-- accepts: a read timeout logs an [error] line, so it must almost never fire.
local READ_TIMEOUT_MS = 2147483647

-- Phases in which a light thread may yield.
local yieldable = {
    rewrite = true, server_rewrite = true, access = true, content = true,
    timer = true, ssl_cert = true, ssl_client_hello = true,
    ssl_session_fetch = true,
}

local cmd_t = ffi_typeof("qrpc_cmd_t")
local CMD_SIZE = ffi_sizeof(cmd_t)
local u32_ptr_t = ffi_typeof("const uint32_t *")
local u32_wptr_t = ffi_typeof("uint32_t *")
local u64_ptr_t = ffi_typeof("const uint64_t *")
local cstr_t = ffi_typeof("const char *")
local char_arr_t = ffi_typeof("char[?]")


local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }


-- Configuration (read at load time) and the loaded state of this worker.
local cfg_host, cfg_lib, cfg_socket_dir = nil, nil, "/tmp"
local lib            -- the ffi.load namespace of libffi_qrpc.so; nil until loaded
local host           -- "builtin" or "resty_ffi", once loaded
local builtin        -- host == "builtin"
local rt             -- the lua-resty-ffi runtime
local lib_where      -- where the library was found

local errbuf = ffi_new(char_arr_t, ERRBUF_LEN)
local pathbuf = ffi_new(char_arr_t, PATHBUF_LEN)
-- Reused: qrpc_submit reads a command synchronously, never after it returns.
local ucmd = ffi_new(cmd_t)
local xcmd = ffi_new(cmd_t)
local hbuf, hbuf_cap = nil, 0
local stats_buf = ffi_new("qrpc_stats_t")
local comps             -- qrpc_completion_t[BATCH], allocated at load

local pend = {}         -- call id -> waiter of a call in flight
local npend = 0
local pool = {}         -- idle waiters
local npool = 0
local last_id = 0
local orphan_connects = {}  -- call ids of CONNECTs whose result must be closed

local disp_gen = 0      -- generation of the live dispatcher; 0: none
local disp_seq = 0
local disp_beat = 0
local disp_fails = 0

local conn_cache = {}   -- addr -> list of connection entries

local ensure_dispatcher


local function bad(n, msg)
    return nil, "bad argument #" .. n .. ": " .. msg
end


local function status_err(status, msg)
    if status == QRPC_ERR_TIMEOUT or status == QRPC_ERR_CLOSED
       or status == QRPC_ERR_FULL
    then
        return status_names[status]
    end
    if msg and msg ~= "" then
        return msg
    end
    return status_names[status] or ("qrpc: status " .. tostring(status))
end


local function submit_err(rc)
    return status_err(rc, ffi_string(errbuf))
end


-- [u32 len][bytes] entries, native-endian; unaligned 32-bit access is fine
-- on the platforms LuaJIT and Go share (x86-64, arm64).
local function read_u32(p, off)
    return ffi_cast(u32_ptr_t, p + off)[0]
end


local function decode_headers(p, n)
    local hdrs = new_tab(0, 4)
    local off = 0
    while off < n do
        if n - off < 8 then
            return nil
        end
        local klen = read_u32(p, off)
        if klen > n - off - 8 then
            return nil
        end
        local k = ffi_string(p + off + 4, klen)
        off = off + 4 + klen
        local vlen = read_u32(p, off)
        if vlen > n - off - 4 then
            return nil
        end
        hdrs[k] = ffi_string(p + off + 4, vlen)
        off = off + 4 + vlen
    end
    return hdrs
end


-- A result blob: [u32 code][u32 hdrs_len][hdrs][body].
local function decode_result(p, len)
    if p == nil or len < 8 then
        return nil
    end
    local code = read_u32(p, 0)
    local hlen = read_u32(p, 4)
    if hlen > len - 8 then
        return nil
    end
    local hdrs = decode_headers(p + 8, hlen)
    if not hdrs then
        return nil
    end
    return {
        code = code,
        headers = hdrs,
        body = ffi_string(p + 8 + hlen, len - 8 - hlen),
    }
end


local function hbuf_grow(need, used)
    local cap = math_max(hbuf_cap * 2, 1024)
    while cap < need do
        cap = cap * 2
    end
    local nb = ffi_new(char_arr_t, cap)
    if used > 0 then
        ffi_copy(nb, hbuf, used)
    end
    hbuf, hbuf_cap = nb, cap
end


local function put_str(off, s)
    local n = #s
    local need = off + 4 + n
    if need > hbuf_cap then
        hbuf_grow(need, off)
    end
    ffi_cast(u32_wptr_t, hbuf + off)[0] = n
    ffi_copy(hbuf + off + 4, s, n)
    return need
end


-- Packs a { name = value } table into hbuf; returns the number of entries
-- (names + values) and the length in bytes, or nil and an error.
local function pack_headers(h, argn)
    local n, off = 0, 0
    for k, v in pairs(h) do
        if type(k) ~= "string" then
            return bad(argn, "header names must be strings")
        end
        local tv = type(v)
        if tv == "number" then
            v = tostring(v)
        elseif tv ~= "string" then
            return bad(argn, "header '" .. k .. "' must be a string (got "
                             .. tv .. ")")
        end
        off = put_str(off, k)
        off = put_str(off, v)
        n = n + 2
    end
    return n, off
end


-- Checks a timeout in ms; returns it as an integer (0: default).
local function check_ms(v, argn, name)
    if type(v) ~= "number" or v ~= v then
        return bad(argn, name .. " must be a number of milliseconds (got "
                         .. type(v) .. ")")
    end
    if v < 0 then
        return bad(argn, name .. " must not be negative")
    end
    if v > MAX_MS then
        return bad(argn, name .. " is too large (max " .. MAX_MS .. " ms)")
    end
    return math_ceil(v)
end


local function check_count(v, argn, name)
    if type(v) ~= "number" or v ~= v or v < 1 or v > MAX_MS
       or math_floor(v) ~= v
    then
        return bad(argn, name .. " must be a positive integer")
    end
    return v
end


-------------------------------------------------------------------------
-- Finding and loading the library
-------------------------------------------------------------------------

local function module_dir()
    local info = debug_getinfo(1, "S")
    local src = info and info.source
    if type(src) == "string" and str_byte(src, 1) == 64 then -- "@path"
        return str_match(str_sub(src, 2), "^(.*)/[^/]*$") or "."
    end
end


local function clean_path(p)
    local n
    repeat
        p, n = str_gsub(p, "/[^/]+/%.%./", "/", 1)
    until n == 0
    return p
end


local function candidates()
    local list, seen = {}, {}
    local function add(p)
        p = clean_path(p)
        if not seen[p] then
            seen[p] = true
            list[#list + 1] = p
        end
    end
    local dir = module_dir()
    if dir then
        add(dir .. "/../../" .. LIBNAME)       -- the Lua root (OpenResty lualib/)
        add(dir .. "/../../../" .. LIBNAME)    -- its parent (a source checkout)
        add(dir .. "/../../../lib/" .. LIBNAME)
        -- make install / luarocks: PREFIX/share/lua/5.1 beside PREFIX/lib
        local prefix = str_match(dir, "^(.*)/share/lua/5%.1/resty/ffi$")
        if prefix then
            add(prefix .. "/lib/" .. LIBNAME)
            add(prefix .. "/lib/lua/5.1/" .. LIBNAME)
        end
    end
    for tmpl in str_gmatch(package_cpath or "", "[^;]+") do
        if str_find(tmpl, "?", 1, true) then
            add((str_gsub(tmpl, "%?", "libffi_qrpc")))
        end
    end
    add("/usr/local/lib/" .. LIBNAME)
    add("/usr/local/openresty/lualib/" .. LIBNAME)
    return list
end


local symbols = {
    "qrpc_init", "qrpc_wake_open", "qrpc_submit", "qrpc_stats", "qrpc_drain",
    "qrpc_free", "qrpc_shutdown",
}

local function check_symbols(l)
    for _, name in ipairs(symbols) do
        local _ = l[name]
    end
end


local function try_load(path)
    local ok, l = pcall(ffi_load, path)
    if not ok then
        return nil, tostring(l)
    end
    local sok, err = pcall(check_symbols, l)
    if not sok then
        return nil, "not a usable " .. LIBNAME .. " (" .. tostring(err) .. ")"
    end
    return l
end


local function open_library()
    if cfg_lib then
        local l, err = try_load(cfg_lib)
        if not l then
            return nil, "qrpc: cannot load " .. cfg_lib .. ": " .. err
        end
        return l, cfg_lib
    end
    local tried = {}
    for _, path in ipairs(candidates()) do
        local f = io_open(path, "rb")
        if f then
            f:close()
            local l, err = try_load(path)
            if l then
                return l, path
            end
            tried[#tried + 1] = path .. " (" .. err .. ")"
        else
            tried[#tried + 1] = path
        end
    end
    -- "ffi_qrpc" goes to the dynamic linker: LD_LIBRARY_PATH, ld.so.cache, ...
    local l, err = try_load("ffi_qrpc")
    if l then
        return l, "ffi_qrpc"
    end
    tried[#tried + 1] = "the dynamic linker's path (LD_LIBRARY_PATH, "
                        .. "/etc/ld.so.cache, /lib, /usr/lib: " .. err .. ")"
    return nil, "qrpc: " .. LIBNAME .. " not found; looked in: "
                .. tab_concat(tried, ", ")
                .. "; set qrpc.configure{ lib = \"/path/to/" .. LIBNAME .. "\" }"
end


local function init_runtime(l)
    local rc = l.qrpc_init(errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, "qrpc: init: " .. submit_err(rc)
    end
    return true
end


-- The asynchronous signals nginx handles (Linux numbers): SIGHUP, SIGINT,
-- SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM, SIGCHLD, SIGWINCH, SIGIO.
local NGX_SIGNALS = { 1, 2, 3, 10, 12, 14, 15, 17, 28, 29 }
local SIG_BLOCK, SIG_SETMASK = 0, 2
local SIGSET_BYTES = 128   -- glibc's sigset_t

-- A process-directed signal goes to any thread that does not block it.
-- Once Go's threads exist, nginx's SIGCHLD handler could run on one of them
-- and reap the child of os.execute/io.popen first (system() then returns
-- -1: golang/go#55066, openresty/openresty#1022), and SIGQUIT/SIGHUP would
-- not interrupt the worker's epoll_wait. Go's runtime gives every thread it
-- creates the signal mask of the thread that started it, which is the one
-- that dlopen()s the library: so the worker blocks these signals around the
-- load and restores its own mask afterwards.
local function block_ngx_signals()
    if ffi.os ~= "Linux" then
        return nil
    end
    local ok, old = pcall(function()
        local C = ffi.C
        local set = ffi_new("uint8_t[?]", SIGSET_BYTES)
        local prev = ffi_new("uint8_t[?]", SIGSET_BYTES)
        C.sigemptyset(set)
        for _, sig in ipairs(NGX_SIGNALS) do
            C.sigaddset(set, sig)
        end
        if C.pthread_sigmask(SIG_BLOCK, set, prev) ~= 0 then
            return nil
        end
        return prev
    end)
    if not ok then
        ngx_log(ngx_WARN, "qrpc: cannot mask signals while loading Go: ", old)
        return nil
    end
    return old
end


local function restore_signals(prev)
    if prev then
        ffi.C.pthread_sigmask(SIG_SETMASK, prev, nil)
    end
end


local load_library_masked

local function load_library()
    if get_phase() == "init" then
        return nil, ERR_INIT
    end
    local prev = block_ngx_signals()
    local ok, res, err = pcall(load_library_masked)
    restore_signals(prev)
    if not ok then
        return nil, "qrpc: loading failed: " .. tostring(res)
    end
    return res, err
end


load_library_masked = function()

    local l, where = open_library()
    if not l then
        return nil, where
    end

    local want = cfg_host
    local load_ffi = rawget(ngx, "load_ffi")
    if want == nil then
        want = type(load_ffi) == "function" and "resty_ffi" or "builtin"
    end

    if want == "resty_ffi" then
        local err
        if type(load_ffi) ~= "function" then
            err = "ngx.load_ffi is missing (lua-resty-ffi is not loaded)"
        else
            -- lua-resty-ffi dlopen()s the same file: one Go runtime per process.
            local ok, r, rc = pcall(load_ffi, where, nil)
            if ok and r then
                rt = r
            else
                err = ok and ("libffi_init failed: " .. tostring(rc))
                      or tostring(r)
            end
        end
        if err then
            if cfg_host == "resty_ffi" then
                return nil, "qrpc: host resty_ffi: " .. err
            end
            ngx_log(ngx_NOTICE, "qrpc: lua-resty-ffi unusable (", err,
                    "); using the built-in host")
            want = "builtin"
        end
    end

    -- Both hosts need the synchronous entry points (event, close, cancel,
    -- stats), which run on the nginx thread through qrpc_submit.
    local ok, err = init_runtime(l)
    if not ok then
        rt = nil
        return nil, err
    end

    comps = ffi_new("qrpc_completion_t[?]", BATCH)
    lib, host, lib_where = l, want, where
    builtin = want == "builtin"
    ngx_log(ngx_NOTICE, "qrpc: loaded ", where, " (host ", want, ")")
    if not builtin then
        -- Go's log lines come through the completion queue with either host.
        ensure_dispatcher()
    end
    return true
end


local function ensure_loaded()
    if lib then
        return true
    end
    return load_library()
end


-------------------------------------------------------------------------
-- Built-in host: completions, waiters and the dispatcher
-------------------------------------------------------------------------

local function cancel(handle, id)
    xcmd.version = CMD_VERSION
    xcmd.op = OP_CANCEL
    xcmd.conn = handle or 0
    xcmd.call_id = id
    lib.qrpc_submit(xcmd, errbuf, ERRBUF_LEN)
end


local function close_handle(handle)
    xcmd.version = CMD_VERSION
    xcmd.op = OP_CLOSE
    xcmd.conn = handle
    xcmd.call_id = 0
    local rc = lib.qrpc_submit(xcmd, errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, submit_err(rc)
    end
    return true
end


local finish_connect  -- defined with the connection cache


-- Go's log lines arrive as completions; they already start with "qrpc: ".
local function log_go(level, msg)
    if level < 1 or level > 8 then
        level = ngx_NOTICE
    end
    ngx_log(level, msg)
end


local function complete(c)
    local status = c.status
    local data = c.data
    local len = tonumber(c.len)

    if status == QRPC_LOG then
        if data ~= nil then
            log_go(c.code, ffi_string(data, len))
            lib.qrpc_free(data)
        end
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
        if data ~= nil then
            lib.qrpc_free(data)
        end
        return
    end
    pend[id] = nil
    npend = npend - 1

    local op = w.op
    local val
    if status == QRPC_OK then
        if op == OP_CONNECT then
            val = c.handle
        else
            val = decode_result(data, len)
            if not val then
                status, val = QRPC_ERR, "qrpc: malformed result from the library"
            end
        end
    else
        val = status_err(status, data ~= nil and ffi_string(data, len) or nil)
    end
    if data ~= nil then
        lib.qrpc_free(data)
    end

    if op == OP_CONNECT then
        finish_connect(w.entry, status, val)
        return
    end
    w.status = status
    w.val = val
    if not w.inline then
        w.sema:post(1)
    end
end


local function drain()
    local n = lib.qrpc_drain(comps, BATCH)
    while n > 0 do
        for i = 0, n - 1 do
            complete(comps[i])
        end
        if n < BATCH then
            break
        end
        n = lib.qrpc_drain(comps, BATCH)
    end
end


-- A call whose waiter is gone (its light thread was killed, or the client
-- aborted the request with lua_check_client_abort on) is cancelled here, so
-- Go forgets it without waiting for its deadline. A waiting semaphore has a
-- negative count; nginx's cleanup of a killed waiter brings it back to 0.
-- Past its deadline (plus slack), any waiter is dropped.
local function sweep(now)
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


local function open_wake()
    local dir = cfg_socket_dir
    local rc = lib.qrpc_wake_open(dir, #dir, pathbuf, PATHBUF_LEN, errbuf,
                                  ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, "qrpc_wake_open(" .. dir .. "): " .. submit_err(rc)
    end
    local path = ffi_string(pathbuf)
    local sock = socket_tcp()
    sock:settimeouts(2000, 2000, READ_TIMEOUT_MS)
    local ok, err = sock:connect("unix:" .. path)
    if not ok then
        return nil, "connect unix:" .. path .. ": " .. tostring(err)
    end
    return sock
end


local function read_wake(sock, ended)
    while true do
        local data, err = sock:receiveany(256)
        if not data then
            if not worker_exiting() then
                ngx_log(ngx_WARN, "qrpc: wake-up socket: ", err)
            end
            sock:close()
            ended:post(1)
            return
        end
        drain()
    end
end


-- The dispatcher: one per worker, in a timer. A reader light thread blocks
-- on the wake-up socket (draining on each byte); this thread wakes every
-- POLL_S to notice the worker exiting, to drain anyway (a lost wake-up costs
-- at most POLL_S) and to sweep abandoned calls. It stops once the worker
-- exits and no call waits: a light thread that lingers keeps an old worker
-- "shutting down" forever (Kong#6904).
local function supervise(gen)
    local ended = sema_new(0)
    local sock, reader
    local last_sweep = ngx_now()
    local last_exit_log = 0
    while gen == disp_gen do
        if not reader then
            local err
            sock, err = open_wake()
            if sock then
                reader = thread_spawn(read_wake, sock, ended)
                disp_fails = 0
            else
                disp_fails = disp_fails + 1
                if disp_fails <= 3 or disp_fails % 100 == 0 then
                    ngx_log(ngx_ERR, "qrpc: dispatcher: ", err)
                end
            end
        end
        -- completions queued before the socket was connected wake nobody
        drain()
        disp_beat = ngx_now()

        if worker_exiting() then
            if npend == 0 then
                break
            end
            local now = ngx_now()
            if now - last_exit_log >= 2 then
                last_exit_log = now
                ngx_log(ngx_NOTICE, "qrpc: worker exiting; waiting for ", npend,
                        " call(s) in flight")
            end
        end
        local ok = ended:wait(reader and POLL_S or math_max(POLL_S, 0.1 * disp_fails))
        if ok then
            reader, sock = nil, nil
        end
        drain()
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
    if premature and npend == 0 then
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
    if npend > 0 and not worker_exiting() then
        ensure_dispatcher()
    end
end


ensure_dispatcher = function()
    if disp_gen ~= 0 then
        if ngx_now() - disp_beat < STALE_S then
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


local function get_waiter()
    local w
    if npool > 0 then
        w = pool[npool]
        pool[npool] = nil
        npool = npool - 1
    else
        w = { sema = sema_new(0) }
    end
    return w
end


local function put_waiter(w)
    w.id = nil
    w.status = nil
    w.val = nil
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
        drain()
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


-- Submits ucmd (filled by the caller with op, conn, call_id = id) and waits
-- for its completion. Returns status, value.
local function builtin_wait(handle, op, id, secs)
    local rc = lib.qrpc_submit(ucmd, errbuf, ERRBUF_LEN)
    if rc ~= QRPC_PENDING then
        if rc == QRPC_OK then
            return QRPC_ERR, "qrpc: unexpected synchronous completion"
        end
        return rc, submit_err(rc)
    end

    local disp_ok = ensure_dispatcher()

    local w = get_waiter()
    w.id = id
    w.op = op
    w.handle = handle
    w.deadline = ngx_now() + secs
    pend[id] = w
    npend = npend + 1

    local ok, err
    if disp_ok then
        ok, err = w.sema:wait(secs)
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
        pend[id] = nil
        npend = npend - 1
        cancel(handle, id)
        put_waiter(w)
        if err == "timeout" or ok then
            ngx_log(ngx_WARN, "qrpc: no completion for call ", id, " within ",
                    secs, " s; cancelled")
            return QRPC_ERR_TIMEOUT, "timeout"
        end
        return QRPC_ERR, "qrpc: wait: " .. tostring(err)
    end
    local val = w.val
    put_waiter(w)
    return status, val
end


local function next_call_id()
    last_id = last_id + 1
    return last_id
end


-------------------------------------------------------------------------
-- lua-resty-ffi host
-------------------------------------------------------------------------

-- The command points into Lua strings; Go may read them until the task is
-- answered, even if the calling light thread is killed meanwhile. They stay
-- referenced here until the call returns or, for abandoned calls, well past
-- the deadline Go enforces.
local pinned = {}
local pin_seq = 0
local last_pin_sweep = 0
local PIN_GRACE_S = 60

local function pin(cmd, a, b, c, secs)
    local now = ngx_now()
    if now - last_pin_sweep >= SWEEP_EVERY_S then
        last_pin_sweep = now
        for k, v in pairs(pinned) do
            if v[5] < now then
                pinned[k] = nil
            end
        end
    end
    pin_seq = pin_seq + 1
    pinned[pin_seq] = { cmd, a, b, c, now + secs + PIN_GRACE_S }
    return pin_seq
end


-- Sends cmd as a lua-resty-ffi task. Returns status, response string.
local function rf_call(cmd, a, b, c, secs)
    local key = pin(cmd, a, b, c, secs)
    local ok, x, y = rt:call(ffi_string(cmd, CMD_SIZE))
    pinned[key] = nil
    if ok then
        return QRPC_OK, x
    end
    if type(x) == "number" then
        return x, status_err(x, y)
    end
    -- lua-resty-ffi's own refusal ("post failed, queue full", ...)
    return QRPC_ERR, "qrpc: lua-resty-ffi: " .. tostring(x)
end


-------------------------------------------------------------------------
-- Connections
-------------------------------------------------------------------------

local function cache_remove(e)
    local list = conn_cache[e.addr]
    if not list then
        return
    end
    for i = #list, 1, -1 do
        if list[i] == e then
            tab_remove(list, i)
        end
    end
    if #list == 0 then
        conn_cache[e.addr] = nil
    end
end


local function mark_closed(conn)
    if not conn.closed then
        conn.closed = true
        cache_remove(conn.entry)
    end
end


finish_connect = function(e, status, val)
    if status == QRPC_OK then
        if e.stale then
            close_handle(val)
            e.state, e.err = "failed", "closed"
        else
            e.conn = setmetatable({
                handle = val,
                addr = e.addr,
                timeout = e.call_timeout,
                max_frame = e.max_frame,
                closed = false,
                entry = e,
            }, mt)
            e.state = "ready"
        end
    else
        e.state, e.err = "failed", val
        cache_remove(e)
    end
    local n = e.nwait
    if n > 0 then
        e.sema:post(n)
    end
end


local function same_pins(a, b)
    if a == b then
        return true
    end
    if type(a) ~= "table" or type(b) ~= "table" or #a ~= #b then
        return false
    end
    for i = 1, #a do
        if a[i] ~= b[i] then
            return false
        end
    end
    return true
end


local function find_entry(list, o)
    for i = 1, #list do
        local e = list[i]
        if e.server_name == o.server_name and e.ca == o.ca
           and e.cert == o.cert and e.key == o.key
           and e.insecure == (o.insecure == true)
           and e.conns == o.conns and e.streams == o.streams
           and e.timeout == o.timeout and e.idle_timeout == o.idle_timeout
           and e.max_frame_size == o.max_frame_size
           and same_pins(e.pins, o.pins)
        then
            return e
        end
    end
end


local known_opts = {
    server_name = "string", ca = "string", cert = "string", key = "string",
    pins = "table", insecure = "boolean", conns = "number",
    streams = "number", timeout = "number", idle_timeout = "number",
    max_frame_size = "number",
}


-- A pin is the SHA-256 of the server certificate's SubjectPublicKeyInfo,
-- as 64 hex digits or as base64 (44 characters, optionally "sha256//"
-- first, as curl's --pinnedpubkey prints it).
local function decode_pin(s)
    if type(s) ~= "string" then
        return nil
    end
    if #s == 64 and str_find(s, "^%x+$") then
        return (str_gsub(s, "%x%x", function(h)
            return str_char(tonumber(h, 16))
        end))
    end
    if str_sub(s, 1, 8) == "sha256//" then
        s = str_sub(s, 9)
    end
    local raw = decode_base64(s)
    if raw and #raw == 32 then
        return raw
    end
    return nil
end


-- Full validation, run when no cached connection matched.
local function check_connect_opts(o)
    for k, v in pairs(o) do
        local want = known_opts[k]
        if not want then
            return bad(2, "unknown option '" .. tostring(k) .. "'")
        end
        if type(v) ~= want then
            return bad(2, k .. " must be a " .. want .. " (got " .. type(v) .. ")")
        end
    end
    if (o.cert == nil) ~= (o.key == nil) then
        return bad(2, "cert and key go together")
    end
    local pins = ""
    local list = o.pins
    if list then
        local n, count = #list, 0
        for _ in pairs(list) do
            count = count + 1
        end
        if count ~= n then
            return bad(2, "pins must be a list of strings")
        end
        local raw = new_tab(n, 0)
        for i = 1, n do
            local d = decode_pin(list[i])
            if not d then
                return bad(2, "pins[" .. i .. "] must be a SHA-256 digest in "
                              .. "hex (64 digits) or base64 (44 characters)")
            end
            raw[i] = d
        end
        pins = tab_concat(raw)
    end
    for _, k in ipairs({ "timeout", "idle_timeout" }) do
        if o[k] ~= nil then
            local _, err = check_ms(o[k], 2, k)
            if err then
                return nil, err
            end
        end
    end
    for _, k in ipairs({ "conns", "streams", "max_frame_size" }) do
        if o[k] ~= nil then
            local _, err = check_count(o[k], 2, k)
            if err then
                return nil, err
            end
        end
    end
    return pins
end


local function set_str(cmd, field, s)
    if s then
        cmd[field] = s
        cmd[field .. "_len"] = #s
    end
end


local function start_connect(addr, o, pins)
    local e = {
        addr = addr,
        state = "connecting",
        sema = sema_new(0),
        nwait = 0,
        server_name = o.server_name, ca = o.ca, cert = o.cert, key = o.key,
        insecure = o.insecure == true, conns = o.conns, streams = o.streams,
        timeout = o.timeout, idle_timeout = o.idle_timeout,
        max_frame_size = o.max_frame_size,
        pins = o.pins and { unpack(o.pins) },
        call_timeout = (o.timeout and o.timeout > 0) and math_ceil(o.timeout)
                       or DEFAULT_TIMEOUT_MS,
        max_frame = o.max_frame_size or DEFAULT_MAX_FRAME,
    }
    local dial_ms = (o.timeout and o.timeout > 0) and o.timeout
                    or DEFAULT_TIMEOUT_MS
    e.wait_s = dial_ms / 1000 * (o.conns or 1) + SAFETY_SLACK_S
    e.deadline = ngx_now() + e.wait_s

    local list = conn_cache[addr]
    if not list then
        list = {}
        conn_cache[addr] = list
    end
    list[#list + 1] = e

    local cmd = ffi_new(cmd_t)
    cmd.version = CMD_VERSION
    cmd.op = OP_CONNECT
    cmd.timeout_ms = o.timeout and math_ceil(o.timeout) or 0
    set_str(cmd, "addr", addr)
    set_str(cmd, "server_name", o.server_name)
    set_str(cmd, "ca", o.ca)
    set_str(cmd, "cert", o.cert)
    set_str(cmd, "key", o.key)
    if pins ~= "" then
        set_str(cmd, "pins", pins)
    end
    cmd.insecure = o.insecure and 1 or 0
    cmd.conns = o.conns or 0
    cmd.streams = o.streams or 0
    cmd.idle_timeout_ms = o.idle_timeout and math_ceil(o.idle_timeout) or 0
    cmd.max_frame_size = o.max_frame_size or 0

    if builtin then
        local id = next_call_id()
        cmd.call_id = id
        local rc = lib.qrpc_submit(cmd, errbuf, ERRBUF_LEN)
        if rc ~= QRPC_PENDING then
            finish_connect(e, rc == QRPC_OK and QRPC_ERR or rc,
                           rc == QRPC_OK and "qrpc: unexpected synchronous connect"
                           or submit_err(rc))
            return e
        end
        local disp_ok = ensure_dispatcher()
        pend[id] = { op = OP_CONNECT, entry = e, id = id }
        npend = npend + 1
        e.id = id
        if not disp_ok then
            e.inline = true
        end
        return e
    end

    -- lua-resty-ffi: this light thread carries the task; others wait on e.
    local status, val = rf_call(cmd, e, addr, pins, e.wait_s)
    if status == QRPC_OK then
        if type(val) == "string" and #val == 8 then
            val = ffi_cast(u64_ptr_t, ffi_cast(cstr_t, val))[0]
        else
            status, val = QRPC_ERR, "qrpc: malformed connect response"
        end
    end
    finish_connect(e, status, val)
    return e
end


local function wait_entry(e)
    if e.state == "connecting" then
        e.nwait = e.nwait + 1
        local left = e.deadline - ngx_now()
        if e.inline then
            -- no dispatcher (worker exiting): poll like wait_inline
            local pause = 0.001
            while e.state == "connecting" and ngx_now() < e.deadline do
                drain()
                if e.state ~= "connecting" then
                    break
                end
                ngx_sleep(pause)
                if pause < 0.05 then
                    pause = pause * 2
                end
            end
        elseif left > 0 then
            e.sema:wait(left)
        end
        e.nwait = e.nwait - 1
    end
    if e.state == "ready" then
        return e.conn
    end
    if e.state == "failed" then
        return nil, e.err
    end
    -- Go never answered: give up on this attempt; a late success is closed.
    e.stale = true
    e.state, e.err = "failed", "connect: timeout"
    cache_remove(e)
    if e.id and pend[e.id] then
        pend[e.id] = nil
        npend = npend - 1
        orphan_connects[e.id] = true
    end
    return nil, e.err
end


local EMPTY = {}

-- Returns the cached connection for addr + opts, dialling only when there is
-- none; concurrent callers share one dial. Yields (the dial completes
-- asynchronously), except that a ready cached connection is returned in any
-- phase, so log_by_lua and filters can reuse what content_by_lua connected.
function _M.connect(addr, opts)
    if type(addr) ~= "string" or addr == "" then
        return bad(1, "addr must be a non-empty string host:port (got "
                      .. type(addr) .. ")")
    end
    if not str_find(addr, ":%d+$") then
        return bad(1, "addr must be host:port (got \"" .. addr .. "\")")
    end
    if opts == nil then
        opts = EMPTY
    elseif type(opts) ~= "table" then
        return bad(2, "opts must be a table (got " .. type(opts) .. ")")
    end

    local phase = get_phase()
    if phase == "init" then
        return nil, ERR_INIT
    end

    local list = conn_cache[addr]
    local e = list and find_entry(list, opts)
    if e then
        if e.state == "ready" then
            if not e.conn.closed then
                return e.conn
            end
            cache_remove(e)
            e = nil
        elseif e.state == "connecting" and ngx_now() > e.deadline then
            e.stale = true
            cache_remove(e)
            e = nil
        end
    end

    if not yieldable[phase] then
        return nil, "qrpc: cannot connect in the " .. phase .. " phase "
                    .. "(connect yields); connect in rewrite, access, content "
                    .. "or a timer first, later calls reuse that connection"
    end

    if not e then
        local pins, err = check_connect_opts(opts)
        if not pins then
            return nil, err
        end
        local ok
        ok, err = ensure_loaded()
        if not ok then
            return nil, err
        end
        e = start_connect(addr, opts, pins)
    end
    return wait_entry(e)
end


local function check_conn(self)
    if getmetatable(self) ~= mt or self.handle == nil then
        return bad(1, "a connection is expected (use conn:method(...), "
                      .. "not conn.method(...))")
    end
    if self.closed then
        return nil, "closed"
    end
    return true
end


-- Checks method, body, opts of unary/event; packs headers into hbuf.
-- Returns body, nhdrs, hdrs_len, timeout (0: none given), or nil, err.
local function check_call(self, method, body, opts)
    if type(method) ~= "string" then
        return bad(2, "method must be a string (got " .. type(method) .. ")")
    end
    if body == nil then
        body = ""
    elseif type(body) ~= "string" then
        return bad(3, "body must be a string (got " .. type(body) .. ")")
    end
    if #body > self.max_frame then
        return bad(3, "body too large (" .. #body .. " bytes; max_frame_size "
                      .. "is " .. self.max_frame .. ")")
    end
    local nh, hlen, timeout = 0, 0, 0
    if opts ~= nil then
        if type(opts) ~= "table" then
            return bad(4, "opts must be a table (got " .. type(opts) .. ")")
        end
        local t = opts.timeout
        if t ~= nil then
            local err
            timeout, err = check_ms(t, 4, "timeout")
            if not timeout then
                return nil, err
            end
        end
        local h = opts.headers
        if h ~= nil then
            if type(h) ~= "table" then
                return bad(4, "headers must be a table (got " .. type(h) .. ")")
            end
            nh, hlen = pack_headers(h, 4)
            if not nh then
                return nil, hlen
            end
        end
    end
    return body, nh, hlen, timeout
end


-- hdrs is hbuf (read by Go before qrpc_submit returns) or, for a call that
-- crosses a yield with the lua-resty-ffi host, a string the caller anchors.
local function fill_cmd(cmd, op, handle, id, method, body, nh, hdrs, hlen,
                        timeout)
    cmd.version = CMD_VERSION
    cmd.op = op
    cmd.conn = handle
    cmd.call_id = id
    cmd.timeout_ms = timeout
    cmd.nhdrs = nh
    cmd.method = method
    cmd.method_len = #method
    cmd.body = body
    cmd.body_len = #body
    if nh > 0 then
        cmd.hdrs = hdrs
        cmd.hdrs_len = hlen
    else
        cmd.hdrs = nil
        cmd.hdrs_len = 0
    end
    return cmd
end


-- rf_decode turns a lua-resty-ffi host's OK result blob into a table.
local function rf_decode(status, val)
    if status == QRPC_OK then
        val = decode_result(ffi_cast(cstr_t, val), #val)
        if not val then
            return QRPC_ERR, "qrpc: malformed result from the library"
        end
    end
    return status, val
end


-- conn:unary(method, body?, opts?) -> { code, body, headers } | nil, err
-- opts: headers ({ name = value }), timeout (ms; default: the connection's
-- timeout option, else 5000).
function _M.unary(self, method, body, opts)
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    local nh, hlen, timeout
    body, nh, hlen, timeout = check_call(self, method, body, opts)
    if not body then
        return nil, nh
    end
    if timeout == 0 then
        timeout = self.timeout
    end

    local phase = get_phase()
    if not yieldable[phase] then
        return nil, "qrpc: unary cannot be used in the " .. phase
                    .. " phase (it yields); use conn:event, or a timer"
    end

    local status, val
    local secs = timeout / 1000 + SAFETY_SLACK_S
    if builtin then
        local id = next_call_id()
        fill_cmd(ucmd, OP_UNARY, self.handle, id, method, body, nh, hbuf, hlen,
                 timeout)
        status, val = builtin_wait(self.handle, OP_UNARY, id, secs)
    else
        -- hbuf is shared: this call keeps its own copy across the yield
        local hstr = nh > 0 and ffi_string(hbuf, hlen) or nil
        local cmd = fill_cmd(ffi_new(cmd_t), OP_UNARY, self.handle, 0, method,
                             body, nh, hstr, hlen, timeout)
        status, val = rf_decode(rf_call(cmd, method, body, hstr, secs))
    end

    if status == QRPC_OK then
        return val
    end
    if status == QRPC_ERR_CLOSED then
        mark_closed(self)
    end
    return nil, val
end


-- conn:event(method, body?, opts?) -> true | nil, err. Never yields: usable
-- in every phase that runs in a worker (log, header/body filters, timers...).
-- opts: headers.
function _M.event(self, method, body, opts)
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    local nh, hlen
    body, nh, hlen = check_call(self, method, body, opts)
    if not body then
        return nil, nh
    end
    fill_cmd(ucmd, OP_EVENT, self.handle, 0, method, body, nh, hbuf, hlen, 0)
    local rc = lib.qrpc_submit(ucmd, errbuf, ERRBUF_LEN)
    if rc == QRPC_OK then
        return true
    end
    if rc == QRPC_ERR_CLOSED then
        mark_closed(self)
    end
    return nil, submit_err(rc)
end


-- conn:close() -> true | nil, err. Pending calls on it fail with "closed";
-- the next qrpc.connect with the same addr + opts dials again. Closing a
-- closed connection returns true.
function _M.close(self)
    if getmetatable(self) ~= mt or self.handle == nil then
        return bad(1, "a connection is expected")
    end
    if self.closed then
        return true
    end
    mark_closed(self)
    return close_handle(self.handle)
end


local function stats_of(handle)
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


-- conn:stats() -> { inflight, calls, events, dropped, reconnects, queued }
function _M.stats(self)
    if self == nil or self == _M then
        -- qrpc.stats(): the whole runtime of this worker
        local s
        if lib then
            local err
            s, err = stats_of(0)
            if not s then
                return nil, err
            end
        else
            s = { inflight = 0, calls = 0, events = 0, dropped = 0,
                  reconnects = 0, queued = 0 }
        end
        s.loaded = lib ~= nil
        s.host = host
        s.lib = lib_where
        s.waiting = npend
        s.dispatcher = disp_gen ~= 0
        local n = 0
        for _, list in pairs(conn_cache) do
            n = n + #list
        end
        s.connections = n
        return s
    end
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    return stats_of(self.handle)
end


-- qrpc.configure{ host = "builtin" | "resty_ffi", lib = path, socket_dir = dir }
-- Omitted fields take their defaults: host chosen at load (lua-resty-ffi
-- when ngx.load_ffi exists and loads the library, else built-in); lib
-- searched (see open_library); socket_dir "/tmp". Usable in any phase,
-- including init_by_lua; it takes effect when the library loads, so after
-- that it only accepts the settings already in force.
function _M.configure(opts)
    if type(opts) ~= "table" then
        return bad(1, "opts must be a table (got " .. type(opts) .. ")")
    end
    for k in pairs(opts) do
        if k ~= "host" and k ~= "lib" and k ~= "socket_dir" then
            return bad(1, "unknown option '" .. tostring(k) .. "'")
        end
    end
    local h, l, d = opts.host, opts.lib, opts.socket_dir
    if h ~= nil and h ~= "builtin" and h ~= "resty_ffi" then
        return bad(1, "host must be \"builtin\" or \"resty_ffi\"")
    end
    if l ~= nil and (type(l) ~= "string" or l == "") then
        return bad(1, "lib must be a path")
    end
    if d ~= nil and (type(d) ~= "string" or d == "") then
        return bad(1, "socket_dir must be a directory path")
    end
    d = d or "/tmp"
    if lib then
        if (h and h ~= host) or (l and l ~= lib_where)
           or d ~= cfg_socket_dir
        then
            return nil, "qrpc: already loaded in this worker (" .. lib_where
                        .. ", host " .. host .. "); configure before the "
                        .. "first call"
        end
        return true
    end
    cfg_host, cfg_lib, cfg_socket_dir = h, l, d
    return true
end


-- qrpc.init_worker() -> true | nil, err. Optional, from init_worker_by_lua:
-- loads the library and starts the dispatcher now rather than at the first
-- call, so that a missing library shows at start-up.
function _M.init_worker()
    if get_phase() == "init" then
        return nil, ERR_INIT
    end
    local ok, err = ensure_loaded()
    if not ok then
        return nil, err
    end
    return ensure_dispatcher()
end


-- qrpc._echo(body) -> body | nil, err: a round trip through the library and
-- back with no network, for the IPC benchmark.
function _M._echo(body)
    if type(body) ~= "string" then
        return bad(1, "body must be a string")
    end
    local phase = get_phase()
    if phase == "init" then
        return nil, ERR_INIT
    end
    if not yieldable[phase] then
        return nil, "qrpc: _echo cannot be used in the " .. phase .. " phase"
    end
    local ok, err = ensure_loaded()
    if not ok then
        return nil, err
    end
    local status, val
    if builtin then
        local id = next_call_id()
        fill_cmd(ucmd, OP_ECHO, 0, id, "", body, 0, nil, 0, DEFAULT_TIMEOUT_MS)
        status, val = builtin_wait(nil, OP_ECHO, id,
                                   DEFAULT_TIMEOUT_MS / 1000 + SAFETY_SLACK_S)
    else
        local cmd = fill_cmd(ffi_new(cmd_t), OP_ECHO, 0, 0, "", body, 0, nil, 0,
                             DEFAULT_TIMEOUT_MS)
        status, val = rf_decode(rf_call(cmd, body, nil, nil,
                                        DEFAULT_TIMEOUT_MS / 1000))
    end
    if status == QRPC_OK then
        return val.body
    end
    return nil, val
end


return _M
