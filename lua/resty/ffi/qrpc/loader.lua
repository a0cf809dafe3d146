-- resty.ffi.qrpc.loader: finding libffi_qrpc.so, loading it into a worker
-- with nginx's signals masked, choosing the host ("builtin" or
-- "resty_ffi") and starting the Go runtime (qrpc_init).
--
-- Never in the master: a Go runtime does not survive fork(), so load()
-- refuses the init phase. It keeps no state: the caller records what it
-- returns.

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"

local ffi_new = ffi.new
local ffi_load = ffi.load
local C = ffi.C
local bor = require("bit").bor

local ngx = ngx
local ngx_log = ngx.log
local ngx_WARN = ngx.WARN
local ngx_NOTICE = ngx.NOTICE
local get_phase = ngx.get_phase

local type = type
local tostring = tostring
local ipairs = ipairs
local pcall = pcall
local rawget = rawget
local io_open = io.open
local os_getenv = os.getenv
local ngx_worker_pid = ngx.worker.pid
local str_byte = string.byte
local str_sub = string.sub
local str_match = string.match
local str_gmatch = string.gmatch
local str_gsub = string.gsub
local str_find = string.find
local tab_concat = table.concat
local debug_getinfo = debug.getinfo
local package_cpath = package.cpath

local QRPC_OK = abi.QRPC_OK
local new_errbuf = abi.new_errbuf
local ERRBUF_LEN = abi.ERRBUF_LEN
local submit_err = abi.submit_err

-- Used to keep nginx's process signals away from Go's threads (see
-- load). pcall: another module may have declared them already.
-- Under names of their own: another module's declaration of dlopen
-- (char * for const char *) would otherwise be the one in force.
pcall(ffi.cdef, [[
void *qrpc_loader_dlopen(const char *file, int mode) __asm__("dlopen");
int qrpc_loader_dlclose(void *handle) __asm__("dlclose");
]])
pcall(ffi.cdef, [[
int sigemptyset(void *set);
int sigaddset(void *set, int signum);
int pthread_sigmask(int how, const void *set, void *oldset);
]])


local LIBNAME = "libffi_qrpc.so"

local _M = {
    LIBNAME = LIBNAME,
    ERR_INIT = "qrpc: not available in the init phase (the Go runtime "
               .. "must load in workers: call it from a worker phase)",
}


-- The directory of this file: <Lua root>/resty/ffi/qrpc.
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
        add(dir .. "/../../../" .. LIBNAME)       -- the Lua root (OpenResty lualib/)
        add(dir .. "/../../../../" .. LIBNAME)    -- its parent (a source checkout)
        add(dir .. "/../../../../lib/" .. LIBNAME)
        -- make install / luarocks: PREFIX/share/lua/5.1 beside PREFIX/lib
        local prefix = str_match(dir, "^(.*)/share/lua/5%.1/resty/ffi/qrpc$")
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
    "qrpc_init", "qrpc_claim", "qrpc_stats",
    "qrpc_query", "qrpc_submit_async", "qrpc_release",
    "qrpc_release_n", "qrpc_vm_open", "qrpc_vm_wake_open", "qrpc_vm_poll",
}

local function has(l, name)
    return (pcall(function() return l[name] end))
end

-- missing(l) -> the first of symbols that l lacks, or nil
local function missing(l)
    for _, name in ipairs(symbols) do
        if not has(l, name) then
            return name
        end
    end
end


local function try_load(path)
    local ok, l = pcall(ffi_load, path)
    if not ok then
        return nil, tostring(l)
    end
    local lacks = missing(l)
    if lacks then
        if has(l, "qrpc_init") then
            -- ours of another release, or another library that happens
            -- to export qrpc_init: loaded, it runs (a Go runtime, if it is
            -- ours), so the search must not load another file (true: stop)
            return nil, "a " .. LIBNAME .. " that does not match these Lua "
                        .. "modules (it lacks " .. lacks .. "): another "
                        .. "release, or another library of that name; "
                        .. "install the library built with them", true
        end
        return nil, "not a usable " .. LIBNAME .. " (no " .. lacks .. ")"
    end
    -- at once: a Lua VM that loads later must find this copy recorded,
    -- whatever becomes of this load (ffi/libid.go)
    local errbuf = new_errbuf()
    local rc = l.qrpc_claim(errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, (str_gsub(submit_err(rc, errbuf), "^qrpc: ", ""))
    end
    return l
end


-- is_loaded(file) -> whether dlopen(file) would give the library already
-- loaded: RTLD_NOLOAD loads nothing, and finds an object by name or by
-- its file (device and inode, as the dynamic linker tells files apart),
-- so a hard link or a symlink of the loaded file is that file, and a
-- bare name is searched for as ffi.load would.
local RTLD_LAZY, RTLD_NOLOAD = 0x1, 0x4
local function is_loaded(file)
    if not str_find(file, "/", 1, true) then
        -- ffi.load's names: "ffi_qrpc" is libffi_qrpc.so
        if not str_find(file, ".", 1, true) then
            file = file .. ".so"
        end
        if str_sub(file, 1, 3) ~= "lib" then
            file = "lib" .. file
        end
    end
    local h = C.qrpc_loader_dlopen(file, bor(RTLD_LAZY, RTLD_NOLOAD))
    if h == nil then
        return false
    end
    C.qrpc_loader_dlclose(h)
    return true
end


-- this process in QRPC_LIBRARY's form (ffi/libid.go): "<pid> <start
-- time>", the start time /proc/self/stat's 22nd field
local function self_proc()
    local start = "0"
    local f = io_open("/proc/self/stat", "rb")
    if f then
        local st = f:read("*a") or ""
        f:close()
        -- after the command name's ")", which may hold spaces and ")"
        local rest = str_match(st, "^.*%)(.*)$")
        local i = 0
        for field in str_gmatch(rest or "", "%S+") do
            i = i + 1
            if i == 20 then
                start = field
                break
            end
        end
    end
    return ngx_worker_pid() .. " " .. start
end


-- loaded_lib() -> the path of the library this process loaded first
-- (ffi/libid.go records "<pid> <start time> <device> <inode> <path>" in
-- QRPC_LIBRARY when a copy starts), and whether that file was replaced
-- since (mapped "(deleted)"); nil when no copy runs here (an entry the
-- process inherited from the worker that started it: another process).
local function loaded_lib()
    local proc, dev, ino = str_match(os_getenv("QRPC_LIBRARY") or "",
                                     "^(%d+ %d+) (%S+) (%d+) /")
    if not proc or proc ~= self_proc() then
        return nil
    end
    local f = io_open("/proc/self/maps", "rb")
    if not f then
        return nil
    end
    -- the file's name now: its device and inode (renamed since: a backup
    -- made with mv), " (deleted)" at its end (replaced since)
    local now
    for line in f:lines() do
        local d, i, p = str_match(line, "^%S+%s+%S+%s+%S+%s+(%S+)%s+(%d+)%s+(/.*)$")
        if d == dev and i == ino then
            now = p
            break
        end
    end
    f:close()
    if not now then
        return nil
    end
    -- the kernel writes a newline of a path as \012 and a backslash as
    -- it is: the reading that is the loaded file
    if str_find(now, "\\012", 1, true) and not is_loaded(now) then
        now = str_gsub(now, "\\012", "\n")
    end
    -- " (deleted)": the kernel's mark of a file replaced since, unless a
    -- file of that very name is the loaded one
    local replaced = str_sub(now, -10) == " (deleted)" and not is_loaded(now)
    return now, replaced
end


-- Each copy of the library is a Go runtime, and a worker must run one:
-- once a Lua VM of the worker (the other subsystem) has loaded it, this
-- one loads the same file: the loaded one, or cfg_lib when that is the
-- same file. Another file is refused, and so is a library replaced since
-- (a load would map the new file).
local function same_library(cfg_lib)
    local path, replaced = loaded_lib()
    if not path then
        return nil
    end
    local other = "this worker runs another copy of the library ("
                  .. path .. "): one Go runtime per worker; "
    if replaced then
        return nil, "qrpc: cannot load " .. (cfg_lib or path) .. ": " .. other
                    .. "its file was replaced since; reload nginx"
    end
    if not is_loaded(cfg_lib or path) then
        -- cfg_lib names another file; or the recorded file's name now is
        -- another's (renamed, and that name taken since): never a load
        -- that would start a second copy
        return nil, "qrpc: cannot load " .. (cfg_lib or path) .. ": " .. other
                    .. "load the same file in both subsystems"
    end
    local l, err = try_load(cfg_lib or path)
    if not l then
        return nil, "qrpc: cannot load " .. (cfg_lib or path) .. ": " .. err
    end
    return l, cfg_lib or path
end


local function open_library(cfg_lib)
    local same, where = same_library(cfg_lib)
    if same or where then
        return same, where
    end
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
            local l, err, stop = try_load(path)
            if l then
                return l, path
            end
            if stop then
                return nil, "qrpc: cannot load " .. path .. ": " .. err
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
    local errbuf = new_errbuf()
    local rc = l.qrpc_init(errbuf, ERRBUF_LEN)
    if rc ~= QRPC_OK then
        return nil, "qrpc: init: " .. submit_err(rc, errbuf)
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


local function load_masked(cfg_host, cfg_lib, subsystem)
    local l, where = open_library(cfg_lib)
    if not l then
        return nil, where
    end

    local want = cfg_host
    local rt
    local load_ffi = rawget(ngx, "load_ffi")
    if subsystem == "stream" then
        -- lua-resty-ffi patches ngx_http_lua only: the stream VM uses the
        -- built-in host, whatever the http VM of this worker uses
        want, load_ffi = "builtin", nil
    elseif want == nil then
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
            rt = nil
        end
    end

    -- Both hosts need the built-in host's entry points that never wait
    -- (event and close through qrpc_query, cancel, stats) and its
    -- dispatcher, through which Go's log lines arrive.
    local ok, err = init_runtime(l)
    if not ok then
        return nil, err
    end
    ngx_log(ngx_NOTICE, "qrpc: loaded ", where, " (host ", want, ")",
            subsystem == "stream" and " for the stream subsystem" or "")
    return { lib = l, host = want, where = where, rt = rt }
end


-- load(cfg_host, cfg_lib, subsystem) -> { lib, host, where, rt } | nil, err.
-- cfg_host: "builtin", "resty_ffi" or nil (resty_ffi when ngx.load_ffi
-- exists and loads the library; always builtin in the stream subsystem);
-- cfg_lib: a path, or nil to search; subsystem: ngx.config.subsystem.
function _M.load(cfg_host, cfg_lib, subsystem)
    if get_phase() == "init" then
        return nil, _M.ERR_INIT
    end
    local prev = block_ngx_signals()
    local ok, res, err = pcall(load_masked, cfg_host, cfg_lib, subsystem)
    restore_signals(prev)
    if not ok then
        return nil, "qrpc: loading failed: " .. tostring(res)
    end
    return res, err
end


return _M
