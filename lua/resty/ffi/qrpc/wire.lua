-- resty.ffi.qrpc.wire: the ABI's record blocks, both ways. A block is a
-- run of [uint16 key][uint32 length][value] records, native-endian and
-- unaligned (the library shares the process; x86-64 and arm64 read
-- unaligned words); a value is a string's bytes or an 8-byte int64 /
-- float64, as the key's type says. The keys are internal/schema's, in
-- resty.ffi.qrpc.wire_keys (generated). Options go in as a block
-- (qrpc_cmd_t.opts), the query ops answer blocks (PEERS, CONFIGURE).

local ffi = require "ffi"
local buffer = require "string.buffer"
local keys = require "resty.ffi.qrpc.wire_keys"

local ffi_cast = ffi.cast
local ffi_string = ffi.string
local tonumber = tonumber
local buf_new = buffer.new
local types = keys.types

local u16_ptr_t = ffi.typeof("uint16_t *")
local u32_ptr_t = ffi.typeof("uint32_t *")
local i64_ptr_t = ffi.typeof("int64_t *")
local dbl_ptr_t = ffi.typeof("double *")
local cu8_ptr_t = ffi.typeof("const uint8_t *")

local HEAD = 6

local _M = { keys = keys }


-- new() -> an empty block writer (a string.buffer of the caller's own:
-- nothing is shared between calls).
function _M.new()
    return buf_new(64)
end


-- put(buf, key, v): appends one record; v is a string for a "str" key,
-- a number for "int" (truncated towards zero by the int64 conversion) and
-- "float" keys. The caller has checked v against the schema.
function _M.put(buf, key, v)
    local t = types[key]
    if t == "str" then
        local n = #v
        local p = buf:reserve(HEAD + n)
        ffi_cast(u16_ptr_t, p)[0] = key
        ffi_cast(u32_ptr_t, p + 2)[0] = n
        ffi.copy(p + HEAD, v, n)
        buf:commit(HEAD + n)
    else
        local p = buf:reserve(HEAD + 8)
        ffi_cast(u16_ptr_t, p)[0] = key
        ffi_cast(u32_ptr_t, p + 2)[0] = 8
        if t == "int" then
            ffi_cast(i64_ptr_t, p + HEAD)[0] = v
        else
            ffi_cast(dbl_ptr_t, p + HEAD)[0] = v
        end
        buf:commit(HEAD + 8)
    end
    return buf
end


-- decode(s) -> ks, vs, n: the records of block s (a Lua string) as two
-- arrays, keys and values (strings, or numbers for int and float keys;
-- an int64 beyond 2^53 loses precision, none of the answers comes near);
-- or nil, err for a malformed block (cut short, an unknown key, a number
-- whose length is not 8).
function _M.decode(s)
    local len = #s
    local p = ffi_cast(cu8_ptr_t, s)
    local ks, vs, n = {}, {}, 0
    local off = 0
    while off < len do
        if len - off < HEAD then
            return nil, "record cut short"
        end
        local key = ffi_cast(u16_ptr_t, p + off)[0]
        local vlen = ffi_cast(u32_ptr_t, p + off + 2)[0]
        if vlen > len - off - HEAD then
            return nil, "record " .. key .. " cut short"
        end
        local t = types[key]
        local v
        if t == "str" then
            v = ffi_string(p + off + HEAD, vlen)
        elseif t ~= nil and vlen == 8 then
            if t == "int" then
                v = tonumber(ffi_cast(i64_ptr_t, p + off + HEAD)[0])
            else
                v = ffi_cast(dbl_ptr_t, p + off + HEAD)[0]
            end
        else
            return nil, "record " .. key .. " malformed"
        end
        n = n + 1
        ks[n], vs[n] = key, v
        off = off + HEAD + vlen
    end
    return ks, vs, n
end


return _M
