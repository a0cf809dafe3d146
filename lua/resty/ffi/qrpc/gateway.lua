-- resty.ffi.qrpc.gateway: a REST/JSON gateway in front of qrpc services,
-- built from the google.api.http options of .proto files (and routes
-- given by hand). See docs/gateway.md.
--
--   local gw, err = gateway.new{ upstream = ..., opts = ..., protos = {...}, ... }
--   gw:serve()          -- content_by_lua, under one location
--   gw:openapi()        -- the OpenAPI 3.1 document, as a Lua table
--
-- Go describes each .proto file once per worker (QRPC_OP_PROTO_DESCRIBE:
-- services, HTTP rules, messages); route matching, the request message
-- (JSON text in the proto3 JSON mapping) and the answer are Lua's. Calls go
-- through qrpc.connect, so pools, retries, hedging and metrics apply.
--
-- The module family, one concern a file (resty.ffi.qrpc.gateway.*):
--   config    the options of gateway.new, checked
--   schema    the messages and services Go describes, field lookups
--   routes    path templates; the route table; matching a request
--   request   the qrpc message and headers of an HTTP request
--   params    the fields from URL arguments (path, query string, forms)
--   body      the request body and its Content-Type
--   mask      the update_mask a PATCH body implies (patch_update_mask)
--   httpbody  google.api.HttpBody: raw bodies both ways
--   response  the answer from the qrpc result
--   errors    the error answers and the status of a qrpc error
--   vars      the access-log variables ($qrpc_method, ...)
--   metrics   the request metrics source of qrpc.metrics()
--   openapi   the OpenAPI 3.1 document

local qrpc = require "resty.ffi.qrpc"
local json = require "resty.ffi.qrpc.json"
local proto = require "resty.ffi.qrpc.proto"
local config = require "resty.ffi.qrpc.gateway.config"
local routes = require "resty.ffi.qrpc.gateway.routes"
local request = require "resty.ffi.qrpc.gateway.request"
local response = require "resty.ffi.qrpc.gateway.response"
local errors = require "resty.ffi.qrpc.gateway.errors"
local vars = require "resty.ffi.qrpc.gateway.vars"
local gw_metrics = require "resty.ffi.qrpc.gateway.metrics"
local openapi = require "resty.ffi.qrpc.gateway.openapi"

local ngx = ngx
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_print = ngx.print
local get_phase = ngx.get_phase
local get_method = ngx.req.get_method

local type = type
local pairs = pairs
local ipairs = ipairs
local setmetatable = setmetatable
local getmetatable = getmetatable
local str_byte = string.byte
local str_find = string.find
local str_sub = string.sub
local str_match = string.match
local tonumber = tonumber
local ceil = math.ceil
local tab_concat = table.concat
local tab_sort = table.sort

local json_encode = json.encode
local ensure = routes.ensure
local find = routes.find
local fail = errors.fail
local upstream_error = errors.upstream_error
local record = gw_metrics.record
local mono = gw_metrics.mono

local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }


function _M.new(c)
    local conf, err = config.check(c)
    if not conf then
        return nil, err
    end
    for _, f in ipairs(conf.files) do
        local lok, lerr = proto.load(f, #conf.import_paths > 0
                                        and { import_paths = conf.import_paths } or nil)
        if not lok then
            return nil, lerr
        end
    end
    local gw = setmetatable({ conf = conf }, mt)
    if get_phase() ~= "init" then
        -- in a worker: the schema at once, so that its errors come back here
        local bok, berr = routes.build(gw)
        if not bok then
            return nil, berr
        end
    end
    return gw
end


-- gw:openapi(): the OpenAPI 3.1 document, as a Lua table
function _M.openapi(self)
    local ok, err = ensure(self)
    if not ok then
        return nil, err
    end
    return openapi.document(self)
end

function _M.openapi_json(self)
    if not self.openapi_text then
        local doc, err = self:openapi()
        if not doc then
            return nil, err
        end
        self.openapi_text = json_encode(doc)
    end
    return self.openapi_text
end


-- Grpc-Timeout: at most 8 digits and a unit (gRPC over HTTP/2)
local TIMEOUT_UNITS = { H = 3600000, M = 60000, S = 1000, m = 1, u = 0.001, n = 0.000001 }

local function grpc_timeout_ms(v)
    if type(v) ~= "string" then
        return nil
    end
    local digits, unit = str_match(v, "^(%d%d?%d?%d?%d?%d?%d?%d?)([HMSmun])$")
    if not digits then
        return nil
    end
    return tonumber(digits) * TIMEOUT_UNITS[unit]
end

local function serve(self)
    local ok, err = ensure(self)
    if not ok then
        return fail(500, "gateway not ready: " .. err)
    end
    local conf = self.conf
    local uri = ngx_var.request_uri
    local q = str_find(uri, "?", 1, true)
    local path = q and str_sub(uri, 1, q - 1) or uri
    local prefix = conf.prefix
    if prefix ~= "" then
        if str_sub(path, 1, #prefix) ~= prefix then
            return fail(404, "no route for " .. path)
        end
        path = str_sub(path, #prefix + 1)
        if path == "" then
            path = "/"
        elseif str_byte(path, 1) ~= 47 then
            return fail(404, "no route for " .. prefix .. path)
        end
    end
    local method = get_method()
    if conf.openapi and path == "/openapi.json" then
        if method ~= "GET" and method ~= "HEAD" then
            return fail(405, "method " .. method .. " not allowed", { Allow = "GET, HEAD" })
        end
        local text, oerr = self:openapi_json()
        if not text then
            return fail(500, oerr)
        end
        ngx_header["Content-Type"] = "application/json"
        ngx_print(text)
        return 200
    end

    local route, segs, n, last = find(self, method, path)
    local form_get
    if not route and segs and segs.GET and method == "POST" and conf.form_body
       and ngx_var.content_type == "application/x-www-form-urlencoded"
    then
        -- grpc-gateway's path length fallback: a form POST to a path that
        -- has a GET route and no POST one is that GET, with the form's
        -- fields as query parameters (for URLs too long for a GET)
        local r2, s2, n2, l2 = find(self, "GET", path)
        if r2 then
            route, segs, n, last, form_get = r2, s2, n2, l2, true
        end
    end
    if not route then
        if segs then
            local allow = {}
            for v in pairs(segs) do
                allow[#allow + 1] = v
            end
            tab_sort(allow)
            return fail(405, "method " .. method .. " not allowed for " .. prefix .. path,
                        { Allow = tab_concat(allow, ", ") })
        end
        return fail(404, "no route for " .. method .. " " .. prefix .. path)
    end
    vars.route(route)

    local want_pb, status, perr = response.protobuf(route)
    if want_pb == nil then
        return fail(status, perr), route
    end
    local text, merr
    text, status, merr = request.message(self, route, segs, n, last, form_get)
    if not text then
        return fail(status, merr), route
    end
    -- the request's protobuf bytes already (a raw google.api.HttpBody)
    local pb_in = status == true

    -- a Grpc-Timeout caps the call's deadline and travels to the server
    local headers = request.headers(conf)
    local timeout
    local gt = ngx_var.http_grpc_timeout
    if gt then
        local ms = grpc_timeout_ms(gt)
        if not ms then
            return fail(400, "invalid grpc-timeout: " .. gt), route
        end
        if ms < conf.timeout then
            timeout = ms
            if ms <= 0 then
                return fail(504, "timeout"), route
            end
        end
        headers = headers or {}
        headers["grpc-timeout"] = ceil(timeout or conf.timeout) .. "m"
    end

    local conn, cerr = qrpc.connect(conf.upstream, conf.opts)
    if not conn then
        return upstream_error(self, cerr, route), route
    end
    local res, uerr, info = conn:unary(route.method, text, {
        request = not pb_in and route.input or nil,
        -- an HttpBody answer's bytes are read in Lua (httpbody.lua)
        response = not want_pb and not route.raw_out and route.output or nil,
        json = true,
        discard_unknown = conf.discard_unknown or nil,
        proto_names = conf.proto_names or nil,
        emit_unpopulated = conf.emit_unpopulated or nil,
        headers = headers,
        timeout = timeout,
    })
    vars.attempts(res or info.res, info)
    if not res then
        return upstream_error(self, uerr, route), route
    end
    return response.write(self, route, res, want_pb), route
end


-- gw:serve(): answers this request (content phase).
function _M.serve(self)
    if type(self) ~= "table" or getmetatable(self) ~= mt then
        return nil, "bad argument #1: a gateway is expected (use gw:serve(), not gw.serve())"
    end
    local t0 = mono()
    local status, route = serve(self)
    record(route, get_method(), status or ngx.status, mono() - t0)
    return status
end

return _M
