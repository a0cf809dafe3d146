-- resty.ffi.qrpc.gateway.body: the request body (max_body checked) and
-- what its Content-Type says it is.

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req

local tonumber = tonumber
local io_open = io.open
local str_find = string.find
local str_lower = string.lower
local str_match = string.match

local _M = {}

-- read(gw) -> the body | nil, 413
function _M.read(gw)
    local len = tonumber(ngx_var.http_content_length)
    local max = gw.conf.max_body
    if len and len > max then
        return nil, 413
    end
    ngx_req.read_body()
    local data = ngx_req.get_body_data()
    if not data then
        local file = ngx_req.get_body_file()
        if file then
            local f = io_open(file, "rb")
            if f then
                data = f:read("*a")
                f:close()
            end
        end
    end
    data = data or ""
    if #data > max then
        return nil, 413
    end
    return data
end

-- is the Content-Type ct JSON (application/json, any +json type)?
function _M.json_type(ct)
    if not ct then
        return false
    end
    local mime = str_lower(str_match(ct, "^%s*([^;%s]+)") or "")
    return mime == "application/json" or str_find(mime, "^application/[%w.-]+%+json$") ~= nil
end

-- does the body start as a JSON object or array does (after white space)?
function _M.json_text(data)
    return str_find(data, "^[ \t\r\n]*[{%[]") ~= nil
end

-- is the Content-Type ct a form (application/x-www-form-urlencoded)?
function _M.form_type(ct)
    return str_lower(str_match(ct or "", "^%s*([^;%s]+)") or "")
           == "application/x-www-form-urlencoded"
end

return _M
