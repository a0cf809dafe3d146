package nginx

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// renewalsLua connects a shared pool (check every 100 ms: the lease is
// renewed every 1.6 s), waits for its probe lease, then for two renewals
// of it (at most 10 s), and says how many it saw and how many times the
// nginx thread entered Go meanwhile. In either subsystem (stream: the
// dict qpools_s). The entry count is the worker's, whichever VM enters:
// when sides names more than one subsystem, each side marks its steps
// with a file in the nginx directory's run/ and waits (at most 10 s) for the
// others' mark, so no side counts another's connect, or its request's
// end, as its own entry.
func renewalsLua(sides ...string) string {
	return `                local sides = { "` + strings.Join(sides, `", "`) + `" }
                local qt0 = require "qtest"
                local function barrier(step)
                    local f = assert(io.open(qt0.dir .. "/run/" .. step .. "." .. ngx.config.subsystem, "w"))
                    f:close()
                    return qt0.wait(10, function()
                        for _, s in ipairs(sides) do
                            local g = io.open(qt0.dir .. "/run/" .. step .. "." .. s)
                            if not g then return false end
                            g:close()
                        end
                        return true
                    end)
                end
` + renewalsBody
}

const renewalsBody = `                local ffi = require "ffi"
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                pcall(ffi.cdef, "uint64_t qrpc_go_entries(void);")
                local lib = ffi.load(qt.lib)
                local d = ngx.shared[ngx.config.subsystem == "stream" and "qpools_s" or "qpools"]
                local conn = assert(qrpc.connect(qt.a, qt.opts({
                    check = { method = "probe", interval = 100 }, shared = ngx.config.subsystem == "stream" and "qpools_s" or "qpools" })))
                assert(conn:unary("echo", "x"))
                if not barrier("connected") then return ngx.say("a side did not connect") end
                local function lease()
                    for _, k in ipairs(d:get_keys(0)) do
                        if k:match(":lp@%w+$") then return d:get(k) end
                    end
                end
                local v = qt.wait(5, lease)
                if not v then return ngx.say("no probe lease") end
                local e0 = lib.qrpc_go_entries()
                local renewals = 0
                for _ = 1, 500 do -- at most 10 s
                    local now = lease()
                    if now ~= v then
                        renewals = renewals + 1
                        v = now
                        if renewals == 2 then break end
                    end
                    ngx.sleep(0.02)
                end
                local entries = tonumber(lib.qrpc_go_entries() - e0)
                if not barrier("counted") then return ngx.say("a side did not count") end
                ngx.say("renewals ", renewals, " entries ", entries)`

// TestPoolSharedIdleStepsStayOutOfGo: the steps Go asks for (here the
// lease holder's renewals of an idle pool) go through the submit queue
// and come back as completions, so the nginx thread does not enter Go for
// them (qrpc_go_entries does not move): an idle holder's steps then cost
// Go's threads what any queued command costs, without the trimmer (see
// docs/tuning.md, "A shared pool").
func TestPoolSharedIdleStepsStayOutOfGo(t *testing.T) {
	requireNginx(t)
	// The lua-resty-ffi host too: it dials through the built-in host
	// (cache.lua), whose dispatcher Go asks for the steps.
	t.Parallel()
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra:  map[string]string{"a": a.addr},
		Server: loc("/t", renewalsLua("http"))})
	code, body := n.get("/t")
	if code != 200 || strings.TrimSpace(body) != "renewals 2 entries 0" {
		t.Fatalf("HTTP %d: %q, want two lease renewals and no entry into Go", code, body)
	}
}

// TestPoolSharedCloseWithQueuedStep: a pool closes while a step Go asked
// for is queued, and the submitter (another CPU) reaches that step
// between the two rounds of the close's exit step, which the nginx
// thread runs: the close still gives the probe lease up. The test makes
// that order certain: after the exit's first round it queues the step
// itself (as share.lua's asked does, a record of mode 1) and waits until
// Go has answered it.
func TestPoolSharedCloseWithQueuedStep(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr},
		Server: loc("/t", `
                local ffi = require "ffi"
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local builtin = require "resty.ffi.qrpc.host_builtin"
                pcall(ffi.cdef, "size_t qrpc_cq_len(int vm);")
                local lib = ffi.load(qt.lib)
                local conn = assert(qrpc.connect(qt.a, qt.opts({
                    check = { method = "probe", interval = 100 }, shared = "qpools" })))
                assert(conn:unary("echo", "x"))
                local function held()
                    for _, k in ipairs(ngx.shared.qpools:get_keys(0)) do
                        if k:match(":lp@%w+$") then return true end
                    end
                end
                if not qt.wait(5, held) then return ngx.say("no probe lease") end
                local query, queued = builtin.query, "not queued"
                builtin.query = function(op, h, rec)
                    local ans, err = query(op, h, rec)
                    if op == 14 and rec == "\2" and queued == "not queued" then
                        -- the exit's first round is done: the queued step
                        -- reaches Go now (VM 0: http's queue)
                        local n0 = lib.qrpc_cq_len(0)
                        assert(builtin.post(14, h, "\1"))
                        queued = "not answered"
                        ngx.update_time()
                        local t0 = ngx.now()
                        for _ = 1, 1e8 do -- at most 10 s
                            if lib.qrpc_cq_len(0) > n0 then
                                queued = "answered"
                                break
                            end
                            ngx.update_time()
                            if ngx.now() - t0 > 10 then break end
                        end
                    end
                    return ans, err
                end
                conn:close()
                builtin.query = query
                ngx.say(queued, ", ", held() and "lease kept" or "lease given up")`)})
	if code, body := n.get("/t"); code != 200 || body != "answered, lease given up\n" {
		t.Fatalf("HTTP %d: %q, want the queued step answered and the lease given up", code, body)
	}
}

// TestPoolSharedStreamSteps: in the stream subsystem (a second Lua VM,
// its own completion queue) the steps Go asks for go through the queue
// too, their answers reach that VM: the stream worker's lease holder
// renews its lease without entering Go, beside an http pool that does
// the same.
func TestPoolSharedStreamSteps(t *testing.T) {
	requireStreamLua(t)
	t.Parallel()
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr},
		Stream: `
    lua_shared_dict qpools_s 1m;
    server {
        listen 127.0.0.1:{{.StreamPort}};
        content_by_lua_block {` + renewalsLua("http", "stream") + `
        }
    }`,
		Server: loc("/t", renewalsLua("http", "stream"))})
	http := make(chan string, 1)
	go func() {
		code, b := n.get("/t")
		http <- fmt.Sprintf("%d %s", code, strings.TrimSpace(b))
	}()
	l, err := dialLines(n.streamPort, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	_ = l.c.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := l.r.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != "renewals 2 entries 0" {
		t.Errorf("stream: %q (%v), want two lease renewals and no entry into Go", got, err)
	}
	if h := <-http; h != "200 renewals 2 entries 0" {
		t.Errorf("http beside it: %q", h)
	}
}

// TestPoolSharedAskAfterFailedStep: Go asks for a step while one it asked
// for earlier is on its way through the queue, and that one fails: the
// ask is not lost, the next step is queued at once (else it waits for
// Go's next ask, a second or a lease period later). The failure is
// injected as Go's answer would carry it (a QRPC_SHARE completion of
// code 2 for the queued step's call id), from the one thread that
// handles them, without yielding between the three.
func TestPoolSharedAskAfterFailedStep(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr},
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local builtin = require "resty.ffi.qrpc.host_builtin"
                local post, posts, last, handle = builtin.post, 0, nil, nil
                builtin.post = function(op, h, rec)
                    local id, err = post(op, h, rec)
                    posts, last, handle = posts + 1, id, h
                    return id, err
                end
                local conn = assert(qrpc.connect(qt.a, qt.opts({
                    check = { method = "probe", interval = 100 }, shared = "qpools" })))
                assert(conn:unary("echo", "x"))
                -- the lease renewals Go asks for show the pool's handle
                if not qt.wait(10, function() return handle end) then
                    builtin.post = post
                    return ngx.say("Go asked for no step")
                end
                builtin.on_share(handle, 0, 0, nil) -- begins one, or joins it
                builtin.on_share(handle, 0, 0, nil) -- on its way: wait for it
                local before = posts
                builtin.on_share(handle, 2, last, "injected failure")
                local after = posts
                builtin.post = post
                conn:close()
                ngx.say("queued after the failure: ", after - before)`)})
	if code, body := n.get("/t"); code != 200 || body != "queued after the failure: 1\n" {
		t.Fatalf("HTTP %d: %q, want the ask that came meanwhile queued once the step failed", code, body)
	}
}
