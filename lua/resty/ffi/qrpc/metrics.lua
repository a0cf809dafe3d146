-- Cross-worker metrics: each worker adds its counters' deltas into a
-- lua_shared_dict (from a timer, never on the request path) and sets its
-- gauges under keys of its own; qrpc.metrics() renders the dict's sum.
--
-- A worker's snapshot (made in Go, internal/metrics) is a record block
-- (resty.ffi.qrpc.wire), one sample a pair of records: SAMPLE_SERIES,
-- then SAMPLE_COUNTER (cumulative since the worker started) or
-- SAMPLE_GAUGE.
-- Counters go into the dict as value - last added (incr, or safe_add for a
-- new key: nothing is ever evicted); what was added is remembered only
-- when that succeeds, so a failed flush is made good by the next one.
-- Gauges go in as "g<pid> <series>" with an expiry of a few flush
-- intervals, and are deleted when the worker exits: a worker that is gone
-- stops counting in the gauges (after GAUGE_TTL_S at most, if it died
-- without exiting).

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"
local wire = require "resty.ffi.qrpc.wire"

local K = wire.keys
local K_SERIES = K.SAMPLE_SERIES
local K_COUNTER = K.SAMPLE_COUNTER
local K_GAUGE = K.SAMPLE_GAUGE
local wire_new = wire.new
local wire_put = wire.put
local wire_decode = wire.decode

local ffi_new = ffi.new
local ffi_string = ffi.string

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local worker_pid = ngx.worker.pid
local timer_every = ngx.timer.every
local ngx_sleep = ngx.sleep
local shared = ngx.shared
local type = type
local tostring = tostring
local pairs = pairs
local str_format = string.format
local str_byte = string.byte
local str_find = string.find
local str_sub = string.sub
local tbl_concat = table.concat

local _M = { _VERSION = "0.1.0" }

-- utf8_len: the length of the valid UTF-8 sequence that starts at byte i
-- of s, 0 when none does (the rules of Go's unicode/utf8: no overlong
-- forms, no surrogates, nothing above U+10FFFF).
local function utf8_len(s, i)
    local c, c2, c3, c4 = str_byte(s, i, i + 3)
    if c < 0x80 then
        return 1
    end
    local lo, hi = 0x80, 0xBF
    if c < 0xC2 then
        return 0
    elseif c < 0xE0 then
        return (c2 and c2 >= 0x80 and c2 <= 0xBF) and 2 or 0
    elseif c < 0xF0 then
        if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
        return (c2 and c2 >= lo and c2 <= hi and c3 and c3 >= 0x80 and c3 <= 0xBF) and 3 or 0
    elseif c < 0xF5 then
        if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
        return (c2 and c2 >= lo and c2 <= hi and c3 and c3 >= 0x80 and c3 <= 0xBF
                and c4 and c4 >= 0x80 and c4 <= 0xBF) and 4 or 0
    end
    return 0
end

-- MAX_LABEL: bytes of a method name kept as a label value (maxLabelLen in
-- internal/metrics).
local MAX_LABEL = 128

-- method_label(name): the label value of a method name, as Go's
-- metrics.MethodLabel makes it for the series it records, so that the
-- Lua-side series (qrpc_client_deadline_expired_total) keep the same
-- bounds and the exposition stays valid UTF-8: each run of invalid bytes
-- becomes one U+FFFD, then the name is cut to MAX_LABEL bytes, never
-- within a character. TestMethodLabelLuaMatchesGo compares the two.
function _M.method_label(name)
    if str_find(name, "[\128-\255]") then
        local out, n, i, len = {}, 0, 1, #name
        local bad = false
        while i <= len do
            local l = utf8_len(name, i)
            if l == 0 then
                if not bad then
                    n = n + 1
                    out[n] = "\239\191\189" -- U+FFFD
                    bad = true
                end
                i = i + 1
            else
                n = n + 1
                out[n] = str_sub(name, i, i + l - 1)
                bad = false
                i = i + l
            end
        end
        name = tbl_concat(out, "", 1, n)
    end
    if #name > MAX_LABEL then
        local j = MAX_LABEL
        -- Back to the start of the character that the cut would split.
        while j > 0 do
            local c = str_byte(name, j + 1)
            if c < 0x80 or c >= 0xC0 then
                break
            end
            j = j - 1
        end
        name = str_sub(name, 1, j)
    end
    return name
end

-- How often a worker adds its deltas into the dict, and how long a
-- worker's gauges outlive its last flush.
_M.FLUSH_S = 1
local GAUGE_TTL_S = 5

-- The dict's health: a number, 0 while every flush has gone in whole,
-- more once one did not (the dict was full). Created when the dict is
-- configured and never evicted (nothing here evicts: new keys go in with
-- safe_add/safe_set), so a missing marker also means trouble: the dict
-- was full from the start, or flushed by someone else. metrics() then
-- reports the error instead of rendering incomplete sums. The key does
-- not start with "qrpc_client", so the renderer skips it.
local ERROR_KEY = "qrpc_metrics_error"
local failed_once      -- this worker has met a full dict

local last = {}        -- counter series -> value this worker has added
local gauge_keys = {}  -- dict keys of this worker's gauges

local sources = {}     -- add_source: Lua-side counters (the REST gateway)
local lib              -- the loaded library, once init() ran
local dict_name        -- configure{ metrics_dict }, or nil
local flushing         -- the flush timer runs
local host             -- resty.ffi.qrpc.host_builtin, once init() ran

local ERRBUF_LEN = abi.ERRBUF_LEN
local OP_METRICS = abi.OP_METRICS


-- add_source(t): t is a table of Lua-side counters of this worker,
-- series -> cumulative value (e.g. the REST gateway's); they go into
-- qrpc.metrics() with Go's. Series must be of a family internal/metrics
-- renders (internal/metrics/families.go).
function _M.add_source(t)
    sources[#sources + 1] = t
end

-- extra: the sources' counters as snapshot records.
local function extra()
    if #sources == 0 then
        return ""
    end
    local b = wire_new()
    for i = 1, #sources do
        for series, v in pairs(sources[i]) do
            wire_put(b, K_SERIES, series)
            wire_put(b, K_COUNTER, v)
        end
    end
    return b:tostring()
end

-- query asks Go for this worker's metrics: what is "" (text format),
-- "snapshot", or "render" with body (a dump). One synchronous call.
local function query(what, body)
    local cmd = abi.fill_cmd(ffi_new(abi.cmd_t), { op = OP_METRICS,
                                                   method = what, body = body })
    local out_p = ffi_new("char *[1]")
    local out_len = ffi_new("size_t[1]")
    local errbuf = abi.new_errbuf()
    local rc = lib.qrpc_query(cmd, out_p, out_len, errbuf, ERRBUF_LEN)
    if rc ~= abi.QRPC_OK then
        return nil, "qrpc: metrics: " .. ffi_string(errbuf)
    end
    local p = out_p[0]
    local text = ffi_string(p, out_len[0])
    lib.qrpc_release(p)
    return text
end

-- add adds delta to a counter key without ever evicting anything: incr
-- for a key that exists, safe_add for a new one.
local function add(dict, key, delta)
    local newval, err = dict:incr(key, delta)
    if newval then
        return true
    end
    if err ~= "not found" then
        return nil, err
    end
    local ok
    ok, err = dict:safe_add(key, delta)
    if ok then
        return true
    end
    if err == "exists" then -- another worker added it meanwhile
        newval, err = dict:incr(key, delta)
        return newval and true, err
    end
    return nil, err
end

local function full_msg(name, why)
    return str_format("qrpc: metrics: lua_shared_dict '%s' is full (%s): "
                      .. "its sums are incomplete; enlarge it", name, why)
end

-- mark makes sure the health marker exists (see ERROR_KEY); with failed,
-- it records a failure in it.
local function mark(dict, failed)
    if failed then
        failed_once = true
        if dict:incr(ERROR_KEY, 1) then
            return
        end
    end
    if dict:get(ERROR_KEY) == nil then
        dict:safe_add(ERROR_KEY, failed_once and 1 or 0)
    end
end

-- flush adds a snapshot to dict. It returns true, or nil and an error
-- (also logged and recorded in the dict) when the dict is full. Counters
-- that did not go in are retried by the next flush.
function _M.flush(dict, name, snapshot)
    local prefix = "g" .. worker_pid() .. " "
    local failed
    local ks, vs, nrec = wire_decode(snapshot)
    if not ks then
        ngx_log(ngx_ERR, "qrpc: metrics: a snapshot that does not decode: ",
                vs)
        return nil, vs
    end
    for r = 2, nrec, 2 do
        local series, v, kind = vs[r - 1], vs[r], ks[r]
        if ks[r - 1] == K_SERIES and type(v) == "number" then
            if kind == K_COUNTER then
                local before = last[series]
                local delta = v - (before or 0)
                -- a new series goes in even at 0, so that every result
                -- is listed, as in a single worker's figures
                if delta ~= 0 or before == nil then
                    local ok, err = add(dict, series, delta)
                    if ok then
                        last[series] = v
                    else
                        failed = failed or err
                    end
                end
            elseif kind == K_GAUGE then
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
    mark(dict, failed)
    if failed then
        local msg = full_msg(name, failed)
        ngx_log(ngx_ERR, msg)
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

-- dump returns the dict's contents as records for the renderer,
-- or nil and an error when a flush failed.
function _M.dump(dict, name)
    local health = dict:get(ERROR_KEY)
    if health == nil then
        mark(dict)
        health = dict:get(ERROR_KEY)
    end
    if health == nil then
        return nil, full_msg(name, "no room for its marker")
    end
    if health ~= 0 then
        return nil, full_msg(name, "see error.log")
    end
    local keys = dict:get_keys(0)
    local buf = wire_new()
    for i = 1, #keys do
        local k = keys[i]
        local v = dict:get(k)
        -- "q"(qrpc_client_...) or "g"(g<pid> ...): ours; skip the rest.
        local b = str_byte(k, 1)
        if type(v) == "number" and (b == 113 or b == 103) then
            wire_put(buf, K_SERIES, k)
            wire_put(buf, K_COUNTER, v)
        end
    end
    return buf:tostring()
end

-- flush_now adds this worker's figures into the dict; with final, it then
-- removes this worker's gauges (the worker is about to be gone).
local function flush_now(final)
    local name = dict_name
    local dict = name and shared[name]
    if not dict then
        return
    end
    local snap, err = query("snapshot")
    if snap then
        _M.flush(dict, name, snap .. extra())
    else
        ngx_log(ngx_ERR, err)
    end
    if final then
        _M.forget(dict)
    end
end

-- Calls in flight in this worker's Go runtime: both Lua VMs' (a stream
-- {} server's calls are counted in http {}'s dict), whichever host.
local function worker_inflight()
    local s = host and host.stats(0)
    return s and s.inflight or 0
end

-- flush_timer runs every FLUSH_S. At worker exit nginx runs it once more,
-- premature, as the graceful shutdown starts; while the worker's calls
-- are still in flight it goes on flushing every FLUSH_S (its sleeps keep
-- the worker alive, as the dispatchers do for their own calls), so the
-- calls that end meanwhile are added and the worker's gauges stay in the
-- sum; the last flush removes them. worker_shutdown_timeout, which ends
-- the worker, ends this too; the count bounds it besides.
local function flush_timer(premature)
    if not premature then
        return flush_now(false)
    end
    for _ = 1, _M.MAX_DRAIN_FLUSHES do
        if worker_inflight() == 0 then
            break
        end
        flush_now(false)
        ngx_sleep(_M.FLUSH_S)
    end
    flush_now(true)
    _M.exit_flushed = true
end

-- after_exit_call: a call, event or gateway request of this VM ended
-- after the exit's last flush (a request still running, whose next call
-- started once none was in flight): what it counted goes in now, the
-- gauges removed again. The calls of the other subsystem's VM after that
-- moment are not added.
function _M.after_exit_call()
    flush_now(true)
end
_M.MAX_DRAIN_FLUSHES = 3600


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


-- init is called when the library has loaded in this worker; h is the
-- built-in host (its stats of the worker's runtime).
function _M.init(l, h)
    lib = l
    host = h
    return start_flushing()
end


-- set_dict checks and keeps configure{ metrics_dict = name }. It returns
-- true, or nil and an error message (also logged) when there is no such
-- lua_shared_dict.
function _M.set_dict(name)
    if not shared[name] then
        local err = "metrics_dict: no lua_shared_dict named '"
                    .. require("resty.ffi.qrpc.abi").show(name) .. "'"
        ngx_log(ngx_ERR, "qrpc: ", err)
        return nil, err
    end
    dict_name = name
    mark(shared[name])
    return start_flushing()
end


-- text returns what qrpc.metrics() returns: the sum over workers from the
-- dict, or this worker's figures without one.
function _M.text()
    if not dict_name then
        if #sources == 0 then
            return query("")
        end
        local snap, err = query("snapshot")
        if not snap then
            return nil, err
        end
        return query("render", snap .. extra())
    end
    local dict = shared[dict_name]
    if not dict then
        return nil, "qrpc: metrics: no lua_shared_dict named '" .. dict_name .. "'"
    end
    local dump, err = _M.dump(dict, dict_name)
    if not dump then
        return nil, err
    end
    return query("render", dump)
end

return _M
