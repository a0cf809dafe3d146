-- resty.ffi.qrpc.gateway.errors: the gateway's error answers: their JSON
-- shape ({"code", "message", "details"}), the HTTP status of a qrpc
-- error string, and the code -> status tables.

local json = require "resty.ffi.qrpc.json"
local utf8 = require "resty.ffi.qrpc.gateway.utf8"

local ngx = ngx
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN

local pairs = pairs
local tostring = tostring
local str_find = string.find

local json_encode = json.encode
local utf8_clean = utf8.clean

local _M = {}

-- gRPC's code -> HTTP status table (codes = "grpc"), as grpc-gateway and
-- Envoy's transcoder use it.
local GRPC_CODES = {
    [0] = 200, [1] = 499, [2] = 500, [3] = 400, [4] = 504, [5] = 404,
    [6] = 409, [7] = 403, [8] = 429, [9] = 400, [10] = 409, [11] = 400,
    [12] = 501, [13] = 500, [14] = 503, [15] = 500, [16] = 401,
}

-- The gRPC code in the error body of the gateway's own answers.
local STATUS_CODE = {
    [400] = 3, [404] = 5, [405] = 12, [406] = 3, [413] = 8, [415] = 3,
    [500] = 13, [502] = 14, [503] = 14, [504] = 4,
}

_M.GRPC_CODES = GRPC_CODES

local function write_error(status, code, msg, extra)
    ngx.status = status
    ngx_header["Content-Type"] = "application/json"
    if extra then
        for k, v in pairs(extra) do
            ngx_header[k] = v
        end
    end
    -- a message quotes what the client sent (a query value, a path), whose
    -- bytes need not be UTF-8; the error body must be UTF-8 JSON
    ngx_print('{"code":', code, ',"message":', json_encode(utf8_clean(tostring(msg))),
              ',"details":[]}\n')
    return status
end

local function fail(status, msg, extra)
    return write_error(status, STATUS_CODE[status] or 2, msg, extra)
end

_M.write_error = write_error
_M.fail = fail

local function error_of(err)
    if str_find(err, "^timeout") then
        return 504
    elseif str_find(err, "^connection lost") then
        return 502
    elseif str_find(err, "^unavailable") or str_find(err, "^connect")
           or str_find(err, "^queue full")
    then
        return 503
    elseif str_find(err, "^connection lost") or str_find(err, "^closed") then
        return 502
    elseif str_find(err, "^bad message") then
        return 400
    elseif str_find(err, "^bad response") then
        return 502
    elseif str_find(err, "^too large")
           or str_find(err, "^bad argument #3: body too large")
    then
        -- the message does not fit the connection's max_frame_size
        -- (refused in Lua when the body alone is over it)
        return 413
    end
    return 500
end

local function upstream_error(gw, err, route)
    local status = error_of(err)
    if status == 400 or status == 413 then
        return fail(status, err)
    end
    if status == 500 then
        ngx_log(ngx_ERR, "qrpc gateway: ", route and route.label or "", ": ", err)
    else
        ngx_log(ngx_WARN, "qrpc gateway: ", route and route.label or "", ": ", err)
    end
    if status == 503 then
        return fail(503, err, { ["Retry-After"] = tostring(gw.conf.retry_after) })
    end
    if status == 502 and str_find(err, "^bad response") then
        return write_error(502, 13, err)
    end
    return fail(status, err)
end
_M.upstream_error = upstream_error

return _M
