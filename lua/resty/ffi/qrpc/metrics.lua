-- Cross-worker metrics: each worker adds its counters' deltas into a
-- lua_shared_dict (from a timer, never on the request path) and sets its
-- gauges under keys of its own; qrpc.metrics() renders the dict's sum.
--
-- A worker's snapshot (made in Go, internal/metrics) is one sample a line:
--   c <series> <value>   a counter, cumulative since the worker started
--   g <series> <value>   a gauge
-- Counters go into the dict as dict:incr(<series>, value - last added, 0);
-- what was added is remembered only when incr succeeds, so a failed flush
-- is made good by the next one. Gauges go in as "g<pid> <series>" with an
-- expiry of a few flush intervals, and are deleted when the worker exits:
-- a worker that is gone stops counting in the gauges (after GAUGE_TTL_S
-- at most, if it died without exiting).

local ffi = require "ffi"
local cdef = require "resty.ffi.qrpc.cdef"

local ffi_new = ffi.new
local ffi_string = ffi.string

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local worker_pid = ngx.worker.pid
local timer_every = ngx.timer.every
local shared = ngx.shared
local type = type
local tostring = tostring
local tonumber = tonumber
local pairs = pairs
local str_gmatch = string.gmatch
local str_format = string.format
local str_byte = string.byte
local tab_concat = table.concat

local _M = { _VERSION = "0.1.0" }

-- How often a worker adds its deltas into the dict, and how long a
-- worker's gauges outlive its last flush.
_M.FLUSH_S = 1
local GAUGE_TTL_S = 5

-- Key of the error a worker met flushing (the dict is full): once set,
-- the dict's sums are incomplete and metrics() says so instead of
-- rendering wrong numbers. It does not start with "qrpc_client", so the
-- renderer skips it.
local ERROR_KEY = "qrpc_metrics_error"

local last = {}        -- counter series -> value this worker has added
local gauge_keys = {}  -- dict keys of this worker's gauges

local lib              -- the loaded library, once init() ran
local dict_name        -- configure{ metrics_dict }, or nil
local flushing         -- the flush timer runs

local ERRBUF_LEN = 512
local OP_METRICS = 9   -- QRPC_OP_METRICS in ffi/qrpc.h
local qcmd = ffi_new(cdef.cmd_t)
local out_p = ffi_new("char *[1]")
local out_len = ffi_new("size_t[1]")
local errbuf = ffi_new("char[?]", ERRBUF_LEN)


-- query asks Go for this worker's metrics: what is "" (text format),
-- "snapshot", or "render" with body (a dump). One synchronous call.
local function query(what, body)
    cdef.fill_cmd(qcmd, OP_METRICS, 0, 0, what, body or "", 0, nil, 0, 0)
    local rc = lib.qrpc_query(qcmd, out_p, out_len, errbuf, ERRBUF_LEN)
    if rc ~= cdef.QRPC_OK then
        return nil, "qrpc: metrics: " .. ffi_string(errbuf)
    end
    local p = out_p[0]
    local text = ffi_string(p, out_len[0])
    lib.qrpc_free(p)
    return text
end

-- flush adds a snapshot to dict. It returns true, or nil and an error
-- (also logged and recorded in the dict) when the dict is full.
function _M.flush(dict, name, snapshot)
    local prefix = "g" .. worker_pid() .. " "
    local failed
    for kind, series, val in str_gmatch(snapshot, "([cg]) ([^\n]*) ([^ \n]+)\n") do
        local v = tonumber(val)
        if v then
            if kind == "c" then
                local delta = v - (last[series] or 0)
                if delta ~= 0 then
                    local newval, err, forcible = dict:incr(series, delta, 0)
                    if not newval then
                        failed = failed or err
                    else
                        last[series] = v
                        if forcible then
                            -- incr made room by evicting other keys:
                            -- some sums are gone for good.
                            failed = failed or "evicted older entries"
                        end
                    end
                end
            else
                local key = prefix .. series
                local ok, err = dict:safe_set(key, v, GAUGE_TTL_S)
                if ok then
                    gauge_keys[key] = true
                else
                    failed = failed or err
                end
            end
        end
    end
    if failed then
        local msg = str_format("qrpc: metrics: lua_shared_dict '%s' is full (%s): "
            .. "its sums are incomplete; enlarge it", name, failed)
        ngx_log(ngx_ERR, msg)
        -- set, not safe_set: recording the failure matters more than
        -- what it may evict now.
        dict:set(ERROR_KEY, msg)
        return nil, msg
    end
    return true
end

-- forget deletes this worker's gauges (at worker exit, after a last flush).
function _M.forget(dict)
    for key in pairs(gauge_keys) do
        dict:delete(key)
    end
    gauge_keys = {}
end

-- dump returns the dict's contents as "key value" lines for the renderer,
-- or nil and an error when a flush failed.
function _M.dump(dict)
    local failed = dict:get(ERROR_KEY)
    if failed then
        return nil, failed
    end
    local keys = dict:get_keys(0)
    local buf = {}
    local n = 0
    for i = 1, #keys do
        local k = keys[i]
        local v = dict:get(k)
        -- "q"(qrpc_client_...) or "g"(g<pid> ...): ours; skip the rest.
        local b = str_byte(k, 1)
        if type(v) == "number" and (b == 113 or b == 103) then
            n = n + 1
            buf[n] = k .. " " .. str_format("%.17g", v)
        end
    end
    n = n + 1
    buf[n] = ""
    return tab_concat(buf, "\n")
end

-- flush_timer runs every FLUSH_S; at worker exit (premature) it flushes
-- once more and removes this worker's gauges.
local function flush_timer(premature)
    local name = dict_name
    local dict = name and shared[name]
    if not dict then
        return
    end
    local snap, err = query("snapshot")
    if snap then
        _M.flush(dict, name, snap)
    else
        ngx_log(ngx_ERR, err)
    end
    if premature then
        _M.forget(dict)
    end
end


local function start_flushing()
    if flushing or not lib or not dict_name then
        return true
    end
    local ok, err = timer_every(_M.FLUSH_S, flush_timer)
    if not ok then
        err = "qrpc: metrics: cannot start the flush timer: " .. tostring(err)
        ngx_log(ngx_ERR, err)
        return nil, err
    end
    flushing = true
    return true
end


-- init is called when the library has loaded in this worker.
function _M.init(l)
    lib = l
    return start_flushing()
end


-- set_dict checks and keeps configure{ metrics_dict = name }. It returns
-- true, or nil and an error message (also logged) when there is no such
-- lua_shared_dict.
function _M.set_dict(name)
    if not shared[name] then
        local err = "metrics_dict: no lua_shared_dict named '" .. name .. "'"
        ngx_log(ngx_ERR, "qrpc: ", err)
        return nil, err
    end
    dict_name = name
    return start_flushing()
end


-- text returns what qrpc.metrics() returns: the sum over workers from the
-- dict, or this worker's figures without one.
function _M.text()
    if not dict_name then
        return query("")
    end
    local dict = shared[dict_name]
    if not dict then
        return nil, "qrpc: metrics: no lua_shared_dict named '" .. dict_name .. "'"
    end
    local dump, err = _M.dump(dict)
    if not dump then
        return nil, err
    end
    return query("render", dump)
end

return _M
