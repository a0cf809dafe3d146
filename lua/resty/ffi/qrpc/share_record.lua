-- resty.ffi.qrpc.share_record: the binary record of QRPC_OP_POOL_SHARE
-- (its form: the comment of internal/bridge/share.go), for
-- resty.ffi.qrpc.share.

local str_byte = string.byte
local str_char = string.char
local str_sub = string.sub
local tab_concat = table.concat
local math_floor = math.floor

local _M = {}

local function u16(n)
    return str_char(n % 256, math_floor(n / 256) % 256)
end

local function u32(n)
    return str_char(n % 256, math_floor(n / 256) % 256,
                    math_floor(n / 65536) % 256, math_floor(n / 16777216) % 256)
end

local function u64(n)
    return u32(n % 4294967296) .. u32(math_floor(n / 4294967296))
end

local function lstr(s)
    return u16(#s) .. s
end

local function rd16(s, i)
    local a, b = str_byte(s, i, i + 1)
    return a + b * 256, i + 2
end

local function rd32(s, i)
    local a, b, c, d = str_byte(s, i, i + 3)
    return a + b * 256 + c * 65536 + d * 16777216, i + 4
end

local function rdstr(s, i)
    local n
    n, i = rd16(s, i)
    return str_sub(s, i, i + n - 1), i + n
end

-- A resolved list, as the record has it; the dict keeps it so too.
local function encode_list(list)
    local nl = list and #list or 0
    local b = { u16(nl) }
    for i = 1, nl do
        local r = list[i]
        b[i + 1] = u16(r.prio) .. u16(r.weight) .. lstr(r.addr)
                   .. lstr(r.name)
    end
    return tab_concat(b)
end

local function decode_list(s, i)
    local n
    n, i = rd16(s, i)
    if n == 0 then
        return nil, i
    end
    local list = {}
    for k = 1, n do
        local prio, weight, addr, name
        prio, i = rd16(s, i)
        weight, i = rd16(s, i)
        addr, i = rdstr(s, i)
        name, i = rdstr(s, i)
        list[k] = { prio = prio, weight = weight, addr = addr, name = name }
    end
    return list, i
end

-- encode(roles, gen, verdicts, nv, list, oreqs, oaccs) -> the request
-- record
local function encode(roles, gen, verdicts, nv, list, oreqs, oaccs)
    local b = { str_char(roles), u64(gen), u16(nv) }
    for i = 1, nv do
        local v = verdicts[i]
        b[#b + 1] = str_char(v.flags) .. u32(v.ms) .. u32(v.run or 0)
                    .. lstr(v.addr)
    end
    b[#b + 1] = encode_list(list)
    b[#b + 1] = u64(oreqs)
    b[#b + 1] = u64(oaccs)
    return tab_concat(b)
end

local function rd64(s, i)
    local lo, hi
    lo, i = rd32(s, i)
    hi, i = rd32(s, i)
    return lo + hi * 4294967296, i
end

-- decode(answer) -> gen, peers { { addr, ej, ms, stall, nf, nr, since } },
-- list or nil, the throttling window's requests and accepts
local function decode(s)
    local gen, i = rd64(s, 1)
    local n
    n, i = rd16(s, i)
    local peers = {}
    for k = 1, n do
        local f = str_byte(s, i)
        local ms, nf, nr, since, addr
        ms, i = rd32(s, i + 1)
        nf, i = rd32(s, i)
        nr, i = rd32(s, i)
        since, i = rd32(s, i)
        addr, i = rdstr(s, i)
        peers[k] = { addr = addr, ej = f % 2 == 1,
                     ms = ms, stall = math_floor(f / 2) % 2 == 1,
                     nf = nf, nr = nr, since = since }
    end
    local list, reqs, accs
    list, i = decode_list(s, i)
    reqs, i = rd64(s, i)
    accs = rd64(s, i)
    return gen, peers, list, reqs, accs
end

_M.encode = encode
_M.decode = decode
_M.encode_list = encode_list
_M.decode_list = decode_list

return _M
