-- resty.ffi.qrpc.gateway.openapi: the OpenAPI 3.1 document of a gateway's
-- routes (gw:openapi()), built from the schema Go describes.

local json = require "resty.ffi.qrpc.json"
local schema_mod = require "resty.ffi.qrpc.gateway.schema"
local routes = require "resty.ffi.qrpc.gateway.routes"

local type = type
local pairs = pairs
local ipairs = ipairs
local str_gsub = string.gsub
local tab_concat = table.concat

local empty_array = json.empty_array
local WKT_SCALAR = schema_mod.WKT_SCALAR
local value_kind = schema_mod.value_kind
local STAR, DSTAR = routes.STAR, routes.DSTAR

local _M = {}

local function scalar_schema(kind)
    if kind == "int32" or kind == "sint32" or kind == "sfixed32" then
        return { type = "integer", format = "int32" }
    elseif kind == "uint32" or kind == "fixed32" then
        return { type = "integer", format = "int64", minimum = 0, maximum = 4294967295 }
    elseif kind == "int64" or kind == "sint64" or kind == "sfixed64" then
        return { type = "string", format = "int64", pattern = "^-?[0-9]+$" }
    elseif kind == "uint64" or kind == "fixed64" then
        return { type = "string", format = "uint64", pattern = "^[0-9]+$" }
    elseif kind == "double" then
        return { type = "number", format = "double" }
    elseif kind == "float" then
        return { type = "number", format = "float" }
    elseif kind == "bool" then
        return { type = "boolean" }
    elseif kind == "bytes" then
        return { type = "string", contentEncoding = "base64" }
    end
    return { type = "string" }
end

local WKT_SCHEMA = {
    ["google.protobuf.Timestamp"] = { type = "string", format = "date-time" },
    ["google.protobuf.Duration"] = { type = "string", pattern = "^-?[0-9]+(\\.[0-9]+)?s$" },
    ["google.protobuf.FieldMask"] = { type = "string" },
    ["google.protobuf.Empty"] = { type = "object" },
    ["google.protobuf.Struct"] = { type = "object", additionalProperties = true },
    ["google.protobuf.Value"] = {},
    ["google.protobuf.ListValue"] = { type = "array", items = {} },
    ["google.protobuf.Any"] = {
        type = "object", required = { "@type" }, additionalProperties = true,
        properties = { ["@type"] = { type = "string" } },
    },
}

-- A google.api.HttpBody request or answer: raw bytes of any media type
-- (the HttpBody's content_type, known only when it comes).
local function binary()
    return { ["*/*"] = { schema = { type = "string", format = "binary" } } }
end

local function ref(name)
    return { ["$ref"] = "#/components/schemas/" .. name }
end

local function field_schema(f, need)
    local s
    if f.kind == "message" then
        need[f.type] = true
        s = ref(f.type)
    elseif f.kind == "enum" then
        need[f.type] = true
        s = ref(f.type)
    else
        s = scalar_schema(f.kind)
    end
    if f.map then
        s = { type = "object", additionalProperties = s }
    elseif f.repeated then
        s = { type = "array", items = s }
    end
    if f.comment and f.comment ~= "" then
        s.description = f.comment
    end
    return s
end

local function message_schema(gw, name, need)
    if WKT_SCHEMA[name] then
        return WKT_SCHEMA[name]
    end
    local w = WKT_SCALAR[name]
    if w then
        local s = scalar_schema(w)
        return { anyOf = { s, { type = "null" } } }
    end
    local m = gw.schema.messages[name]
    local props = {}
    for _, f in ipairs(m.fields) do
        props[gw.conf.proto_names and f.name or f.json] = field_schema(f, need)
    end
    local s = { type = "object", properties = props }
    if m.comment and m.comment ~= "" then
        s.description = m.comment
    end
    return s
end

-- query parameters of a message's fields, flattened (a.b), skipping bound
local function query_params(gw, msg, prefix, bound, out, depth, seen)
    local m = gw.schema.messages[msg]
    if not m or depth > 3 or seen[msg] then
        return
    end
    seen[msg] = true
    for _, f in ipairs(m.fields) do
        local name = prefix .. f.name
        if not (prefix == "" and bound[f.name]) and not f.map then
            local kind = value_kind(f)
            if kind then
                local s
                if f.kind == "enum" then
                    local e = gw.schema.enums[f.type]
                    s = { type = "string", enum = e and e.values or empty_array }
                else
                    s = scalar_schema(kind)
                end
                local p = { name = name, ["in"] = "query", schema = s }
                if f.repeated then
                    p.schema = { type = "array", items = s }
                    p.explode = true
                    p.style = "form"
                end
                if f.comment and f.comment ~= "" then
                    p.description = f.comment
                end
                out[#out + 1] = p
            elseif f.kind == "message" and not f.repeated then
                query_params(gw, f.type, name .. ".", bound, out, depth + 1, seen)
            end
        end
    end
    seen[msg] = nil
end

local OPENAPI_METHODS = {
    GET = "get", PUT = "put", POST = "post", DELETE = "delete", PATCH = "patch",
    HEAD = "head", OPTIONS = "options", TRACE = "trace",
}

-- document(gw) -> the document of a gateway whose routes are built
-- (routes.ensure)
function _M.document(gw)
    local conf = gw.conf
    local need = {}
    local paths = {}
    local op_ids = {}
    for _, r in ipairs(gw.routes) do
        local verb = OPENAPI_METHODS[r.verb]
        if verb then
            -- the OpenAPI path: variables as {field}, unnamed wildcards as {_N}
            local parts, params, pi = {}, {}, 0
            local var_at = {}
            for _, v in ipairs(r.t.vars) do
                var_at[v.first] = v
            end
            local i = 1
            local pat = r.t.pattern
            while i <= #pat do
                local v = var_at[i]
                if v then
                    parts[#parts + 1] = "{" .. v.field .. "}"
                    local f = v.chain[#v.chain]
                    local s
                    if f.kind == "enum" then
                        local e = gw.schema.enums[f.type]
                        s = { type = "string", enum = e and e.values or empty_array }
                    else
                        s = scalar_schema(value_kind(f))
                    end
                    if v.repeated then
                        -- a path parameter's default style (simple) joins
                        -- the values with ",", as the gateway splits them
                        s = { type = "array", items = s }
                    end
                    local desc = f.comment or ""
                    local last = v.last == -1 and #pat or v.last
                    if last > v.first or pat[v.first] ~= STAR then
                        local sub = {}
                        for j = v.first, last do
                            local p = pat[j]
                            sub[#sub + 1] = p == STAR and "*" or p == DSTAR and "**" or p
                        end
                        desc = (desc ~= "" and desc .. "\n\n" or "")
                               .. "Matches `" .. tab_concat(sub, "/") .. "`."
                    end
                    params[#params + 1] = { name = v.field, ["in"] = "path", required = true,
                                            schema = s,
                                            description = desc ~= "" and desc or nil }
                    i = last + 1
                else
                    local p = pat[i]
                    if type(p) == "string" then
                        parts[#parts + 1] = p
                    else
                        pi = pi + 1
                        local pname = "_" .. pi
                        parts[#parts + 1] = "{" .. pname .. "}"
                        params[#params + 1] = {
                            name = pname, ["in"] = "path", required = true,
                            schema = { type = "string" },
                            description = p == DSTAR and "Any path (`**`)." or "Any segment (`*`).",
                        }
                    end
                    i = i + 1
                end
            end
            local opath = conf.prefix .. "/" .. tab_concat(parts, "/")
            if r.t.verb then
                opath = opath .. ":" .. r.t.verb
            end
            local item = paths[opath]
            if not item then
                item = {}
                paths[opath] = item
            end
            if not item[verb] then
                local bound = {}
                for _, v in ipairs(r.t.vars) do
                    bound[v.chain[1].name] = true
                end
                local op = {
                    tags = { r.service },
                    summary = r.name,
                    description = r.comment ~= "" and r.comment or nil,
                    responses = {
                        ["200"] = r.raw_out and {
                            description = "OK: the data of the google.api.HttpBody answered, "
                                          .. "with its content_type as Content-Type",
                            content = binary(),
                        } or {
                            description = "OK",
                            content = { ["application/json"] = {
                                schema = r.resp_field and field_schema(r.resp_field, need)
                                         or (function()
                                             need[r.output] = true
                                             return ref(r.output)
                                         end)(),
                            } },
                        },
                        ["4XX"] = {
                            description = "A bad request: no route, a bad field, ...",
                            content = { ["application/json"] = {
                                schema = ref("qrpc.gateway.Error"),
                            } },
                        },
                        default = {
                            description = "An error",
                            content = { ["application/json"] = {
                                schema = ref("qrpc.gateway.Error"),
                            } },
                        },
                    },
                }
                local id = str_gsub(r.full, "%.", "_")
                if op_ids[id] then
                    op_ids[id] = op_ids[id] + 1
                    id = id .. "_" .. op_ids[id]
                else
                    op_ids[id] = 1
                end
                op.operationId = id
                if r.raw_in then
                    if r.body_field then
                        bound[r.body_field.name] = true
                    end
                    op.requestBody = {
                        required = false, content = binary(),
                        description = "The bytes of the google.api.HttpBody "
                                      .. (r.body_field and r.body_field.name or "request")
                                      .. ", their Content-Type its content_type",
                    }
                elseif r.body == "*" then
                    need[r.input] = true
                    op.requestBody = { required = false, content = {
                        ["application/json"] = { schema = ref(r.input) } } }
                elseif r.body_field then
                    bound[r.body_field.name] = true
                    op.requestBody = { required = false, content = {
                        ["application/json"] = { schema = field_schema(r.body_field, need) } } }
                end
                if r.body ~= "*" then
                    query_params(gw, r.input, "", bound, params, 1, {})
                end
                if #params > 0 then
                    op.parameters = params
                end
                item[verb] = op
            end
        end
    end
    -- the schemas that were referred to, and what they refer to
    local schemas = {}
    local todo = true
    while todo do
        todo = false
        for name in pairs(need) do
            if not schemas[name] then
                todo = true
                if gw.schema.enums[name] then
                    local e = gw.schema.enums[name]
                    schemas[name] = { type = "string", enum = e.values,
                                      description = e.comment ~= "" and e.comment or nil }
                else
                    schemas[name] = message_schema(gw, name, need)
                end
            end
        end
    end
    schemas["qrpc.gateway.Error"] = {
        type = "object",
        description = "The body of every error answer.",
        required = { "code", "message", "details" },
        properties = {
            code = { type = "integer", format = "int32",
                     description = "The qrpc code of the service's answer, or the gRPC "
                                   .. "code of the gateway's own error." },
            message = { type = "string" },
            details = { type = "array", items = { type = "object" } },
        },
    }
    local info = conf.openapi_info
    local title = info.title
    if not title then
        local names = {}
        for _, s in ipairs(gw.schema.services) do
            names[#names + 1] = s.name
        end
        title = tab_concat(names, ", ")
        if title == "" then
            title = "qrpc gateway"
        end
    end
    local desc = info.description
    local svc1 = gw.schema.services[1]
    if not desc and #gw.schema.services == 1 and (svc1.comment or "") ~= "" then
        desc = svc1.comment
    end
    local tags = {}
    for _, s in ipairs(gw.schema.services) do
        tags[#tags + 1] = { name = s.name,
                            description = (s.comment or "") ~= "" and s.comment or nil }
    end
    -- bindings the gateway does not serve, so a reader of the document
    -- knows what is missing and why
    local skipped
    if gw.skipped and #gw.skipped > 0 then
        skipped = {}
        for i, s in ipairs(gw.skipped) do
            skipped[i] = { rule = s.rule, method = s.method, file = s.file, reason = s.reason }
        end
    end
    return {
        openapi = "3.1.0",
        info = { title = title, version = info.version or "1.0.0", description = desc },
        servers = { { url = "/" } },
        tags = tags,
        paths = paths,
        components = { schemas = schemas },
        ["x-qrpc-skipped"] = skipped,
    }
end

return _M
