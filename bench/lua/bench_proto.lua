-- Protobuf transcoding benchmarks (bench/proto.go): the same echo call
-- with demo.Profile as a Lua table (opts.request/opts.response) or as raw
-- protobuf bytes, and the JSON gateway locations wrk loads.
--
-- The message comes from bench_profile.lua, written by the harness from one
-- Go value: its proto3 JSON (decoded here into the Lua table) and its
-- protobuf encoding, so both modes carry the same message.
local qrpc = require "resty.ffi.qrpc"
local json = require "resty.ffi.qrpc.json"
local cfg = require "bench_config"
local bc = require "bench_common"

local ngx = ngx
local type = type
local tonumber = tonumber
local floor = math.floor
local min = math.min
local tostring = tostring

local _M = {}

local clock = bc.clock
local CLOCK_MONOTONIC = bc.MONOTONIC
local CLOCK_PROCESS_CPUTIME_ID = bc.PROCESS_CPUTIME
local CLOCK_THREAD_CPUTIME_ID = bc.THREAD_CPUTIME

local CONN_OPTS = { ca = cfg.ca, server_name = "localhost" }
local TABLE_OPTS = { request = "demo.Profile", response = "demo.Profile" }
local JSON_OPTS = { request = "demo.Profile", response = "demo.Profile", json = true }
local BLOCK = 50 -- calls of one mode before switching to the other
local WARMUP = 200

local state -- { tbl = Lua table, pb = bytes, json = text }, once per worker

-- The process's context switches: a call that hands work to more
-- goroutines, or wakes more threads, shows here per call.
local ctx_switches = bc.switches

local function setup()
    if state then
        return state
    end
    local ok, err = qrpc.proto.load(cfg.proto)
    if not ok then
        return nil, err
    end
    local data = require "bench_profile"
    local tbl
    tbl, err = json.decode(data.json)
    if not tbl then
        return nil, "bench_profile.json: " .. tostring(err)
    end
    state = { tbl = tbl, pb = data.pb, json = data.json }
    return state
end

local function table_loop(conn, st, n)
    local errs = 0
    local want = st.tbl.name
    for _ = 1, n do
        local res = conn:unary("echo", st.tbl, TABLE_OPTS)
        if not res or res.code ~= 0 or type(res.body) ~= "table" or res.body.name ~= want then
            errs = errs + 1
        end
    end
    return errs
end

-- One side typed, the other bytes: where table mode's added cost is, the
-- request (table -> protobuf) or the response (protobuf -> table).
local REQ_OPTS = { request = "demo.Profile" }
local RESP_OPTS = { response = "demo.Profile" }

local function req_only_loop(conn, st, n)
    local errs = 0
    local len = #st.pb
    for _ = 1, n do
        local res = conn:unary("echo", st.tbl, REQ_OPTS)
        if not res or res.code ~= 0 or #res.body ~= len then
            errs = errs + 1
        end
    end
    return errs
end

local function resp_only_loop(conn, st, n)
    local errs = 0
    local want = st.tbl.name
    for _ = 1, n do
        local res = conn:unary("echo", st.pb, RESP_OPTS)
        if not res or res.code ~= 0 or type(res.body) ~= "table" or res.body.name ~= want then
            errs = errs + 1
        end
    end
    return errs
end

-- The same message as JSON text both ways (json = true): Go transcodes
-- as for a table, Lua neither encodes nor decodes a table.
local function json_loop(conn, st, n)
    local errs = 0
    local js = st.json
    for _ = 1, n do
        local res = conn:unary("echo", js, JSON_OPTS)
        if not res or res.code ~= 0 or type(res.body) ~= "string" or #res.body < #js / 2 then
            errs = errs + 1
        end
    end
    return errs
end

local function bytes_loop(conn, st, n)
    local errs = 0
    local pb = st.pb
    for _ = 1, n do
        local res = conn:unary("echo", pb)
        if not res or res.code ~= 0 or #res.body ~= #pb then
            errs = errs + 1
        end
    end
    return errs
end

-- GET /bench/proto?n=N: N sequential calls in each mode, from this light
-- thread, in alternating blocks (the order flipped every round) so that
-- the machine's load, which drifts on a shared host, weighs on both alike.
-- Answers wall and CPU seconds (the worker process, and its nginx thread)
-- of each mode.
function _M.run()
    local n = tonumber(ngx.var.arg_n) or 1000
    local st, err = setup()
    if not st then
        ngx.status = 500
        ngx.say(err)
        return
    end
    local conn
    conn, err = qrpc.connect(cfg.addr, CONN_OPTS)
    if not conn then
        ngx.status = 500
        ngx.say(err)
        return
    end
    local warm_errs = table_loop(conn, st, WARMUP) + bytes_loop(conn, st, WARMUP)
                      + json_loop(conn, st, WARMUP)
                      + req_only_loop(conn, st, WARMUP) + resp_only_loop(conn, st, WARMUP)
    if warm_errs > 0 then
        -- say why once, rather than count failures
        local res, e = conn:unary("echo", st.tbl, TABLE_OPTS)
        ngx.log(ngx.ERR, "bench_proto warm-up: ", warm_errs, " failed calls; a table call: ",
                res and ("code " .. tostring(res.code) .. ", body a " .. type(res.body))
                    or tostring(e))
    end

    local loops = { table_loop, bytes_loop, json_loop, req_only_loop, resp_only_loop }
    -- ?only=k: mode k alone, for profiling by hand (bench -hold)
    local only = tonumber(ngx.var.arg_only)
    if only and loops[only] then
        local t0 = clock(CLOCK_MONOTONIC)
        local e = loops[only](conn, st, n)
        ngx.say('{"mode":', only, ',"calls":', n, ',"errors":', e,
                ',"secs":', clock(CLOCK_MONOTONIC) - t0, '}')
        return
    end
    local nm = #loops
    local secs, cpu, tcpu, errs, csw = {}, {}, {}, {}, {}
    for m = 1, nm do
        secs[m], cpu[m], tcpu[m], errs[m], csw[m] = 0, 0, 0, 0, 0
    end
    local done, round = 0, 0
    while done < n do
        local b = min(BLOCK, n - done)
        for k = 1, nm do
            -- The order rotates every round and runs backwards every
            -- other one: a block pays for garbage (Lua's, Go's) the block
            -- before it left, so no mode may always follow the same one.
            local kk = round % 2 == 0 and k or nm + 1 - k
            local m = (kk + round - 1) % nm + 1
            local s0 = ctx_switches()
            local t0, c0 = clock(CLOCK_MONOTONIC), clock(CLOCK_PROCESS_CPUTIME_ID)
            local h0 = clock(CLOCK_THREAD_CPUTIME_ID)
            errs[m] = errs[m] + loops[m](conn, st, b)
            tcpu[m] = tcpu[m] + clock(CLOCK_THREAD_CPUTIME_ID) - h0
            secs[m] = secs[m] + clock(CLOCK_MONOTONIC) - t0
            cpu[m] = cpu[m] + clock(CLOCK_PROCESS_CPUTIME_ID) - c0
            csw[m] = csw[m] + ctx_switches() - s0
        end
        done, round = done + b, round + 1
    end
    local function mode(m)
        return '{"secs":' .. secs[m] .. ',"cpu":' .. cpu[m] .. ',"thread_cpu":' .. tcpu[m]
               .. ',"ctx_switches":' .. csw[m] .. '}'
    end
    local nerr = 0
    for m = 1, nm do
        nerr = nerr + errs[m]
    end
    ngx.say('{"calls":', floor(done), ',"errors":', nerr,
            ',"table":', mode(1), ',"bytes":', mode(2), ',"json":', mode(3),
            ',"req_only":', mode(4), ',"resp_only":', mode(5), '}')
end

-- GET /bench/proto_par?n=N&c=C: N calls in each mode (table, bytes) from
-- C light threads at once, the modes alternating in rounds of C * 20
-- calls. With calls in flight the worker's threads are rarely idle, so
-- its CPU per call is mostly work rather than the wake-ups and spinning
-- that dominate it in sequential calls (see bench/proto.go).
function _M.run_par()
    local n = tonumber(ngx.var.arg_n) or 10000
    local c = tonumber(ngx.var.arg_c) or 20
    local st, err = setup()
    if not st then
        ngx.status = 500
        ngx.say(err)
        return
    end
    local conn
    conn, err = qrpc.connect(cfg.addr, CONN_OPTS)
    if not conn then
        ngx.status = 500
        ngx.say(err)
        return
    end
    local per = 20
    local loops = { table_loop, bytes_loop }
    local secs, cpu, errs = { 0, 0 }, { 0, 0 }, 0
    local threads = {}
    local function round(m)
        local t0, c0 = clock(CLOCK_MONOTONIC), clock(CLOCK_PROCESS_CPUTIME_ID)
        for i = 1, c do
            threads[i] = ngx.thread.spawn(loops[m], conn, st, per)
        end
        for i = 1, c do
            local ok, e = ngx.thread.wait(threads[i])
            errs = errs + (ok and e or per)
        end
        secs[m] = secs[m] + clock(CLOCK_MONOTONIC) - t0
        cpu[m] = cpu[m] + clock(CLOCK_PROCESS_CPUTIME_ID) - c0
    end
    round(1)
    round(2) -- warm-up, not counted
    secs, cpu, errs = { 0, 0 }, { 0, 0 }, 0
    local done, r = 0, 0
    while done < n do
        for k = 1, 2 do
            round((k + r) % 2 + 1)
        end
        done, r = done + c * per, r + 1
    end
    ngx.say('{"calls":', floor(done), ',"errors":', errs,
            ',"table":{"secs":', secs[1], ',"cpu":', cpu[1],
            '},"bytes":{"secs":', secs[2], ',"cpu":', cpu[2], '}}')
end

-- POST /gw/proto/json (JSON body, JSON answer: the gateway) and
-- POST /gw/proto/raw (protobuf body, protobuf answer: its baseline): one
-- echo call per request, connected as /e2e/qrpc does.
-- The REST gateway over the same echo call: POST /gw/rest/v1/echo with
-- the JSON body (bench/proto/bench_http.proto), built once per worker.
-- /gw/compat/: the same routes with compat = "grpc-gateway".
local rest_gws = {}
function _M.rest(compat)
    local key = compat and "compat" or "rest"
    local gw = rest_gws[key]
    if not gw then
        local gateway = require "resty.ffi.qrpc.gateway"
        local err
        gw, err = gateway.new{
            upstream = cfg.addr, opts = CONN_OPTS, prefix = "/gw/" .. key,
            protos = { files = { cfg.rest_proto },
                       import_paths = { cfg.rest_dir, cfg.proto_dir } },
            compat = compat and "grpc-gateway" or nil,
        }
        if not gw then
            ngx.status = 500
            ngx.say(err)
            return
        end
        rest_gws[key] = gw
    end
    gw:serve()
end


-- GET /gw/hand/<name>?age=N&email=E, by hand: what the REST route
-- GET /gw/rest/v1/profile/{name} does, for the benchmark's baseline.
function _M.hand()
    local name = ngx.var.uri:match("^/gw/hand/([^/]+)$")
    local args = ngx.req.get_uri_args()
    local body = json.encode({ name = name, age = tonumber(args.age),
                               email = args.email })
    local conn, err = qrpc.connect(cfg.addr, CONN_OPTS)
    if not conn then
        ngx.status = 502
        ngx.say(err)
        return
    end
    local res
    res, err = conn:unary("echo", body, JSON_OPTS)
    if not res then
        ngx.status = 502
        ngx.say(err)
        return
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.print(res.body)
end


function _M.gateway(as_json)
    local _, err = setup()
    if err then
        ngx.status = 500
        ngx.say(err)
        return
    end
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if not body then
        ngx.status = 400
        ngx.say("no body (or not in memory)")
        return
    end
    local conn
    conn, err = qrpc.connect(cfg.addr, CONN_OPTS)
    if not conn then
        ngx.status = 502
        ngx.say(err)
        return
    end
    local res
    if as_json then
        res, err = conn:unary("echo", body, JSON_OPTS)
    else
        res, err = conn:unary("echo", body)
    end
    if not res then
        ngx.status = err:find("bad message: ", 1, true) == 1 and 400 or 502
        ngx.say(err)
        return
    end
    if res.code ~= 0 then
        ngx.status = 502
        ngx.say("code ", res.code)
        return
    end
    ngx.header["Content-Type"] = as_json and "application/json" or "application/x-protobuf"
    ngx.print(res.body)
end

return _M
