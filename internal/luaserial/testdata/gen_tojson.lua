-- Writes tojson_vectors.txt: for each table, string.buffer's encoding (hex)
-- and what lua/resty/ffi/qrpc/json.lua writes for it, from the same table
-- in the same LuaJIT, so that key order agrees. Run from the repository:
--   luajit internal/luaserial/testdata/gen_tojson.lua > internal/luaserial/testdata/tojson_vectors.txt
-- (a LuaJIT 2.1 with string.buffer; OpenResty's works). ngx.null is not
-- available outside nginx: null is covered by hand-written cases.
ngx = { null = {} } -- luacheck: ignore
package.path = "lua/?.lua;" .. package.path
local json = require "resty.ffi.qrpc.json"
local buffer = require "string.buffer"

local enc = buffer.new({ metatable = { json.array_mt } })
local function hex(s)
    return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local big = {}
for i = 1, 300 do big[i] = i * 1.5 end
local bigh = {}
for i = 1, 40 do bigh["k" .. i] = i end
local holes = { 1, 2, 3 }
holes[2] = nil
local grown = {}
grown[3] = "c"; grown[2] = "b"; grown[1] = "a"
local zero = { [0] = "z", "a" }

local cases = {
    {}, json.empty_array, { 1, 2, 3 }, { "a", true, false }, { a = 1 }, { 1, a = 1 },
    { [2] = "x" }, holes, grown, zero, big, bigh,
    { n = 0.1 }, { n = 0.1 + 0.2 }, { n = -0.0 }, { n = 0 }, { n = 2^53 },
    { n = 1e14 }, { n = -1e14 },
    { n = 1e15 }, { n = 999999999999999 }, { n = -999999999999999 }, { n = 123456789012345.6 },
    { n = 1e300 }, { n = -1e-300 }, { n = 5e-324 }, { n = 1/3 }, { n = 0/0 },
    { n = math.huge }, { n = -math.huge },
    { n = 2^63 }, { n = 1e21 }, { n = 1e-5 }, { n = 1234567.125 },
    { s = "" }, { s = "plain" }, { s = "q\"\\\n\0\127é\1\31\t\r\b\f/" },
    { s = string.rep("x", 300) },
    { s = string.rep("y", 0x2000) }, { ["k\"\n"] = 1, [string.rep("x", 100) .. "\t"] = true },
    { [1.0] = "one", [3] = "three" }, { [-5] = 1 }, { [999999999999999] = 1 },
    { a = { b = { c = { 1, { d = {} } } } } }, { l = { json.empty_array, {} } },
    { i = 1LL, u = 18446744073709551615ULL, m = -9223372036854775807LL - 1 },
    { 1, 2, [4] = 4 }, { [1] = 1, [2] = 2, x = 3 },
    { nested = setmetatable({ 1, 2 }, json.array_mt) },
}
for _, t in ipairs(cases) do
    local js = assert(json.encode(t))
    enc:reset()
    enc:encode(t)
    io.write(hex(enc:get()), "\t", js, "\n")
end
-- tables json.lua refuses, with its message
local refused = {
    { [true] = 1 }, { [1.5] = 1 }, { [1e15] = 1 }, { [-1e15] = 1 }, { [math.huge] = 1 },
    { [{}] = 1 },
    { [1LL] = 1 }, { x = 1i }, { [-math.huge] = 1 },
}
for _, t in ipairs(refused) do
    local ok, js, err = pcall(json.encode, t)
    if ok and js then
        error("json.lua accepted a refused case: " .. js)
    end
    enc:reset()
    enc:encode(t)
    io.write(hex(enc:get()), "\t!", ok and err or js, "\n")
end
