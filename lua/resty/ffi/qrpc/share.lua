-- resty.ffi.qrpc.share: one view of a pool for every worker of an nginx
-- instance (connect's `shared` option, or configure's `pools_dict`).
--
-- Each worker keeps its own Go pool (balancing stays local); what the
-- pools learn of their servers goes through a lua_shared_dict:
--   * a server's ejection (until when) and its stall verdict: a worker
--     that ejects a server writes it, the others read it and apply it to
--     their pool (QRPC_OP_POOL_SHARE) before their next call's pick;
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
--   ag, al     the resolved list's version and the list (in the form
--              of the binary record)
--   tr:<id>, ta:<id>  worker <id>'s adaptive throttling window: requests
--              and accepts of the last two minutes
--   probe, dns the leases (the holder's pid)

local abi = require "resty.ffi.qrpc.abi"
local builtin = require "resty.ffi.qrpc.host_builtin"

local ngx = ngx
local ngx_now = ngx.now
local ngx_md5 = ngx.md5
local timer_at = ngx.timer.at
local worker_pid = ngx.worker.pid
local worker_id = ngx.worker.id
local worker_count = ngx.worker.count
local log = ngx.log
local WARN = ngx.WARN
local str_byte = string.byte
local str_char = string.char
local str_sub = string.sub
local tab_concat = table.concat
local math_floor = math.floor
local math_min = math.min
local math_max = math.max
local pairs = pairs
local type = type

local OP_POOL_SHARE = abi.OP_POOL_SHARE

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
-- The binary record of QRPC_OP_POOL_SHARE (internal/bridge/share.go)
---------------------------------------------------------------------------

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
        b[#b + 1] = str_char(v.flags) .. u32(v.ms) .. lstr(v.addr)
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

-- decode(answer) -> gen, peers { { addr, ej, ms, stall } }, list or nil,
-- the throttling window's requests and accepts
local function decode(s)
    local gen, i = rd64(s, 1)
    local n
    n, i = rd16(s, i)
    local peers = {}
    for k = 1, n do
        local f = str_byte(s, i)
        local ms, addr
        ms, i = rd32(s, i + 1)
        addr, i = rdstr(s, i)
        peers[k] = { addr = addr, ej = f % 2 == 1,
                     ms = ms, stall = math_floor(f / 2) % 2 == 1 }
    end
    local list, reqs, accs
    list, i = decode_list(s, i)
    reqs, i = rd64(s, i)
    accs = rd64(s, i)
    return gen, peers, list, reqs, accs
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

-- import reads every server's shared verdict into this worker's pool.
local function import(st, now)
    local dict, pk, gov = st.dict, st.pk, st.gov
    local verdicts, nv = {}, 0
    for addr in pairs(gov) do
        local u = dict:get(pk .. "e:" .. addr)
        local stall = dict:get(pk .. "t:" .. addr) ~= nil
        local flags, ms = 0, 0
        if u == nil or (u ~= 0 and u <= now) then
            -- nobody said, or an ejection over: this worker's trial
            -- calls and checks decide
            flags = 4
        elseif u ~= 0 then
            flags, ms = 1, math_min(math_floor((u - now) * 1000), 4294967295)
        end
        if stall then
            flags = flags + 2
        end
        nv = nv + 1
        verdicts[nv] = { addr = addr, flags = flags, ms = ms }
    end
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
    publish(st, peers, now)
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

function _M.due(st)
    local now = ngx_now()
    if now >= st.next then
        sync(st)
    elseif not st.trail then
        st.trail = true
        if not timer_at(st.next - now, trailing, st) then
            st.trail = false
        end
    end
end

-- called after a failed call: what failed may have ejected a server
function _M.failed(st)
    if ngx_now() >= st.last + FAIL_SYNC_S then
        sync(st)
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
        next = 0, last = 0, v = false, gen = 0, ag = false,
        gov = {}, stall_told = {},
        check_s = spec.check_ms and spec.check_ms > 0
                  and spec.check_ms / 1000 or nil,
        resolve_s = spec.resolve_ms and spec.resolve_ms > 0
                    and spec.resolve_ms / 1000 or nil,
        probe = true, resolve = true,
        throttle = spec.throttle, oreqs = 0, oaccs = 0,
    }
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
