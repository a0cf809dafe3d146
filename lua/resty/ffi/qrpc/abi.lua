-- resty.ffi.qrpc.abi: the C ABI of libffi_qrpc.so as LuaJIT sees it, and
-- the codec on both sides of it: building a qrpc_cmd_t, packing headers,
-- decoding result blobs, turning status codes into error strings.
--
-- The declarations must match internal/hostq/qrpc.h field for field
-- (nginx/abi_test.go compares the two, constants included). Nothing here
-- touches the library itself: loading it is resty.ffi.qrpc.loader's job.

local ffi = require "ffi"
local base = require "resty.core.base"
local limits = require "resty.ffi.qrpc.limits"

local ffi_new = ffi.new
local ffi_string = ffi.string
local str_sub = string.sub
local str_find = string.find
local str_format = string.format
local ffi_cast = ffi.cast
local ffi_copy = ffi.copy
local ffi_sizeof = ffi.sizeof
local ffi_typeof = ffi.typeof
local new_tab = base.new_tab
local buf_new = require("string.buffer").new

local type = type
local tostring = tostring
local tonumber = tonumber
local pairs = pairs
local pcall = pcall
local math_ceil = math.ceil
local math_floor = math.floor


-- Keep in sync with internal/hostq/qrpc.h (nginx/abi_test.go compares them).
if not pcall(ffi_typeof, "qrpc_cmd_t") then
ffi.cdef[[
typedef struct {
    uint32_t    version;
    uint32_t    op;
    uint64_t    conn;
    uint64_t    call_id;
    int32_t     timeout_ms;
    uint32_t    nhdrs;
    const char *method;  size_t method_len;
    const char *body;    size_t body_len;
    const char *hdrs;    size_t hdrs_len;
    const char *addr;        size_t addr_len;
    const char *server_name; size_t server_name_len;
    const char *ca;          size_t ca_len;
    const char *cert;        size_t cert_len;
    const char *key;         size_t key_len;
    const char *pins;        size_t pins_len;
    int32_t     insecure;
    int32_t     conns;
    int32_t     streams;
    int32_t     idle_timeout_ms;
    int32_t     max_frame_size;
    int32_t     retries;
    const char *hash_key;    size_t hash_key_len;
    const char *req_type;    size_t req_type_len;
    const char *resp_type;   size_t resp_type_len;
    uint32_t    flags;
    uint32_t    vm;
    const char *opts;        size_t opts_len;
} qrpc_cmd_t;

typedef struct {
    uint64_t call_id;
    uint64_t handle;
    int32_t  status;
    uint32_t code;
    char    *data;
    size_t   len;
} qrpc_completion_t;

typedef struct {
    uint64_t inflight;
    uint64_t calls;
    uint64_t events;
    uint64_t dropped;
    uint64_t reconnects;
    uint64_t queued;
} qrpc_stats_t;

int qrpc_init(char *err, size_t err_len);
int qrpc_claim(char *err, size_t err_len);
int qrpc_stats(uint64_t conn, qrpc_stats_t *out);
int qrpc_query(const qrpc_cmd_t *cmd, char **out, size_t *out_len, char *err, size_t err_len);
int qrpc_submit_async(const qrpc_cmd_t *cmd);
int qrpc_vm_open(const char *name, size_t name_len, uint64_t token, char *err, size_t err_len);
int qrpc_vm_wake_open(int vm, const char *dir, size_t dir_len, char *path,
                      size_t path_len, char *err, size_t err_len);
int qrpc_vm_poll(int vm, qrpc_completion_t *out, int max);
void qrpc_release(void *p);
void qrpc_release_n(void *const *ps, int n);
uint64_t qrpc_go_entries(void);
uint64_t qrpc_go_cgo_calls(void);
]]
end

-- Every constant of the ABI, as internal/hostq/qrpc.h defines it
-- (QRPC_OP_X is OP_X here, QRPC_F_X is F_X, QRPC_CMD_VERSION is
-- CMD_VERSION); the other Lua files take them from this table.
-- nginx/abi_test.go compares the two lists, both ways.
local CMD_VERSION = 5

local OP_CONNECT = 1
local OP_UNARY = 2
local OP_EVENT = 3
local OP_CLOSE = 4
local OP_CANCEL = 5
local OP_ECHO = 6
local OP_PEERS = 8
local OP_METRICS = 9
local OP_PROTO_LOAD = 10
local OP_CONFIGURE = 11
local OP_PROFILE = 12
local OP_PROTO_DESCRIBE = 13
local OP_POOL_SHARE = 14

local F_DISCARD_UNKNOWN = 1
local F_PROTO_NAMES = 2
local F_LUA_TABLE = 4
local F_LUA_REQUEST = 8
local F_EMIT_UNPOPULATED = 16

local QRPC_OK = 0
local QRPC_PENDING = 1
local QRPC_LOG = 2
local QRPC_BAD_RESPONSE = 3
local QRPC_SHARE = 4
local QRPC_ERR = -1
local QRPC_ERR_TIMEOUT = -2
local QRPC_ERR_CLOSED = -3
local QRPC_ERR_FULL = -4
local QRPC_ERR_BADARG = -5
local QRPC_ERR_CONNECT = -6
local QRPC_ERR_UNAVAIL = -7
local QRPC_ERR_TOOBIG = -8
local QRPC_ERR_LOST = -9

-- Lua VMs (one per nginx subsystem) one process serves: qrpc_vm_open.
local QRPC_MAX_VMS = 8

-- The bytes of a result blob before its headers: code, hdrs_len, attempts.
local QRPC_RESULT_HEAD = 12

-- The words of an error status that came without a message.
local status_names = {
    [QRPC_ERR] = "qrpc: error",
    [QRPC_ERR_TIMEOUT] = "timeout",
    [QRPC_ERR_CLOSED] = "closed",
    [QRPC_ERR_FULL] = "queue full",
    [QRPC_ERR_BADARG] = "qrpc: malformed command",
    [QRPC_ERR_CONNECT] = "connect: failed",
    [QRPC_ERR_UNAVAIL] = "unavailable",
    [QRPC_ERR_TOOBIG] = "too large",
    [QRPC_ERR_LOST] = "connection lost",
}

local ERRBUF_LEN = 512

local cmd_t = ffi_typeof("qrpc_cmd_t")
local u32_ptr_t = ffi_typeof("const uint32_t *")
local u32_wptr_t = ffi_typeof("uint32_t *")
local char_arr_t = ffi_typeof("char[?]")


local _M = {
    CMD_VERSION = CMD_VERSION,
    OP_CONNECT = OP_CONNECT,
    OP_UNARY = OP_UNARY,
    OP_EVENT = OP_EVENT,
    OP_CLOSE = OP_CLOSE,
    OP_CANCEL = OP_CANCEL,
    OP_ECHO = OP_ECHO,
    OP_PEERS = OP_PEERS,
    OP_CONFIGURE = OP_CONFIGURE,
    OP_PROFILE = OP_PROFILE,
    OP_METRICS = OP_METRICS,
    OP_PROTO_LOAD = OP_PROTO_LOAD,
    OP_PROTO_DESCRIBE = OP_PROTO_DESCRIBE,
    OP_POOL_SHARE = OP_POOL_SHARE,
    F_DISCARD_UNKNOWN = F_DISCARD_UNKNOWN,
    F_PROTO_NAMES = F_PROTO_NAMES,
    F_LUA_TABLE = F_LUA_TABLE,
    F_LUA_REQUEST = F_LUA_REQUEST,
    F_EMIT_UNPOPULATED = F_EMIT_UNPOPULATED,
    QRPC_OK = QRPC_OK,
    QRPC_PENDING = QRPC_PENDING,
    QRPC_LOG = QRPC_LOG,
    QRPC_BAD_RESPONSE = QRPC_BAD_RESPONSE,
    QRPC_SHARE = QRPC_SHARE,
    QRPC_ERR = QRPC_ERR,
    QRPC_ERR_TIMEOUT = QRPC_ERR_TIMEOUT,
    QRPC_ERR_CLOSED = QRPC_ERR_CLOSED,
    QRPC_ERR_FULL = QRPC_ERR_FULL,
    QRPC_ERR_BADARG = QRPC_ERR_BADARG,
    QRPC_ERR_CONNECT = QRPC_ERR_CONNECT,
    QRPC_ERR_UNAVAIL = QRPC_ERR_UNAVAIL,
    QRPC_ERR_TOOBIG = QRPC_ERR_TOOBIG,
    QRPC_ERR_LOST = QRPC_ERR_LOST,
    QRPC_MAX_VMS = QRPC_MAX_VMS,
    QRPC_RESULT_HEAD = QRPC_RESULT_HEAD,

    cmd_t = cmd_t,
    CMD_SIZE = ffi_sizeof(cmd_t),
    char_arr_t = char_arr_t,
    u64_ptr_t = ffi_typeof("const uint64_t *"),
    cstr_t = ffi_typeof("const char *"),

    -- The library writes its error messages into a caller's buffer of
    -- this size (qrpc_init, qrpc_query, qrpc_vm_open, ...): new_errbuf().
    ERRBUF_LEN = ERRBUF_LEN,
}


-- A buffer for one call's error message, the call's own.
function _M.new_errbuf()
    return ffi_new(char_arr_t, ERRBUF_LEN)
end


-- show(v): a caller's value in an error message, without calling anything
-- of the caller's (a table's __tostring could raise or yield): numbers,
-- booleans and nil as tostring writes them, strings cut to 64 bytes, the
-- rest by their type.
local function show(v)
    local t = type(v)
    if t == "string" then
        if #v > 64 then
            return str_sub(v, 1, 61) .. "..."
        end
        return v
    end
    if t == "number" or t == "boolean" or t == "nil" then
        return tostring(v)
    end
    return "a " .. t
end
_M.show = show


function _M.bad(n, msg)
    return nil, "bad argument #" .. n .. ": " .. msg
end
local bad = _M.bad


-- An error message from the library is err alone, or
-- err \31 detail \31 attempts \31 budget (internal/bridge EncodeMessage):
-- err is what a caller compares, the rest goes in the info table.
local SEP = "\31"

-- status_err(status, msg) -> err, info: info is nil when the library said
-- nothing beyond err (callers give out an empty table then).
local function status_err(status, msg)
    if msg and msg ~= "" then
        local i = str_find(msg, SEP, 1, true)
        if not i then
            return msg
        end
        local err = str_sub(msg, 1, i - 1)
        local j = str_find(msg, SEP, i + 1, true)
        if not j then
            return err, { detail = str_sub(msg, i + 1) }
        end
        local k = str_find(msg, SEP, j + 1, true)
        local info = new_tab(0, 3)
        local detail = str_sub(msg, i + 1, j - 1)
        if detail ~= "" then
            info.detail = detail
        end
        local n = tonumber(str_sub(msg, j + 1, (k or 0) - 1))
        if n and n > 0 then
            info.attempts = n
        end
        if k and str_sub(msg, k + 1) == "1" then
            info.budget = true
        end
        return err, info
    end
    return status_names[status] or ("qrpc: status " .. tostring(status))
end
_M.status_err = status_err


-- The error string of a failed synchronous call (its message is in eb,
-- the buffer the call was given).
function _M.submit_err(rc, eb)
    return status_err(rc, ffi_string(eb))
end


-- [u32 len][bytes] entries, native-endian; unaligned 32-bit access is fine
-- on the platforms LuaJIT and Go share (x86-64, arm64).
local function read_u32(p, off)
    return ffi_cast(u32_ptr_t, p + off)[0]
end


local function decode_headers(p, n)
    -- Most answers carry no headers: an empty table then has no hash part
    -- (96 of the 320 bytes a call allocated, and GC time with them).
    local hdrs = new_tab(0, n > 0 and 4 or 0)
    local off = 0
    while off < n do
        if n - off < 8 then
            return nil
        end
        local klen = read_u32(p, off)
        if klen > n - off - 8 then
            return nil
        end
        local k = ffi_string(p + off + 4, klen)
        off = off + 4 + klen
        local vlen = read_u32(p, off)
        if vlen > n - off - 4 then
            return nil
        end
        hdrs[k] = ffi_string(p + off + 4, vlen)
        off = off + 4 + vlen
    end
    return hdrs
end


-- A result blob: [u32 code][u32 hdrs_len][u32 attempts][hdrs][body]
-- (attempts: a unary's, through its pool; 1 for the other ops).
function _M.decode_result(p, len)
    if p == nil or len < QRPC_RESULT_HEAD then
        return nil
    end
    local code = read_u32(p, 0)
    local hlen = read_u32(p, 4)
    if hlen > len - QRPC_RESULT_HEAD then
        return nil
    end
    local hdrs = decode_headers(p + QRPC_RESULT_HEAD, hlen)
    if not hdrs then
        return nil
    end
    return {
        code = code,
        headers = hdrs,
        body = ffi_string(p + QRPC_RESULT_HEAD + hlen, len - QRPC_RESULT_HEAD - hlen),
        attempts = read_u32(p, 8),
    }
end


-- A QRPC_BAD_RESPONSE completion's data, [u32 msg_len][msg][result blob]:
-- returns { err = msg, res = result table } (res nil if malformed).
function _M.decode_bad_response(p, len)
    if p == nil or len < 4 then
        return { err = "bad response: malformed completion" }
    end
    local n = read_u32(p, 0)
    if n > len - 4 then
        return { err = "bad response: malformed completion" }
    end
    return {
        err = ffi_string(p + 4, n),
        res = _M.decode_result(p + 4 + n, len - 4 - n),
    }
end


-- Go refuses more entries (names + values) than this.
local MAX_HDR_ENTRIES = limits.HEADER_ENTRIES

local function put_str(buf, s)
    local n = #s
    local p = buf:reserve(4 + n)
    ffi_cast(u32_wptr_t, p)[0] = n
    ffi_copy(p + 4, s, n)
    buf:commit(4 + n)
end


-- Packs a { name = value } table (a plain one: the caller has copied a
-- table with a metatable) into [u32 len][bytes] entries. limit: the
-- connection's max_frame_size. Returns the number of entries (names +
-- values), the length in bytes and the block, a string of this call's own
-- (nothing shared between calls; the lua-resty-ffi host pins it with the
-- command), or nil and an error. Entries stop being written once the
-- block is past limit: a block that big is refused, not built.
-- The block is built in one buffer of the module's, reset each time:
-- nothing yields between the reset and the copy out (buf:tostring()).
local hdr_buf = buf_new(256)

-- num_str(v): a number as a string that reads back as the same number.
-- tostring keeps 14 significant digits, which rounds an integer past
-- 10^14 (a microsecond timestamp, an id) and writes it in e notation.
local function num_str(v)
    if (v >= 1e15 or v <= -1e15) and v < 2^64 and v > -2^64
       and math_floor(v) == v
    then
        return str_format("%.0f", v)   -- an integer in digits, never 1e+15
    end
    local s = tostring(v)
    if v == v and tonumber(s) ~= v then
        s = str_format("%.17g", v)
    end
    return s
end
_M.num_str = num_str

function _M.pack_headers(h, argn, limit)
    local n, size = 0, 0
    local buf = hdr_buf:reset()
    for k, v in pairs(h) do
        if type(k) ~= "string" then
            return bad(argn, "header names must be strings")
        end
        local tv = type(v)
        if tv == "number" then
            v = num_str(v)
        elseif tv ~= "string" then
            return bad(argn, "header '" .. str_sub(k, 1, 64)
                             .. "' must be a string (got " .. tv .. ")")
        end
        n = n + 2
        size = size + 8 + #k + #v
        if size <= limit then
            put_str(buf, k)
            put_str(buf, v)
        end
    end
    if size > 65536 then
        -- a rare big block: the next call does not keep its memory
        hdr_buf = buf_new(256)
    end
    if n > MAX_HDR_ENTRIES then
        return bad(argn, "too many headers (" .. n / 2 .. "; at most "
                         .. MAX_HDR_ENTRIES / 2 .. ")")
    end
    if size > limit then
        return nil, "too large: request exceeds max_frame_size",
               { detail = "headers (" .. size .. " bytes; max_frame_size is "
                          .. limit .. ")" }
    end
    return n, size, buf:tostring()
end


-- fill_cmd(cmd, c): writes the command c describes into cmd (a
-- qrpc_cmd_t the caller owns for this call alone) and returns cmd. c is
-- one table: op, conn (the handle), id (the call id, built-in host),
-- method, body, nh (header entries), hdrs (the packed block, a string or
-- a buffer) and hlen, timeout (ms), req_type, resp_type, flags, hash_key
-- (a pool's server choice), retries (extra attempts on another server),
-- opts (a record block: resty.ffi.qrpc.wire); absent fields are zero.
-- cmd points into c's strings: the caller keeps c alive until the library
-- has read the command (qrpc_submit_async and qrpc_query copy it before
-- they return; the lua-resty-ffi host anchors c with the task).
function _M.fill_cmd(cmd, c)
    local method, body, nh = c.method or "", c.body or "", c.nh or 0
    local hash_key, copts = c.hash_key, c.opts
    local req_type, resp_type = c.req_type, c.resp_type
    cmd.version = CMD_VERSION
    cmd.op = c.op
    cmd.conn = c.conn or 0
    cmd.call_id = c.id or 0
    cmd.timeout_ms = c.timeout or 0
    cmd.nhdrs = nh
    cmd.method = method
    cmd.method_len = #method
    cmd.body = body
    cmd.body_len = #body
    if nh > 0 then
        cmd.hdrs = c.hdrs
        cmd.hdrs_len = c.hlen
    else
        cmd.hdrs = nil
        cmd.hdrs_len = 0
    end
    -- protobuf message types (resty.ffi.qrpc.proto); cleared when absent:
    -- commands are reused
    cmd.req_type = req_type
    cmd.req_type_len = req_type and #req_type or 0
    cmd.resp_type = resp_type
    cmd.resp_type_len = resp_type and #resp_type or 0
    cmd.flags = c.flags or 0
    cmd.vm = c.vm or 0
    if hash_key then
        cmd.hash_key = hash_key
        cmd.hash_key_len = #hash_key
    else
        cmd.hash_key = nil
        cmd.hash_key_len = 0
    end
    cmd.retries = c.retries or 0
    -- UNARY's per-call pool options (resty.ffi.qrpc.pool), a query's
    -- options: a record block
    if copts then
        cmd.opts = copts
        cmd.opts_len = #copts
    else
        cmd.opts = nil
        cmd.opts_len = 0
    end
    return cmd
end


local function set_str(cmd, field, s)
    if s then
        cmd[field] = s
        cmd[field .. "_len"] = #s
    end
end


-- A CONNECT command for addr and checked options o (pins: the raw digests,
-- concatenated). Its strings point into o's: the caller keeps o alive until
-- the library has read them.
function _M.connect_cmd(addr, o, pins)
    local cmd = ffi_new(cmd_t)
    cmd.version = CMD_VERSION
    cmd.op = OP_CONNECT
    cmd.timeout_ms = o.timeout and math_ceil(o.timeout) or 0
    set_str(cmd, "addr", addr)
    set_str(cmd, "server_name", o.server_name)
    set_str(cmd, "ca", o.ca)
    set_str(cmd, "cert", o.cert)
    set_str(cmd, "key", o.key)
    if pins ~= "" then
        set_str(cmd, "pins", pins)
    end
    cmd.insecure = o.insecure and 1 or 0
    cmd.conns = o.conns or 0
    cmd.streams = o.streams or 0
    cmd.idle_timeout_ms = o.idle_timeout and math_ceil(o.idle_timeout) or 0
    cmd.max_frame_size = o.max_frame_size or 0
    return cmd
end


-- Sets CONNECT's opts lines (pools); the caller keeps s alive as above.
function _M.set_opts(cmd, s)
    if s and s ~= "" then
        cmd.opts = s
        cmd.opts_len = #s
    end
    return cmd
end


return _M
