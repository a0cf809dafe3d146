-- resty.ffi.qrpc.proto: protobuf messages for unary and event.
--
-- Schemas are compiled in Go (the library's registry, one per worker);
-- bodies cross as one string each way: for Lua tables, LuaJIT's
-- string.buffer serialization format (required: see below); with
-- json = true, JSON text in the proto3 JSON mapping.
--
--   qrpc.proto.load(path, { import_paths = { dir, ... } }) -> true | nil, err
--   qrpc.proto.load_descriptor_set(bytes)                   -> true | nil, err
--       In init_by_lua the master only records the request (Go never runs
--       in the master); each worker compiles the recorded schemas the first
--       time it needs one. Elsewhere the worker compiles at once. Relative
--       paths are relative to nginx's prefix (-p). Loading a file twice is
--       a no-op.
--   conn:unary(method, body, { request = "pkg.Req", response = "pkg.Reply",
--                              json = false, discard_unknown = false })
--   qrpc.connect(addr, { methods = { Method = { request = ..., response = ... } } })

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"
local json = require "resty.ffi.qrpc.json"
local pool = require "resty.ffi.qrpc.pool"
local wire = require "resty.ffi.qrpc.wire"

local ffi_new = ffi.new

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local get_phase = ngx.get_phase
local ngx_prefix = ngx.config.prefix

local type = type
local pairs = pairs
local pcall = pcall
-- never a caller's __tostring (abi.show)
local tostring = abi.show
local io_open = io.open
local str_sub = string.sub
local str_find = string.find
local str_gsub = string.gsub
local str_match = string.match
local str_byte = string.byte
local IMPORT_PATH = wire.keys.IMPORT_PATH

local bad = abi.bad
local QRPC_OK = abi.QRPC_OK

local OP_PROTO_LOAD = abi.OP_PROTO_LOAD
local F_DISCARD_UNKNOWN = abi.F_DISCARD_UNKNOWN
local F_PROTO_NAMES = abi.F_PROTO_NAMES
local F_LUA_TABLE = abi.F_LUA_TABLE
local F_LUA_REQUEST = abi.F_LUA_REQUEST
local F_EMIT_UNPOPULATED = abi.F_EMIT_UNPOPULATED

-- Lua tables cross in LuaJIT's string.buffer serialization format both
-- ways (LuaJIT 2.1 since 2021-01; Debian 12's 2.1-20230119, OpenResty's
-- and lua-resty-ffi's builds have it). A request table is one C call
-- (buffer:encode) where a JSON encoder walks the table in Lua; Go reads
-- the bytes (internal/luaserial, internal/transcode's EncodeLua). A reply
-- comes back after a NUL byte in the same format: one C call builds the
-- table, each table at its final size, where a JSON decoder parses text
-- and grows tables as it goes.
local sbuf = require "string.buffer"
local dbuf = sbuf.new()
-- The array marks are listed as the encoder's metatables, so that an
-- empty list still reads as [] in Go.
local ebuf = sbuf.new({ metatable = json.array_mts })

-- Never compiled. string.buffer's encode throws for the tables it
-- refuses, and LuaJIT (Debian 12's 2.1-20230119 and OpenResty's
-- 2.1-20240314 alike) does not always come out of an error thrown from
-- compiled code whole: with the encode compiled under pcall, 3 and 10 of
-- 250 runs of nginx/TestProtobuf crashed the worker (a general protection
-- fault in libluajit), and 5 and 2 saw pcall come back with the wrong
-- values (the error text in another variable). Out of the JIT, the throw
-- happens in the interpreter: none in 750 runs. The price is that traces
-- through a call stop here (about 3 µs per table call).
local function encode_sbuf(body)
    ebuf:reset()
    ebuf:encode(body)
    return ebuf:get()
end
jit.off(encode_sbuf)
local EMPTY_TABLE = sbuf.encode({})

-- refusal(msg) is string.buffer's error for a table it does not encode,
-- in the words docs/protobuf.md lists: "cannot encode a function value"
-- (thread, userdata), "nested too deep (more than 100 levels, or a cycle)".
local MAX_DEPTH = 100
local function refusal(msg)
    msg = str_gsub(type(msg) == "string" and msg or tostring(msg),
                   "^[^:]*:%d+: ", "")
    local t = str_match(msg, "^cannot serialize '(%w+)'")
    if t then
        return "cannot encode a " .. t .. " value"
    end
    if msg == "too deep to serialize" then
        return "nested too deep (more than " .. MAX_DEPTH .. " levels, or a cycle)"
    end
    return msg
end

local _M = {
    F_DISCARD_UNKNOWN = F_DISCARD_UNKNOWN,
    F_PROTO_NAMES = F_PROTO_NAMES,
    F_LUA_TABLE = F_LUA_TABLE,
    F_LUA_REQUEST = F_LUA_REQUEST,
    -- An empty list for a repeated field (a plain {} is an empty object).
    empty_array = json.empty_array,
}

local lib               -- the loaded library (nil until then)
local ensure_loaded     -- qrpc.lua's loader
local records = {}      -- loads asked for, in order: { kind, arg, opts }
local applied = 0       -- how many of records this worker has compiled
-- What this worker has compiled, so that a load repeated on every request
-- costs a table lookup (Go would also skip it, after a stat of the file).
local done = {}


-- init(loader): loader() loads the library and returns true | nil, err.
function _M.init(loader)
    ensure_loaded = loader
end

-- attach(l): the library is loaded in this worker.
function _M.attach(l)
    lib = l
end


local function absolute(p)
    if str_sub(p, 1, 1) == "/" then
        return p
    end
    local prefix = ngx_prefix()
    if str_sub(prefix, -1) ~= "/" then
        prefix = prefix .. "/"
    end
    return prefix .. p
end


local ffi_string = ffi.string

-- Runs one load in Go (or, with op OP_PROTO_DESCRIBE, a description of
-- the file, returned as its JSON text).
local function query(rec, op)
    local cmd = abi.fill_cmd(ffi_new(abi.cmd_t), {
        op = op or OP_PROTO_LOAD, method = rec.kind, body = rec.arg,
        opts = rec.opts ~= "" and rec.opts or nil })
    local out_p = ffi_new("char *[1]")
    local out_len = ffi_new("size_t[1]")
    local errbuf = abi.new_errbuf()
    local rc = lib.qrpc_query(cmd, out_p, out_len, errbuf, abi.ERRBUF_LEN)
    local out = true
    if out_p[0] ~= nil then
        if op and rc == QRPC_OK then
            out = ffi_string(out_p[0], out_len[0])
        end
        lib.qrpc_release(out_p[0])
        out_p[0] = nil
    end
    if rc ~= QRPC_OK then
        return nil, abi.submit_err(rc, errbuf)
    end
    return out
end


-- ready() compiles what was recorded and not compiled yet in this worker.
-- A recorded load that fails is logged (once) and does not stop the others:
-- calls using its messages then fail with "unknown message type".
local function ready()
    local n = #records
    if applied == n and lib then
        return true
    end
    local ok, err = ensure_loaded()
    if not ok then
        return nil, err
    end
    while applied < n do
        applied = applied + 1
        local rec = records[applied]
        ok, err = query(rec)
        if ok then
            done[rec.kind .. "\0" .. rec.opts .. "\0" .. rec.arg] = true
        else
            ngx_log(ngx_ERR, "qrpc: ", err, " (loaded in init_by_lua)")
        end
    end
    return true
end
_M.ready = ready


local function load(kind, arg, opts)
    local rec = { kind = kind, arg = arg, opts = opts }
    if get_phase() == "init" then
        -- The master: record for the workers (they inherit records).
        records[#records + 1] = rec
        return true
    end
    local key = kind .. "\0" .. opts .. "\0" .. arg
    if done[key] then
        return true
    end
    local ok, err = ready()
    if not ok then
        return nil, err
    end
    ok, err = query(rec)
    if not ok then
        return nil, err
    end
    done[key] = true
    return true
end


function _M.load(path, opts)
    if type(path) ~= "string" then
        return bad(1, "path must be a string (got " .. type(path) .. ")")
    end
    if path == "" then
        return bad(1, "path must not be empty")
    end
    local paths, npaths = wire.new(), 0
    if opts ~= nil then
        if type(opts) ~= "table" then
            return bad(2, "opts must be a table (got " .. type(opts) .. ")")
        end
        for k in pairs(opts) do
            if k ~= "import_paths" then
                return bad(2, "unknown option '" .. tostring(k) .. "'")
            end
        end
        local ips = opts.import_paths
        if ips ~= nil then
            if type(ips) ~= "table" then
                return bad(2, "import_paths must be a list of directories")
            end
            for i = 1, #ips do
                local d = ips[i]
                if type(d) ~= "string" or d == "" or str_find(d, "\n", 1, true) then
                    return bad(2, "import_paths[" .. i .. "] must be a directory path")
                end
                wire.put(paths, IMPORT_PATH, absolute(d))
                npaths = npaths + 1
            end
        end
    end
    if str_find(path, "\n", 1, true) then
        return bad(1, "path must not contain a newline")
    end
    local where = path
    if npaths == 0 or str_sub(path, 1, 1) == "/" then
        -- With import paths, a relative path is an import name (protoc's
        -- rule); without, it is a file under nginx's prefix.
        where = absolute(path)
    end
    if get_phase() == "init" and (npaths == 0 or str_sub(path, 1, 1) == "/") then
        -- Cheap early check in the master; parsing waits for the workers.
        local f = io_open(where, "rb")
        if not f then
            return nil, "bad proto: " .. where .. ": file not found"
        end
        f:close()
    end
    return load("file", where, paths:tostring())
end


-- describe(path, import_paths) -> JSON text | nil, err: the services,
-- HTTP rules and messages of a .proto file (loaded first when it is not
-- yet), for resty.ffi.qrpc.gateway. Worker phases only. The arguments are
-- those of load, already checked (import_paths absolute).
function _M.describe(path, import_paths)
    local ok, err = ready()
    if not ok then
        return nil, err
    end
    local paths = wire.new()
    for i = 1, #import_paths do
        wire.put(paths, IMPORT_PATH, import_paths[i])
    end
    local where = path
    if #import_paths == 0 or str_sub(path, 1, 1) == "/" then
        where = absolute(path)
    end
    return query({ kind = "file", arg = where, opts = paths:tostring() },
                 abi.OP_PROTO_DESCRIBE)
end
_M.absolute = absolute


function _M.load_descriptor_set(bytes)
    if type(bytes) ~= "string" or bytes == "" then
        return bad(1, "descriptor set must be a non-empty string (protoc -o output)")
    end
    return load("descriptor_set", bytes, "")
end


-------------------------------------------------------------------------
-- Calls
-------------------------------------------------------------------------

local function check_type(v, argn, name)
    if v ~= nil and (type(v) ~= "string" or v == "" or #v > 1024) then
        return bad(argn, name .. " must be a message name like \"pkg.Msg\"")
    end
    return true
end


-- bind(methods) -> a plain, checked copy of connect's methods option, or
-- nil, err. The connection object connect returns for it carries the copy
-- (one object per methods table: the connection under it is shared).
local function bind(methods)
    if type(methods) ~= "table" then
        return bad(2, "methods must be a table { Method = { request = ..., "
                      .. "response = ..., hedge = ... } }")
    end
    local own = {}
    for name, m in pairs(methods) do
        if type(name) ~= "string" or type(m) ~= "table" then
            return bad(2, "methods must map method names to { request = ..., response = ... }")
        end
        for k in pairs(m) do
            if k ~= "request" and k ~= "response" and k ~= "json"
               and k ~= "discard_unknown" and k ~= "proto_names"
               and k ~= "emit_unpopulated" and k ~= "hedge" and k ~= "try_timeout"
            then
                return bad(2, "methods." .. name .. ": unknown option '" .. tostring(k) .. "'")
            end
        end
        -- hedge, try_timeout: the pool's per-call options for this method
        local copts, cerr = pool.method_opts(m, "methods." .. name)
        if not copts then
            return nil, cerr
        end
        local ok, err = check_type(m.request, 2, "methods." .. name .. ".request")
        if not ok then
            return nil, err
        end
        ok, err = check_type(m.response, 2, "methods." .. name .. ".response")
        if not ok then
            return nil, err
        end
        -- a plain copy: calls read it without the caller's metamethods
        local mjson, discard, names = m.json, m.discard_unknown, m.proto_names
        if mjson ~= nil and type(mjson) ~= "boolean" and mjson ~= "request"
           and mjson ~= "response"
        then
            return bad(2, "methods." .. name .. ".json must be true, false, "
                          .. "\"request\" or \"response\"")
        end
        if discard ~= nil and type(discard) ~= "boolean" then
            return bad(2, "methods." .. name .. ".discard_unknown must be a boolean")
        end
        if names ~= nil and type(names) ~= "boolean" then
            return bad(2, "methods." .. name .. ".proto_names must be a boolean")
        end
        local emit = m.emit_unpopulated
        if emit ~= nil and type(emit) ~= "boolean" then
            return bad(2, "methods." .. name .. ".emit_unpopulated must be a boolean")
        end
        own[name] = { request = m.request, response = m.response, json = mjson,
                      discard_unknown = discard, proto_names = names,
                      emit_unpopulated = emit,
                      copts = copts ~= "" and copts or nil }
    end
    return own
end

function _M.bind(methods)
    -- pcall: the tables and their metamethods are the caller's
    local ok, res, err = pcall(bind, methods)
    if not ok then
        return bad(2, "methods raised an error: "
                      .. (type(res) == "string" and res or tostring(res)))
    end
    return res, err
end


-- The error of a call's json, discard_unknown, proto_names,
-- emit_unpopulated, or nil.
local function check_flags(as_json, discard, names, emit)
    if as_json ~= nil and type(as_json) ~= "boolean" and as_json ~= "request"
       and as_json ~= "response"
    then
        return 'bad argument #4: json must be true, false, "request" or "response"'
    end
    if discard ~= nil and type(discard) ~= "boolean" then
        return "bad argument #4: discard_unknown must be a boolean"
    end
    if names ~= nil and type(names) ~= "boolean" then
        return "bad argument #4: proto_names must be a boolean"
    end
    if emit ~= nil and type(emit) ~= "boolean" then
        return "bad argument #4: emit_unpopulated must be a boolean"
    end
end


-- prepare(conn, method, body, opts) -> body, req, resp, flags, json
-- The message types of a call (opts over connect's methods) and its body,
-- a Lua table in string.buffer's format (or a JSON string with json = true
-- or "request"); json is whether the answer stays JSON text. Without
-- types it returns body unchanged and nothing else. On error: false, err.
function _M.prepare(conn, method, body, opts)
    local m = conn.methods and conn.methods[method]
    local req, resp, as_json, discard, names, emit
    if m then
        req, resp, as_json, discard, names = m.request, m.response, m.json,
                                             m.discard_unknown, m.proto_names
        emit = m.emit_unpopulated
    end
    if opts ~= nil and type(opts) == "table" then
        if opts.request ~= nil then
            req = opts.request
        end
        if opts.response ~= nil then
            resp = opts.response
        end
        if opts.json ~= nil then
            as_json = opts.json
        end
        if opts.discard_unknown ~= nil then
            discard = opts.discard_unknown
        end
        if opts.proto_names ~= nil then
            names = opts.proto_names
        end
        if opts.emit_unpopulated ~= nil then
            emit = opts.emit_unpopulated
        end
    end
    if req == nil and resp == nil then
        -- no types: the options that need them are still checked
        if as_json ~= nil or discard ~= nil or names ~= nil or emit ~= nil then
            local ferr = check_flags(as_json, discard, names, emit)
            if ferr then
                return false, ferr
            end
        end
        return body
    end
    local ok, err = check_type(req, 4, "request")
    if not ok then
        return false, err
    end
    ok, err = check_type(resp, 4, "response")
    if not ok then
        return false, err
    end
    local ferr = check_flags(as_json, discard, names, emit)
    if ferr then
        return false, ferr
    end
    -- JSON text on one side only: "response" is a table in and JSON text
    -- out (what a gateway writes to its HTTP client), "request" the other
    -- way round.
    local json_req = as_json == true or as_json == "request"
    local json_resp = as_json == true or as_json == "response"
    local lua_req
    if req then
        if json_req then
            if type(body) ~= "string" then
                return false, "bad argument #3: body must be a JSON string with "
                              .. "json = " .. (as_json == true and "true" or '"request"')
                              .. " (got " .. type(body) .. ")"
            end
        else
            if body == nil then
                body = EMPTY_TABLE
                lua_req = true
            elseif type(body) ~= "table" then
                return false, "bad argument #3: body must be a table for request "
                              .. req .. " (got " .. type(body)
                              .. "; pass json = true for a JSON string)"
            else
                local enc_ok, ser = pcall(encode_sbuf, body)
                if not enc_ok then
                    ebuf:reset()
                    return false, "bad argument #3: body: " .. refusal(ser)
                end
                body = ser
                lua_req = true
            end
        end
    end
    ok, err = ready()
    if not ok then
        return false, err
    end
    local flags = 0
    if discard then
        flags = flags + F_DISCARD_UNKNOWN
    end
    if names == nil then
        names = not json_resp
    end
    if names and resp then
        flags = flags + F_PROTO_NAMES
    end
    if resp and not json_resp then
        flags = flags + F_LUA_TABLE
    end
    if lua_req then
        flags = flags + F_LUA_REQUEST
    end
    if emit and resp then
        flags = flags + F_EMIT_UNPOPULATED
    end
    return body, req, resp, flags, json_resp
end


-- A reply in LuaJIT's format is decoded by the C method, compiled, under
-- pcall. It throws only on bytes Go did not write (Go writes the format
-- and checks its nesting, internal/luaserial), so the hazard above is not met
-- on this path. Keeping it out of the JIT too cost 1.5-2 µs more per call.
local sbuf_decode = dbuf.decode
-- For the test that checks it stays out of traces (nginx/TestProtobuf).
_M._not_compiled = { encode_sbuf }


-- finish(res, resp, as_json) -> res | nil, err, res: res.body decoded to a
-- table unless as_json (only for code 0: another code's body is the
-- service's error text).
function _M.finish(res, resp, as_json)
    if as_json or res.code ~= 0 then
        return res
    end
    local body = res.body
    local v, err
    if str_byte(body, 1) == 0 then
        dbuf:set(body):skip(1)
        local ok
        ok, v = pcall(sbuf_decode, dbuf)
        local left = #dbuf
        dbuf:reset()
        if not ok then
            -- LuaJIT's message, without the position of the call
            v, err = nil, "malformed reply: "
                          .. str_gsub(type(v) == "string" and v or tostring(v),
                                      "^[^:]*:%d+: ", "")
        elseif left ~= 0 then
            v, err = nil, "malformed reply: trailing bytes"
        end
    else
        -- Go writes every table reply in the format (QRPC_F_LUA_TABLE)
        err = "malformed reply: not in string.buffer's format"
    end
    if v == nil then
        return nil, "bad response: " .. resp .. ": " .. tostring(err), res
    end
    res.body = v
    return res
end


return _M
