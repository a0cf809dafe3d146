-- resty.ffi.qrpc.addr: addresses: "host:port" as the library reads it
-- (checked in Lua so that Go never refuses one), and the PEERS answer
-- that lists a pool's servers.

local abi = require "resty.ffi.qrpc.abi"
local wire = require "resty.ffi.qrpc.wire"

local bad = abi.bad
local decode = wire.decode
local K = wire.keys
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


-- The PEERS answer (a record block: per server PEER_ADDR, then its
-- PEER_* records) -> { { addr, state, inflight, calls, failures,
-- ejected_until, stalled (boolean) }, ... }; or nil, err for a malformed
-- block.
local peer_fields = {
    [K.PEER_STATE] = "state", [K.PEER_INFLIGHT] = "inflight",
    [K.PEER_CALLS] = "calls", [K.PEER_FAILURES] = "failures",
    [K.PEER_EJECTED_UNTIL_MS] = "ejected_until",
}

function _M.parse_peers(block)
    local ks, vs, n = decode(block)
    if not ks then
        return nil, "qrpc: malformed result from the library"
    end
    local out, p = {}, nil
    for i = 1, n do
        local k, v = ks[i], vs[i]
        if k == K.PEER_ADDR then
            p = { addr = v, stalled = false }
            out[#out + 1] = p
        elseif p and k == K.PEER_STALLED then
            p.stalled = v == 1
        elseif p and peer_fields[k] then
            p[peer_fields[k]] = v
        end
    end
    return out
end


-- The CONNECTIONS answer of PEERS for handle 0.
function _M.parse_connections(block)
    local ks, vs, n = decode(block or "")
    for i = 1, ks and n or 0 do
        if ks[i] == K.CONNECTIONS then
            return vs[i]
        end
    end
    return 0
end


return _M
