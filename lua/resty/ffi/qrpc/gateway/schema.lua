-- resty.ffi.qrpc.gateway.schema: the messages, enums and services of a
-- gateway's .proto files, as Go describes them (QRPC_OP_PROTO_DESCRIBE),
-- and the field lookups the routes, requests and OpenAPI document share.

local proto = require "resty.ffi.qrpc.proto"
local json = require "resty.ffi.qrpc.json"

local pairs = pairs
local ipairs = ipairs
local tostring = tostring
local str_find = string.find
local str_sub = string.sub
local tab_concat = table.concat

local _M = {}

-- Well-known message types whose JSON form is one scalar: how a path or
-- query value converts.
local WKT_SCALAR = {
    ["google.protobuf.Timestamp"] = "string",
    ["google.protobuf.Duration"] = "string",
    ["google.protobuf.FieldMask"] = "string",
    ["google.protobuf.StringValue"] = "string",
    ["google.protobuf.BytesValue"] = "bytes",
    ["google.protobuf.BoolValue"] = "bool",
    ["google.protobuf.DoubleValue"] = "double",
    ["google.protobuf.FloatValue"] = "float",
    ["google.protobuf.Int32Value"] = "int32",
    ["google.protobuf.UInt32Value"] = "uint32",
    ["google.protobuf.Int64Value"] = "int64",
    ["google.protobuf.UInt64Value"] = "uint64",
}
_M.WKT_SCALAR = WKT_SCALAR

-- index(schema): fields by proto and JSON name
local function index(schema)
    for _, m in pairs(schema.messages) do
        m.by_name = {}
        m.by_json = {}
        for _, f in ipairs(m.fields) do
            m.by_name[f.name] = f
            m.by_json[f.json] = f
        end
    end
end

local function field_of(schema, msg, name)
    local m = schema.messages[msg]
    if not m or not m.by_name then
        return nil
    end
    return m.by_name[name] or m.by_json[name]
end

-- chain(schema, msg, "a.b") -> { field_a, field_b } | nil, err
local function chain(schema, msg, path)
    local out = {}
    local cur = msg
    local start = 1
    while true do
        local dot = str_find(path, ".", start, true)
        local name = str_sub(path, start, dot and dot - 1 or #path)
        local f = field_of(schema, cur, name)
        if not f then
            return nil, "no field " .. name .. " in " .. cur
        end
        out[#out + 1] = f
        if not dot then
            return out
        end
        if f.kind ~= "message" or f.repeated or f.map or WKT_SCALAR[f.type] then
            return nil, name .. " is not a message field"
        end
        cur = f.type
        start = dot + 1
    end
end


-- "a.b" of a chain of fields, by their proto names
local function path_of(ch)
    if #ch == 1 then
        return ch[1].name
    end
    local names = {}
    for i = 1, #ch do
        names[i] = ch[i].name
    end
    return tab_concat(names, ".")
end


_M.field_of = field_of
_M.chain = chain
_M.path_of = path_of

-- value_kind(f): the scalar kind a path or query value converts to; nil
-- for a message field that has no one-scalar JSON form
function _M.value_kind(f)
    if f.kind == "message" then
        return WKT_SCALAR[f.type]
    end
    return f.kind
end

-- load(conf) -> schema, methods ("pkg.Svc.Method" -> method) | nil, err
function _M.load(conf)
    local schema = { services = {}, messages = {}, enums = {} }
    local methods = {}
    for _, file in ipairs(conf.files) do
        local text, err = proto.describe(file, conf.import_paths)
        if not text then
            return nil, err
        end
        local s
        s, err = json.decode(text)
        if not s then
            return nil, "describe " .. file .. ": " .. tostring(err)
        end
        for name, m in pairs(s.messages) do
            schema.messages[name] = m
        end
        for name, e in pairs(s.enums) do
            schema.enums[name] = e
        end
        for _, svc in ipairs(s.services) do
            schema.services[#schema.services + 1] = svc
            for _, m in ipairs(svc.methods) do
                m.service = svc.name
                m.full = svc.name .. "." .. m.name
                m.comment = m.comment or ""
                m.file = file
                methods[m.full] = m
            end
        end
    end
    index(schema)
    return schema, methods
end

return _M
