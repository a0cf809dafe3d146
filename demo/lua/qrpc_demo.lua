-- Helpers of the demo nginx.conf: the certificates and addresses, read
-- once in the master, and small functions that turn results into HTTP.
local qrpc = require "resty.ffi.qrpc"
local json = require "resty.ffi.qrpc.json"

local io_open = io.open
local ngx_say = ngx.say
local ngx_print = ngx.print
local ngx_req = ngx.req
local concat = table.concat
local str_find = string.find
local sort = table.sort
local tostring = tostring
local pairs = pairs
local ipairs = ipairs
local type = type

local _M = { _VERSION = "0.1.0" }

local conf = {}

local function read_file(path)
    local f, err = io_open(path, "rb")
    if not f then
        return nil, err
    end
    local data = f:read("*a")
    f:close()
    return data
end

-- init runs in init_by_lua (the master, usually root): the client key is
-- only readable there. A missing file is an error at startup, not at the
-- first request.
function _M.init(opts)
    local dir = opts.certs_dir
    local ca = assert(read_file(dir .. "/ca.pem"))
    local cert = assert(read_file(dir .. "/client.pem"))
    local key = assert(read_file(dir .. "/client.key"))
    conf.addr = opts.addr
    conf.mtls_addr = opts.mtls_addr
    -- The options tables are built once: connect() caches connections by
    -- address + options, so every request finds the same connection.
    conf.opts = {
        ca = ca, server_name = "localhost", timeout = 3000,
        -- Message types of the protobuf methods: calls then need only the
        -- method name (they are not part of the connection's identity).
        methods = {
            SayHello = { request = "demo.HelloRequest", response = "demo.HelloReply" },
            EchoAllKinds = { request = "demo.AllKinds", response = "demo.AllKinds" },
        },
    }
    if opts.proto then
        assert(qrpc.proto.load(opts.proto))
    end
    conf.mtls_opts = { ca = ca, cert = cert, key = key, server_name = "localhost", timeout = 3000 }
end

-- gateway(protos) runs in init_by_lua too: the REST gateway of
-- demo/proto/greeter_http.proto, on the demo server's connection.
function _M.gateway(protos)
    local gateway = require "resty.ffi.qrpc.gateway"
    _M.gw = assert(gateway.new{
        upstream = conf.addr, opts = conf.opts, protos = protos,
        prefix = "/api", openapi = true,
    })
end

function _M.conn()
    return qrpc.connect(conf.addr, conf.opts)
end

function _M.mtls_conn()
    return qrpc.connect(conf.mtls_addr, conf.mtls_opts)
end

-- fail answers an error string from the library: 504 for a timeout, 400
-- for a request that does not match its protobuf message, 502 for
-- everything else (the upstream is the qrpc server).
function _M.fail(err)
    if err == "timeout" then
        ngx.status = 504
    elseif str_find(err, "bad message: ", 1, true) == 1
           or str_find(err, "bad argument", 1, true) == 1
    then
        ngx.status = 400
    else
        ngx.status = 502
    end
    ngx_say("error: ", err)
end

-- reply_table shows a response whose body was decoded into a Lua table.
function _M.reply_table(res)
    if res.code ~= 0 then
        return _M.reply(res)
    end
    ngx.header["Content-Type"] = "application/json"
    ngx_say(json.encode(res.body))
end

-- reply shows a qrpc response: the body for code 0, "code N: body" with
-- HTTP 500 otherwise.
function _M.reply(res, raw)
    if res.code ~= 0 then
        ngx.status = 500
        ngx_say("code ", res.code, ": ", res.body)
        return
    end
    if raw then
        ngx_print(res.body)
    else
        ngx_say(res.body)
    end
end

function _M.request_body()
    ngx_req.read_body()
    local body = ngx_req.get_body_data()
    if body then
        return body
    end
    local file = ngx_req.get_body_file()
    if file then
        return assert(read_file(file))
    end
    return ""
end

-- format_stats prints conn:stats() as sorted key=value pairs, whatever
-- counters the library reports.
function _M.format_stats(stats)
    if type(stats) ~= "table" then
        return tostring(stats)
    end
    local keys = {}
    for k in pairs(stats) do
        keys[#keys + 1] = k
    end
    sort(keys)
    local out = {}
    for i, k in ipairs(keys) do
        out[i] = k .. "=" .. tostring(stats[k])
    end
    return concat(out, " ")
end

return _M
