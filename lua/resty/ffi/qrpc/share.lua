-- resty.ffi.qrpc.share: one view of a pool for every worker of an nginx
-- instance (connect's `shared` option, or configure's `pools_dict`).
--
-- Each worker keeps its own Go pool (balancing stays local). What the
-- pools learn of their servers goes through a lua_shared_dict, and all
-- the logic of it is in Go (qrpc/pool_share.go): a step of a pool asks
-- this module to run a few dict operations (get, add, set, incr, delete)
-- under the pool's key prefix and hands Go their results, until Go says
-- the step is over. This module reads none of what it moves, and keeps
-- nothing per server.
--
-- A pool steps:
--   * on the call path: when the dict's version moved since its last
--     step (another worker published something; one dict read per
--     call), or SYNC_S after its last step while it takes calls;
--   * when Go asks (a QRPC_SHARE completion, the way log lines travel):
--     a failure counted, an ejection, a check's verdict, a new list;
--   * for the leases of pools with active checks or re-resolution: the
--     holder when they are due for renewal, the others when the lease
--     they saw ends or its holder's process exits. Go's own timer asks
--     (as above), so no Lua timer has to run for it and
--     lua_max_running_timers cannot starve it. Both hosts dial through
--     the built-in host (cache.lua), which takes the request; for a pool
--     whose host would not (attach says so), one ngx.timer.every per
--     worker steps them once a lease period instead (a second one only
--     for a pool whose period is less than half the first's).
-- A step's last answer carries the next step's first round, which runs
-- as that step begins: an idle step is one exchange with Go. The steps
-- Go asks for go through the built-in host's submit queue, their
-- answers coming back as QRPC_SHARE completions, so that the nginx
-- thread does not enter Go for them; the others (on the call path, at
-- attach, exit and close, and the lease timer's ticks) run on the nginx
-- thread through qrpc_query. A step of one kind drops
-- the other's that is on its way.
-- When the worker exits, or a pool closes, the pool gives up the leases
-- it holds (from the dispatcher, the timers' last, premature run, or the
-- cache's close), so that another worker takes them at its next step.

local abi = require "resty.ffi.qrpc.abi"
local builtin = require "resty.ffi.qrpc.host_builtin"

local ngx = ngx
local ngx_now = ngx.now
local ngx_md5 = ngx.md5
local timer_every = ngx.timer.every
local worker_id = ngx.worker.id
local worker_count = ngx.worker.count
local log = ngx.log
local WARN = ngx.WARN
local str_byte = string.byte
local str_char = string.char
local str_sub = string.sub
local str_format = string.format
local str_match = string.match
local tab_concat = table.concat
local math_floor = math.floor
local pairs = pairs
local type = type
local tostring = tostring
local tonumber = tonumber

local OP_POOL_SHARE = abi.OP_POOL_SHARE

-- While a pool takes calls it steps at least this often (s): its stall
-- verdicts are repeated and its throttling window published.
local SYNC_S = 0.1
-- A step is a few exchanges with Go; a step that asks for more is cut.
local MAX_ROUNDS = 8
-- A step through the queue whose answer has not come within this long
-- (s) is taken as lost: the next one may begin.
local QUEUED_S = 1

local MODE_STEP, MODE_EXIT, MODE_ATTACH = 1, 2, 3
-- QRPC_SHARE completions' codes (internal/bridge/share.go)
local ASK, ANSWER = 0, 1
local OP_GET, OP_ADD, OP_SET, OP_INCR, OP_DELETE = 1, 2, 3, 4, 5

local _M = {}

local function dict_of(name)
    local shared = ngx.shared
    return shared and shared[name]
end

-- check(name) -> true | nil, err: name is a lua_shared_dict of this
-- subsystem.
function _M.check(name, argn, what)
    if type(name) ~= "string" or name == "" then
        return nil, "bad argument #" .. argn .. ": " .. what
                    .. " must be the name of a lua_shared_dict"
    end
    if not dict_of(name) then
        return nil, "bad argument #" .. argn .. ": " .. what
                    .. ": no lua_shared_dict named '" .. name .. "'"
    end
    return true
end


-- configure{ pools_dict }: the dict of the connects that name none
_M.default = nil

function _M.set_default(name)
    _M.default = name
end

-- option(v) -> dict, name (nil: not shared) | nil, nil, err: the dict and
-- the pool's name that connect's shared option v stands for. v is a dict
-- name, or { dict = <name>, name = <the pool's name in it> }.
function _M.option(v)
    if v == nil then
        return _M.default
    end
    if v == false then
        return nil
    end
    if type(v) == "table" then
        local ok, err = _M.check(v.dict, 2, "shared.dict")
        if not ok then
            return nil, nil, err
        end
        local name = v.name
        if name ~= nil and (type(name) ~= "string" or name == ""
                            or #name > 128 or str_match(name, "[%c ]"))
        then
            return nil, nil, "bad argument #2: shared.name must be a"
                             .. " non-empty string of at most 128"
                             .. " characters without spaces"
        end
        for k in pairs(v) do
            if k ~= "dict" and k ~= "name" then
                return nil, nil, "bad argument #2: shared: unknown key '"
                                 .. tostring(k) .. "' (dict, name)"
            end
        end
        return v.dict, name
    end
    local ok, err = _M.check(v, 2, "shared")
    if not ok then
        return nil, nil, err
    end
    return v
end


---------------------------------------------------------------------------
-- The step record (its form: internal/bridge/share.go)
---------------------------------------------------------------------------

local function u16(n)
    return str_char(n % 256, math_floor(n / 256) % 256)
end

local function u32(n)
    return str_char(n % 256, math_floor(n / 256) % 256,
                    math_floor(n / 65536) % 256,
                    math_floor(n / 16777216) % 256)
end

local function rd16(s, i)
    local a, b = str_byte(s, i, i + 1)
    return a + b * 256
end

local function rd32(s, i)
    local a, b, c, d = str_byte(s, i, i + 3)
    return a + b * 256 + c * 65536 + d * 16777216
end

local function result(buf, n, v)
    local t = type(v)
    if t == "string" then
        buf[n + 1] = "\1" .. u32(#v) .. v
    elseif t == "number" then
        local s = str_format("%.0f", v)
        buf[n + 1] = "\2" .. u32(#s) .. s
    elseif v == true then
        buf[n + 1] = "\3\0\0\0\0"
    else
        buf[n + 1] = "\0\0\0\0\0"
    end
    return n + 1
end

-- run executes the ops of Go's answer ans; returns whether Go wants their
-- results, the record carrying them, and the next step's first ops (an
-- answer of their own) when Go gave them.
local function run(dict, pk, ans)
    local flag = str_byte(ans, 1)
    local more = flag == 1
    local n = rd16(ans, 2)
    local i = 4
    local buf, nb = { "\0", u16(n) }, 2
    for _ = 1, n do
        local op = str_byte(ans, i)
        local kl = rd16(ans, i + 1)
        local key = pk .. str_sub(ans, i + 3, i + 2 + kl)
        i = i + 3 + kl
        local vl = rd32(ans, i)
        local val = str_sub(ans, i + 4, i + 3 + vl)
        i = i + 4 + vl
        local ttl = rd32(ans, i) / 1000
        i = i + 4
        local r
        if op == OP_GET then
            r = dict:get(key)
        elseif op == OP_ADD then
            r = dict:add(key, val, ttl) and true or nil
        elseif op == OP_SET then
            r = dict:set(key, val, ttl) and true or nil
        elseif op == OP_INCR then
            local d, init = str_match(val, "^(%-?%d+) (%-?%d+)$")
            r = dict:incr(key, tonumber(d), tonumber(init), ttl)
            if r and ttl > 0 and dict.expire then
                dict:expire(key, ttl)
            end
        elseif op == OP_DELETE then
            dict:delete(key)
            r = true
        end
        if more then
            nb = result(buf, nb, r)
        end
    end
    return more, more and tab_concat(buf, "", 1, nb),
           flag == 2 and "\1" .. str_sub(ans, i) or nil
end

local function query(st, rec)
    return builtin.query(OP_POOL_SHARE, st.e.handle, rec)
end

-- queued(st): whether a step through the queue is on its way.
local function queued(st)
    return st.queued and ngx_now() - st.queued_at < QUEUED_S
end

-- first(st): the record that begins a step, with the results of the
-- first round the last step's answer gave.
local function first(st)
    local pre = st.pre
    st.pre = nil
    if not pre then
        return str_char(MODE_STEP)
    end
    local _, rec = run(st.dict, st.pk, pre)
    return "\1" .. str_sub(rec, 2)
end

local function warn(st, err)
    if not st.warned then
        st.warned = true
        log(WARN, "qrpc shared pool: step failed: ", err)
    end
end

-- step(st, mode) runs one step of pool st on this thread, entering Go
-- for each exchange; false when the pool is gone.
local function step(st, mode)
    local e = st.e
    if e.closed or e.state ~= "ready" then
        return false
    end
    st.queued = nil -- one on its way is dropped (Go refuses its rest)
    st.next = ngx_now() + SYNC_S
    local ans, err = query(st, mode == MODE_STEP and first(st)
                               or str_char(mode))
    for _ = 1, MAX_ROUNDS do
        if not ans then
            warn(st, err)
            return true
        end
        local more, rec, nxt = run(st.dict, st.pk, ans)
        if not more then
            st.pre = nxt
            break
        end
        ans, err = query(st, rec)
    end
    st.v = st.dict:get(st.vkey)
    return true
end

-- send(st, rec) queues a step's record: Go answers it with a QRPC_SHARE
-- completion (answered), so that the nginx thread never enters Go for
-- the steps Go asks for (the steps of an idle pool).
local function send(st, rec)
    local id, err = builtin.post(OP_POOL_SHARE, st.e.handle, rec)
    if not id then
        st.queued = nil
        warn(st, err)
        return
    end
    st.queued, st.queued_at = id, ngx_now()
end

-- begin(st): a step through the queue; false when the pool is gone.
local function begin(st)
    local e = st.e
    if e.closed or e.state ~= "ready" then
        return false
    end
    st.next = ngx_now() + SYNC_S
    st.rounds = 0
    send(st, first(st))
    return true
end

-- answered(st, ans): the answer to the step's last record.
local function answered(st, ans)
    st.rounds = st.rounds + 1
    local more, rec, nxt = run(st.dict, st.pk, ans)
    if more and st.rounds < MAX_ROUNDS then
        send(st, rec) -- mode 0: go on
        return
    end
    st.queued = nil
    if not more then
        st.pre = nxt
    end
    st.v = st.dict:get(st.vkey)
    if st.again then
        st.again = nil
        begin(st)
    end
end

---------------------------------------------------------------------------
-- The pools of this worker, and their lease timers
---------------------------------------------------------------------------

-- pools by connection handle (a number)
local pools = {}
-- the period (s) of each running lease timer
local timers = {}
local shortest

local function tick(premature)
    local now = ngx_now()
    for h, st in pairs(pools) do
        local e = st.e
        if e.closed or e.state ~= "ready" then
            pools[h] = nil
        elseif premature or ngx.worker.exiting() then
            if not st.left then
                st.left = true
                step(st, MODE_EXIT)
            end
        elseif st.period and now >= st.lease_at then
            st.lease_at = now + st.period * 0.9
            step(st, MODE_STEP)
        end
    end
end

local function ensure_timer(period)
    if shortest and period >= shortest / 2 then
        return
    end
    local ok, err = timer_every(period, tick)
    if not ok then
        log(WARN, "qrpc shared pool: no lease timer: ", err)
        return
    end
    timers[#timers + 1] = period
    shortest = period
end

-- A QRPC_SHARE completion for the pool of connection handle h: Go asks
-- for a step (code ASK), or answers the record of call id id (data: the
-- answer; or the message of its failure).
local function asked(h, code, id, data)
    local st = pools[tonumber(h)]
    if not st or st.left then
        return
    end
    if code ~= ASK then
        if id ~= st.queued then
            return -- a step given up as lost, or replaced by one here
        end
        if code == ANSWER and data then
            answered(st, data)
        else
            st.queued = nil
            warn(st, data or "no memory for the answer")
            if st.again then
                -- an ask that came meanwhile still wants its step
                st.again = nil
                begin(st)
            end
        end
        return
    end
    if queued(st) then
        st.again = true -- once the step on its way has ended
    elseif not begin(st) then
        pools[tonumber(h)] = nil
    end
end
-- The worker exits: every pool gives up its leases.
local function exiting()
    for h, st in pairs(pools) do
        if not st.left then
            st.left = true
            if not step(st, MODE_EXIT) then
                pools[h] = nil
            end
        end
    end
end
-- The module table holds its hooks: the host holds them weakly (it
-- outlives a module instance that a re-require dropped).
_M.asked, _M.exiting = asked, exiting
builtin.add_hooks(asked, exiting)

-- attach(e, dict, name) -> the share state of cache entry e (a ready
-- connection), stepped once.
function _M.attach(e, dict_name, name)
    local dict = dict_of(dict_name)
    local pk = "qrpc:" .. (name and ("n:" .. name) or ngx_md5(e.ident)) .. ":"
    local st = { e = e, dict = dict, pk = pk, vkey = pk .. "v", next = 0,
                 v = false, lease_at = 0 }
    local ans, err = query(st, str_char(MODE_ATTACH)
                               .. u16(worker_id() or 0)
                               .. u16(worker_count()))
    if not ans then
        log(WARN, "qrpc shared pool: not shared: ", err)
        return nil
    end
    local ms = rd32(ans, 1)
    if ms > 0 and str_byte(ans, 5) ~= 1 then
        st.period = ms / 1000
        ensure_timer(st.period)
    end
    pools[tonumber(e.handle)] = st
    step(st, MODE_STEP)
    return st
end

-- leave(st): the pool closes (connection closed, or evicted from the
-- cache): it gives up the leases it holds at once, so that another worker
-- takes them at its next step instead of when they lapse.
function _M.leave(st)
    if not st.left then
        st.left = true
        step(st, MODE_EXIT)
    end
    pools[tonumber(st.e.handle)] = nil
end

-- due(st): before a call. One dict read while nothing changed; nothing
-- while a step through the queue is on its way.
function _M.due(st)
    if (ngx_now() >= st.next or st.dict:get(st.vkey) ~= st.v)
       and not queued(st)
    then
        step(st, MODE_STEP)
    end
end

-- what the tests see of this worker
function _M.timers()
    return #timers
end

return _M
