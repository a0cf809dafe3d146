-- resty.ffi.qrpc.addr: addresses: "host:port" as the library reads it
-- (checked in Lua so that Go never refuses one), and the PEERS answer
-- that lists a pool's servers.

local abi = require "resty.ffi.qrpc.abi"

local bad = abi.bad
local tostring = abi.show

local type = type
local tonumber = tonumber
local str_byte = string.byte
local str_find = string.find
local str_sub = string.sub
local str_match = string.match
local str_gmatch = string.gmatch
local str_lower = string.lower

local _M = {}


-- The host of host:port as Go's net.SplitHostPort takes it: "[...]" with
-- no brackets inside, or a name/address with no ':', '[' or ']'.
local function host_ok(host)
    if str_byte(host, 1) == 91 then -- "["
        return str_find(host, "^%[[^%[%]]*%]$") ~= nil
    end
    return not str_find(host, "[%[%]:]")
end
_M.host_ok = host_ok


-- An SRV name as Go's pool reads it: "_service._proto.name" (no port),
-- the first two labels starting with "_", no empty label.
local function is_srv(a)
    if type(a) ~= "string" or str_find(a, ":", 1, true) then
        return false
    end
    if str_byte(a, -1) == 46 then -- a trailing "." ends the name
        a = str_sub(a, 1, -2)
    end
    local n = 0
    for label in str_gmatch(a .. ".", "([^.]*)%.") do
        n = n + 1
        if label == "" or n <= 2 and (#label < 2 or str_byte(label, 1) ~= 95) then
            return false
        end
    end
    return n >= 3
end
_M.is_srv = is_srv


-- norm_addr(a, what) -> "host:port" with the host in lower case and the
-- port as a plain number ("Host:038411" is "host:38411"), so that two
-- spellings of one server are one server; or nil, "bad argument #1: ...".
local function norm_addr(a, what)
    if type(a) ~= "string" then
        return bad(1, what .. " must be a non-empty string host:port (got "
                      .. type(a) .. ")")
    end
    if a == "" then
        return bad(1, what .. " must be host:port, not an empty string")
    end
    if is_srv(a) then
        return str_lower(a)
    end
    local host, port = str_match(a, "^(.*):(%d+)$")
    if not host then
        return bad(1, what .. " must be host:port (got \"" .. tostring(a) .. "\")")
    end
    if host == "" then
        return bad(1, what .. " must be host:port, the host is empty (got \""
                      .. tostring(a) .. "\")")
    end
    if not host_ok(host) then
        return bad(1, what .. " must be host:port, an IPv6 host in brackets "
                      .. "([::1]:8443) (got \"" .. tostring(a) .. "\")")
    end
    local p = tonumber(port)
    if p < 1 or p > 65535 then
        return bad(1, what .. " must be host:port with a port 1..65535 (got \""
                      .. tostring(a) .. "\")")
    end
    return str_lower(host) .. ":" .. p
end
_M.norm_addr = norm_addr


-- Parses the PEERS answer into { { addr, state, inflight, calls, failures,
-- ejected_until, stalled (boolean) }, ... }.
function _M.parse_peers(text)
    local out = {}
    for line in str_gmatch(text, "[^\n]+") do
        local p = {}
        for k, v in str_gmatch(line, "(%S+)=(%S*)") do
            p[k] = k ~= "addr" and tonumber(v) or v
        end
        if p.addr then
            p.stalled = p.stalled == 1
            out[#out + 1] = p
        end
    end
    return out
end


-- The "connections=N" answer of PEERS for handle 0.
function _M.parse_connections(text)
    return tonumber(str_match(text or "", "connections=(%d+)")) or 0
end


return _M
