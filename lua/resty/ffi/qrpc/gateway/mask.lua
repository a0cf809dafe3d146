-- resty.ffi.qrpc.gateway.mask: the update_mask grpc-gateway derives from
-- the fields a PATCH body sets (patch_update_mask).

local schema = require "resty.ffi.qrpc.gateway.schema"

local type = type
local next = next
local pairs = pairs
local tostring = tostring
local tab_sort = table.sort

local field_of = schema.field_of

local _M = {}

-- The dynamic JSON types: a mask goes into their objects by key.
local DYNAMIC = {
    ["google.protobuf.Struct"] = true, ["google.protobuf.Value"] = true,
}

local function is_object(v)
    return type(v) == "table" and next(v) ~= nil and #v == 0
end

-- update_mask(schema, msgname, body) -> the paths of the fields a PATCH
-- body sets (a sorted list), as grpc-gateway's FieldMaskFromRequestBody
-- derives them: a key names a field by its .proto or JSON name, the path
-- uses the .proto names (en_GB, thing.subThing.sub_value); a repeated or
-- map field, an Any, an empty object and a non-object value end a path;
-- inside Struct and Value fields the object's keys continue it as they
-- are written. The paths go to Go as a FieldMask in its message form
-- ({"paths": [...]}), which holds any name; the JSON string form holds
-- lower_snake_case names only.
function _M.update_mask(sch, msgname, body)
    local paths = {}
    local function blind(path, v, depth)
        if is_object(v) and depth < 32 then
            for k, sub in pairs(v) do
                blind(path .. "." .. tostring(k), sub, depth + 1)
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
            local path = prefix and (prefix .. "." .. f.name) or f.name
            if f.repeated or f.map then
                paths[#paths + 1] = path
            elseif f.kind == "message" and DYNAMIC[f.type] then
                blind(path, v, depth)
            elseif f.type == "google.protobuf.Any" then
                if type(v) ~= "table" or v["@type"] == nil then
                    return nil, f.name .. ": an Any needs its @type"
                end
                paths[#paths + 1] = path
            elseif f.kind == "message" and is_object(v) then
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
    return paths
end

return _M
