-- A stand-in for lua-resty-ffi's ngx.load_ffi, for the integration tests
-- only (see fake_resty_ffi.c). It keeps lua-resty-ffi's contract:
-- ngx.load_ffi(lib, cfg) dlopen()s lib, calls libffi_init(cfg, tq) and
-- returns a runtime whose runtime:anyname(req) yields until the task is
-- answered, then returns true, rsp (rc 0) or false, rc, rsp. lua-resty-ffi
-- resumes the coroutine from its own event; this one polls every ms.
local ffi = require "ffi"

ffi.cdef[[
void *fake_tq_new(void);
void *fake_task_post(void *tq, const char *req, int len);
void fake_tq_finish(void *tq);
int fake_task_done(void *t);
int fake_task_rc(void *t);
int fake_task_responds(void *t);
char *fake_task_rsp(void *t, int *len);
void fake_task_free(void *t);
int libffi_init(char *cfg, void *tq);
]]

local _M = { tasks = 0, bad_answers = 0 }
local shim
local runtimes = {}
local lenp = ffi.new("int[1]")

local function call(self, req)
    local t = shim.fake_task_post(self.tq, req, #req)
    _M.tasks = _M.tasks + 1
    while shim.fake_task_done(t) == 0 do
        ngx.sleep(0.001) -- the stand-in polls its task as lua-resty-ffi's C side would wake it
    end
    local rc = shim.fake_task_rc(t)
    local p = shim.fake_task_rsp(t, lenp)
    local rsp = p ~= nil and ffi.string(p, lenp[0]) or nil
    ngx.sleep(0) -- a yield, not a wait: a late second answer would show up now
    if shim.fake_task_responds(t) ~= 1 then
        _M.bad_answers = _M.bad_answers + 1
    end
    shim.fake_task_free(t)
    if rc == 0 then
        return true, rsp
    end
    return false, rc, rsp
end

local mt = { __index = function() return call end }

function _M.install(shim_path)
    ngx.load_ffi = function(lib, cfg) -- luacheck: ignore 142
        if not shim then
            shim = ffi.load(shim_path, true) -- global: libffi_qrpc.so dlsym()s it
        end
        local key = lib .. "&" .. tostring(cfg)
        if runtimes[key] then
            return runtimes[key]
        end
        local h = ffi.load(lib)
        local tq = shim.fake_tq_new()
        local buf
        if cfg then
            buf = ffi.new("char[?]", #cfg + 1, cfg)
        end
        local rc = h.libffi_init(buf, tq)
        if rc ~= 0 then
            return nil, rc
        end
        local r = setmetatable({ tq = tq, h = h }, mt)
        runtimes[key] = r
        return r
    end
end

function _M.unload_all()
    for k, r in pairs(runtimes) do
        shim.fake_tq_finish(r.tq)
        runtimes[k] = nil
    end
end

return _M
