-- resty.ffi.qrpc.gateway.mask: the update_mask grpc-gateway derives from
-- the fields a PATCH body sets (patch_update_mask).

local schema = require "resty.ffi.qrpc.gateway.schema"

local type = type
local next = next
local pairs = pairs
local tostring = tostring
local str_gsub = string.gsub
local str_upper = string.upper
local tab_concat = table.concat
local tab_sort = table.sort

local field_of = schema.field_of

local _M = {}

-- The dynamic JSON types: a mask goes into their objects by key.
local DYNAMIC = {
    ["google.protobuf.Struct"] = true, ["google.protobuf.Value"] = true,
}

local function lower_camel(name)
    return (str_gsub(name, "_(%l)", str_upper))
end

-- update_mask(schema, msgname, body) -> the FieldMask (JSON form) of the
-- fields a PATCH body sets, as grpc-gateway derives it: each leaf's path;
-- a repeated or map field, an empty object and a non-object value end a
-- path; inside Struct and Value fields the object's keys are the path.
function _M.update_mask(sch, msgname, body)
    local paths = {}
    local function blind(path, v, depth)
        if type(v) == "table" and next(v) ~= nil and #v == 0 and depth < 32 then
            for k, sub in pairs(v) do
                -- camel-cased like a field's name: FieldMask's JSON form
                -- that Go reads back into the proto path (struct_key)
                blind(path .. "." .. lower_camel(tostring(k)), sub, depth + 1)
            end
        else
            paths[#paths + 1] = path
        end
    end
    local function walk(mname, node, prefix, depth)
        if depth > 32 then
            return nil, "the body nests too deep for an update mask"
        end
        for k, v in pairs(node) do
            local f = type(k) == "string" and field_of(sch, mname, k)
            if not f then
                return nil, "no field " .. tostring(k) .. " in " .. mname
            end
            local path = prefix and (prefix .. "." .. lower_camel(f.name)) or lower_camel(f.name)
            if f.kind == "message" and DYNAMIC[f.type] and not f.repeated and not f.map then
                blind(path, v, depth)
            elseif f.repeated or f.map then
                paths[#paths + 1] = path
            elseif f.kind == "message" and type(v) == "table" and next(v) ~= nil then
                local ok, err = walk(f.type, v, path, depth + 1)
                if not ok then
                    return nil, err
                end
            else
                paths[#paths + 1] = path
            end
        end
        return true
    end
    local ok, err = walk(msgname, body, nil, 0)
    if not ok then
        return nil, err
    end
    tab_sort(paths)
    return tab_concat(paths, ",")
end

return _M
