-- resty.ffi.qrpc.gateway.metrics: the gateway's request metrics by route
-- template, method and status, and their duration histogram: a source
-- resty.ffi.qrpc.metrics adds to the worker's snapshot (qrpc.metrics()).

local metrics = require "resty.ffi.qrpc.metrics"
local ffi = require "ffi"

local pcall = pcall
local tonumber = tonumber
local str_gsub = string.gsub

local _M = {}

-- Metrics: per worker, series -> cumulative value, added to qrpc.metrics()
-- (resty.ffi.qrpc.metrics' add_source). route is the template, never the
-- raw path: the label set is bounded by the routes (and "none" for a
-- request that matched none).
local counters = {}
metrics.add_source(counters)
local BOUNDS = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local LE = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
             "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
             "10" }
local series_of = {} -- route label -> its histogram's series names

local function label(s)
    return (str_gsub(s, '[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function record(route, method, status, secs)
    local r = route and route.label or "none"
    local ser = series_of[r]
    if not ser then
        local l = 'route="' .. label(r) .. '"'
        ser = { l = l, b = {}, sum = "qrpc_gateway_request_duration_seconds_sum{" .. l .. "}",
                count = "qrpc_gateway_request_duration_seconds_count{" .. l .. "}",
                inf = "qrpc_gateway_request_duration_seconds_bucket{" .. l .. ',le="+Inf"}' }
        for i = 1, #LE do
            ser.b[i] = "qrpc_gateway_request_duration_seconds_bucket{" .. l .. ',le="'
                       .. LE[i] .. '"}'
        end
        series_of[r] = ser
    end
    local key = "qrpc_gateway_requests_total{" .. ser.l .. ',method="' .. label(method)
                .. '",status="' .. status .. '"}'
    counters[key] = (counters[key] or 0) + 1
    for i = #BOUNDS, 1, -1 do
        if secs > BOUNDS[i] then
            break
        end
        local b = ser.b[i]
        counters[b] = (counters[b] or 0) + 1
    end
    counters[ser.inf] = (counters[ser.inf] or 0) + 1
    counters[ser.count] = (counters[ser.count] or 0) + 1
    counters[ser.sum] = (counters[ser.sum] or 0) + secs
    if metrics.exit_flushed then
        -- after the exiting worker's last flush (resty.ffi.qrpc.metrics)
        metrics.after_exit_call()
    end
end


-- The durations come from CLOCK_MONOTONIC (ngx.now() has millisecond
-- steps, coarser than the histogram's first buckets). Declared under
-- pcall: another module may have declared them already.
pcall(ffi.cdef, "struct timespec { long tv_sec; long tv_nsec; };")
pcall(ffi.cdef, "int clock_gettime(int clk_id, struct timespec *tp);")
local C = ffi.C
local ts = ffi.new("struct timespec")
local CLOCK_MONOTONIC = 1

local function mono()
    C.clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end


_M.record = record
_M.mono = mono

return _M
