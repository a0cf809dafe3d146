-- resty.ffi.qrpc.guard: reading a caller's nested option tables and
-- lists under pcall, so that a metamethod of theirs that raises (__index,
-- __pairs, __len) becomes "bad argument #N: ... raised an error" instead
-- of an error thrown at the caller, and later checks read plain copies.

local abi = require "resty.ffi.qrpc.abi"

local bad = abi.bad
local tostring = abi.show

local pairs = pairs
local pcall = pcall

local _M = {}


-- A nested options table (health, check) read under pcall: its keys
-- (pairs, or __pairs) and the values of names, so that a metamethod that
-- raises gives "bad argument #2: opts.<what> raised an error" instead of
-- throwing. Returns a plain copy and its unknown key, or nil, err.
function _M.read_nested(t, names, what, argn)
    argn = argn or 2
    local copy, unknown = {}, nil
    local ok, err = pcall(function()
        for k in pairs(t) do
            if not names[k] and unknown == nil then
                unknown = k
            end
        end
        for k in pairs(names) do
            copy[k] = t[k]
        end
    end)
    if not ok then
        return bad(argn, "opts." .. what .. " raised an error: "
                         .. tostring(err))
    end
    if unknown ~= nil then
        return bad(argn, "unknown " .. what .. " option '" .. tostring(unknown)
                         .. "'")
    end
    return copy
end


-- A list of strings read under pcall, as read_nested does for tables.
function _M.read_list(t, what, argn)
    local copy, n = {}, 0
    local ok, err = pcall(function()
        for _ in pairs(t) do
            n = n + 1
        end
        -- read through t[i] (its __index, if any), one past the end
        for i = 1, n + 1 do
            copy[i] = t[i]
        end
    end)
    if not ok then
        if argn == 1 then
            return bad(1, what .. " raised an error: " .. tostring(err))
        end
        return bad(2, "opts." .. what .. " raised an error: " .. tostring(err))
    end
    return copy, n
end


return _M
