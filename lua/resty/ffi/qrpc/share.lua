-- resty.ffi.qrpc.share: one view of a pool for every worker of an nginx
-- instance (connect's `shared` option, or configure's `pools_dict`).
--
-- Each worker keeps its own Go pool (balancing stays local); what the
-- pools learn of their servers goes through a lua_shared_dict:
--   * a server's ejection (until when) and its stall verdict: a worker
--     that ejects a server writes it, the others read it and apply it to
--     their pool (QRPC_OP_POOL_SHARE) before their next call's pick;
--   * a server's run of transport failures in a row (health.failures):
--     each worker adds the failures its pool counted, and an answer
--     after failures ends the run; the worker whose failures bring the
--     run to health.failures ejects the server (and writes the ejection
--     as above), the others take the run into their pool;
--   * the active checks and the re-resolution: one worker holds a lease
--     (a dict key with an expiry) and runs them; the others turn theirs
--     off and take the resolved address list from the dict.
--   * adaptive throttling: each worker publishes its window (requests and
--     accepts) and sheds on the sum of every worker's.
-- A worker syncs its view at most every SYNC_S while it takes calls (and
-- SYNC_S after its last call), at once after a failed call, and on its
-- lease timer when the pool has checks or re-resolution; an idle pool
-- without them costs nothing.
--
-- The dict keys of a pool start with "qrpc:" and a digest of its
-- addresses and pool options (every worker computes the same):
--   v          version, bumped by every change of the verdicts
--   e:<addr>   ejected until (ngx.now() seconds), 0 once back
--   t:<addr>   stalled (expires after STALL_TTL_S unless repeated)
--   f:<addr>   the run of failures in a row, over every worker (absent:
--              none; expires RUN_TTL_S after the last failure added)
--   ag, al     the resolved list's version and the list (in the form
--              of the binary record)
--   tr:<id>, ta:<id>  worker <id>'s adaptive throttling window: requests
--              and accepts of the last two minutes
--   probe, dns the leases (the holder's pid)

local abi = require "resty.ffi.qrpc.abi"
local builtin = require "resty.ffi.qrpc.host_builtin"
local record = require "resty.ffi.qrpc.share_record"

local ngx = ngx
local ngx_now = ngx.now
local ngx_md5 = ngx.md5
local timer_at = ngx.timer.at
local worker_pid = ngx.worker.pid
local worker_id = ngx.worker.id
local worker_count = ngx.worker.count
local log = ngx.log
local WARN = ngx.WARN
local math_floor = math.floor
local math_min = math.min
local math_max = math.max
local pairs = pairs
local type = type

local OP_POOL_SHARE = abi.OP_POOL_SHARE
local encode, decode = record.encode, record.decode
local encode_list, decode_list = record.encode_list, record.decode_list

-- How often a pool that takes calls brings its view in line (s): with the
-- import on the reader's side at its next sync, an ejection reaches every
-- worker that calls within two of these.
local SYNC_S = 0.03
-- After a failed call the sync runs at once, at most this often (s).
local FAIL_SYNC_S = 0.005
-- A stall verdict lapses this long after its worker last repeated it (s);
-- the worker repeats it every STALL_REPEAT_S while it holds.
local STALL_TTL_S = 1
local STALL_REPEAT_S = 0.4
-- Ejection keys outlive the ejection by this much (s), so that a worker
-- that comes to the pool later still reads "back" rather than nothing.
local KEY_SLACK_S = 60
-- Ejection ends closer than this are the same (s): Go rounds to ms.
local SAME_S = 0.05
-- The leader's lease timer runs at most this far apart (s), so that what
-- its checks find is published within it.
local LEAD_TICK_S = 0.1
-- adaptive throttling's window (s): a worker's published counts last it
local THROTTLE_WINDOW_S = 120
-- A run of failures no worker added to for this long lapses (s): the
-- key of a server that left the pool with failures does not stay.
local RUN_TTL_S = 600

local _M = {}

-- dict names already checked, by subsystem of this worker
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

-- option(v) -> the dict connect's shared option v stands for (nil: not
-- shared) | nil, err
function _M.option(v)
    if v == nil then
        return _M.default
    end
    if v == false then
        return nil
    end
    local ok, err = _M.check(v, 2, "shared")
    if not ok then
        return nil, err
    end
    return v
end


---------------------------------------------------------------------------
-- Sync
---------------------------------------------------------------------------

local function ask(st, verdicts, nv, list)
    local roles = (st.probe and 1 or 0) + (st.resolve and 2 or 0)
    local ans, err = builtin.query(OP_POOL_SHARE, st.e.handle,
                                   encode(roles, st.gen, verdicts, nv, list,
                                          st.oreqs, st.oaccs))
    if not ans then
        return nil, err
    end
    return decode(ans)
end

-- publish writes what changed in this worker's own view since its last
-- sync (transitions only: an imported verdict is not echoed back).
local function publish(st, peers, now)
    local dict, pk, gov = st.dict, st.pk, st.gov
    local changed = false
    for k = 1, #peers do
        local p = peers[k]
        local addr = p.addr
        local was = gov[addr]
        local until_ = p.ej and now + p.ms / 1000 or 0
        if p.ej then
            if not (was and was.ej) or until_ > was.until_ + SAME_S then
                local cur = dict:get(pk .. "e:" .. addr)
                if not cur or cur < until_ - SAME_S then
                    dict:set(pk .. "e:" .. addr, until_,
                             until_ - now + KEY_SLACK_S)
                    changed = true
                end
            end
        elseif was and was.ej then
            local cur = dict:get(pk .. "e:" .. addr)
            if cur and cur ~= 0 then
                dict:set(pk .. "e:" .. addr, 0, KEY_SLACK_S)
                changed = true
            end
        end
        if p.stall then
            if not (was and was.stall) or now >= (st.stall_told[addr] or 0)
            then
                dict:set(pk .. "t:" .. addr, true, STALL_TTL_S)
                st.stall_told[addr] = now + STALL_REPEAT_S
                changed = true
            end
        elseif was and was.stall then
            dict:delete(pk .. "t:" .. addr)
            st.stall_told[addr] = nil
            changed = true
        end
        gov[addr] = { ej = p.ej, until_ = until_, stall = p.stall }
    end
    if changed then
        dict:incr(pk .. "v", 1, 0)
    end
end

-- runs adds the failures in a row this worker's pool counted since its
-- last answer to the shared runs (f:<addr>); a run the pool ended (an
-- answer after failures, the server back) starts again from the failures
-- counted since. Nothing is written when nothing was counted or ended: a
-- pool whose calls are answered adds no dict writes. Returns the servers
-- whose run this worker's failures brought to health.failures (nil:
-- none), and whether a run changed (the caller bumps v once what it
-- publishes is written, so that the others take it all at once).
local function runs(st, peers)
    local dict, pk, seen, limit = st.dict, st.pk, st.seen, st.failures
    local reached, changed
    for k = 1, #peers do
        local p = peers[k]
        local addr = p.addr
        local s = seen[addr]
        if not s then
            seen[addr] = { nf = p.nf, nr = p.nr }
        elseif p.nr ~= s.nr then
            local key = pk .. "f:" .. addr
            if p.since > 0 then
                dict:set(key, p.since, RUN_TTL_S)
                changed, st.hot = true, true
            elseif dict:get(key) then
                dict:delete(key)
                changed = true
            end
            s.nf, s.nr = p.nf, p.nr
        elseif p.nf ~= s.nf then
            local key = pk .. "f:" .. addr
            local d = (p.nf - s.nf) % 4294967296
            s.nf = p.nf
            local run = dict:incr(key, d, 0, RUN_TTL_S)
            if run then
                if dict.expire then
                    dict:expire(key, RUN_TTL_S)
                end
                changed, st.hot = true, true
                if run >= limit and run - d < limit then
                    reached = reached or {}
                    reached[#reached + 1] = addr
                end
            end
        end
    end
    return reached, changed
end

-- verdict(st, addr, now) -> a server's shared verdict, as the dict has it
local function verdict(st, addr, now)
    local dict, pk = st.dict, st.pk
    local u = dict:get(pk .. "e:" .. addr)
    local flags, ms = 0, 0
    if u == nil or (u ~= 0 and u <= now) then
        -- nobody said, or an ejection over: this worker's trial
        -- calls and checks decide
        flags = 4
    elseif u ~= 0 then
        flags, ms = 1, math_min(math_floor((u - now) * 1000), 4294967295)
    end
    if dict:get(pk .. "t:" .. addr) ~= nil then
        flags = flags + 2
    end
    -- the run (8: given)
    local run = dict:get(pk .. "f:" .. addr) or 0
    return { addr = addr, flags = flags + 8, ms = ms,
             run = math_min(run, 4294967295) }
end

-- import reads every server's shared verdict into this worker's pool;
-- st.hot says whether a run is on.
local function import(st, now)
    local verdicts, nv, hot = {}, 0, false
    for addr in pairs(st.gov) do
        nv = nv + 1
        local v = verdict(st, addr, now)
        verdicts[nv] = v
        hot = hot or v.run > 0
    end
    st.hot = hot
    return verdicts, nv
end

local function sync(st)
    local now = ngx_now()
    st.next = now + SYNC_S
    st.last = now
    local dict, pk = st.dict, st.pk

    -- the resolved list: the resolving worker's, for the others
    local list
    if not st.resolve and st.resolve_s then
        local ag = dict:get(pk .. "ag")
        if ag and ag ~= st.ag then
            local rec = dict:get(pk .. "al")
            if rec then
                list = decode_list(rec, 1)
                st.ag = ag
            end
        end
    end

    local me = st.throttle and worker_id()
    if me then
        -- the other workers' windows, as they last published them
        local r, a = 0, 0
        for id = 0, worker_count() - 1 do
            if id ~= me then
                r = r + (dict:get(pk .. "tr:" .. id) or 0)
                a = a + (dict:get(pk .. "ta:" .. id) or 0)
            end
        end
        st.oreqs, st.oaccs = r, a
    end
    local gen, peers, glist, reqs, accs = ask(st, nil, 0, list)
    if not gen then
        return
    end
    local reached, changed = runs(st, peers)
    if reached then
        -- this worker's failures brought these runs to health.failures:
        -- its pool ejects them (16), as its own count would have, and the
        -- ejection is published below (the ejection as the pool has it: 4)
        local verdicts = {}
        for k = 1, #reached do
            local v = verdict(st, reached[k], now)
            v.flags = 4 + 8 + 16 + (v.flags % 4 >= 2 and 2 or 0)
            verdicts[k] = v
        end
        local g, p = ask(st, verdicts, #reached)
        if g then
            peers = p
            local _, more = runs(st, peers)
            changed = changed or more
        end
    end
    publish(st, peers, now)
    if changed then
        dict:incr(st.vkey, 1, 0)
    end
    if me then
        dict:set(pk .. "tr:" .. me, reqs, THROTTLE_WINDOW_S)
        dict:set(pk .. "ta:" .. me, accs, THROTTLE_WINDOW_S)
    end
    if glist and st.resolve then
        dict:set(pk .. "al", encode_list(glist))
        dict:incr(pk .. "ag", 1, 0)
        st.ag = dict:get(pk .. "ag")
    end
    st.gen = gen

    local v = dict:get(pk .. "v")
    if v ~= st.v then
        st.v = v
        local verdicts, nv = import(st, now)
        if nv > 0 then
            gen, peers = ask(st, verdicts, nv)
            if gen then
                local _, more = runs(st, peers)
                if more then
                    dict:incr(st.vkey, 1, 0)
                end
                -- what Go holds now, imports included: the base of the
                -- next sync's transitions
                local gov = st.gov
                for k = 1, #peers do
                    local p = peers[k]
                    local g = gov[p.addr]
                    if g then
                        g.ej = p.ej
                        g.until_ = p.ej and now + p.ms / 1000 or 0
                    end
                end
            end
        end
    end
end
_M.sync = sync

-- The call path syncs when due; a call made before then leaves a timer
-- that syncs when it is due, so that what the last calls of a burst
-- changed (a throttling window, a stall) is published within SYNC_S
-- even if no call follows.
local function trailing(premature, st)
    st.trail = false
    local e = st.e
    if premature or e.closed or e.state ~= "ready" then
        return
    end
    -- due by construction (the clock the timer ran on may read a
    -- millisecond short of st.next)
    sync(st)
end

-- arm leaves the trailing timer for st.next, unless one is armed.
local function arm(st, now)
    if not st.trail then
        st.trail = true
        if not timer_at(st.next - now, trailing, st) then
            st.trail = false
        end
    end
end

-- While a server's run of failures is on (st.hot), a call first checks
-- the dict's version, and syncs when another worker changed a verdict:
-- the run reaching health.failures elsewhere ejects the server here
-- before this call's pick, not up to SYNC_S later. A pool whose servers
-- answer pays nothing of it.
function _M.due(st)
    local now = ngx_now()
    if now >= st.next or st.hot and st.dict:get(st.vkey) ~= st.v then
        sync(st)
    else
        arm(st, now)
    end
end

-- called after a failed call: what failed may have ejected a server, or
-- added to a run; too soon after the last sync, the next call (or the
-- trailing timer) syncs once FAIL_SYNC_S has passed
function _M.failed(st)
    local now = ngx_now()
    if now >= st.last + FAIL_SYNC_S then
        sync(st)
    elseif st.next > st.last + FAIL_SYNC_S then
        st.next = st.last + FAIL_SYNC_S
        arm(st, now)
    end
end


---------------------------------------------------------------------------
-- Leases
---------------------------------------------------------------------------

local function lease(dict, key, pid, ttl)
    if dict:add(key, pid, ttl) then
        return true
    end
    if dict:get(key) == pid then
        dict:set(key, pid, ttl)
        return true
    end
    return false
end

local function release(st)
    local pid = worker_pid()
    for _, k in pairs({ "probe", "dns" }) do
        local key = st.pk .. k
        if st.dict:get(key) == pid then
            st.dict:delete(key)
        end
    end
    st.probe, st.resolve = false, false
end

local tick

local function take_roles(st)
    local pid, dict, pk = worker_pid(), st.dict, st.pk
    if st.check_s then
        st.probe = lease(dict, pk .. "probe", pid, st.ttl)
    end
    if st.resolve_s then
        st.resolve = lease(dict, pk .. "dns", pid, st.ttl)
    end
end

tick = function(premature, st)
    local e = st.e
    if premature or e.closed or e.state ~= "ready" then
        release(st)
        return
    end
    take_roles(st)
    sync(st)
    local gap = st.period
    if st.probe or st.resolve then
        gap = math_min(gap, LEAD_TICK_S)
    end
    local ok, err = timer_at(gap, tick, st)
    if not ok then
        log(WARN, "qrpc shared pool: no lease timer: ", err)
        release(st)
    end
end


-- attach(e, name, spec) -> the share state of cache entry e (a ready
-- connection), synced once.
function _M.attach(e, name, spec)
    local dict = dict_of(name)
    local st = {
        e = e, dict = dict,
        pk = "qrpc:" .. ngx_md5(e.addr .. "|" .. e.pool_key) .. ":",
        hot = false,
        next = 0, last = 0, v = false, gen = 0, ag = false,
        gov = {}, stall_told = {}, seen = {},
        failures = spec.failures or 3,
        check_s = spec.check_ms and spec.check_ms > 0
                  and spec.check_ms / 1000 or nil,
        resolve_s = spec.resolve_ms and spec.resolve_ms > 0
                    and spec.resolve_ms / 1000 or nil,
        probe = true, resolve = true,
        throttle = spec.throttle, oreqs = 0, oaccs = 0,
    }
    st.vkey = st.pk .. "v"
    if st.check_s or st.resolve_s then
        -- a lease holder that exits or stops renewing loses it within
        -- half its period; the others try every quarter
        local p = math_min(st.check_s or st.resolve_s,
                           st.resolve_s or st.check_s)
        st.period = math_max(p / 4, 0.01)
        st.ttl = math_max(p / 2, 0.02)
        take_roles(st)
        local ok, err = timer_at(st.period, tick, st)
        if not ok then
            log(WARN, "qrpc shared pool: no lease timer: ", err)
        end
    else
        st.probe, st.resolve = false, false
    end
    sync(st)
    return st
end

return _M
