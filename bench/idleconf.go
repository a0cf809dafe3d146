package main

// The nginx configurations of the idle figure (idle.go): one for the
// workers that make one call and the plain ones beside them, one for the
// shared pool's workers.

// idleConf: workers 0..Calling-1 wait for the bench's go file, then
// connect, make one call (and Burst concurrent 64 KB echoes when asked)
// and log when they are done; the others only configure the module
// (which must not load the library). In pool mode workers 0 and 1
// connect a shared pool with checks and re-resolution (one of them
// takes the leases), worker 2 the same pool unshared, worker 3 the same
// pool unshared without checks or re-resolution (a quiet pool: what a
// follower is measured against), worker 4 nothing.
const idleConf = `load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes {{.Workers}};
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log warn;
env GOMAXPROCS;
env GODEBUG;
events { worker_connections 1024; }
http {
    access_log off;
    lua_package_path "{{.Dir}}/?.lua;{{.LuaDir}}/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_shared_dict qpools 1m;
    # calls made, by worker pid: the bench checks every calling worker made its call
    lua_shared_dict idle_calls 1m;
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path {{.Dir}}/proxy;
    fastcgi_temp_path {{.Dir}}/fastcgi;
    uwsgi_temp_path {{.Dir}}/uwsgi;
    scgi_temp_path {{.Dir}}/scgi;
    init_worker_by_lua_block {
        local qrpc = require "resty.ffi.qrpc"
        qrpc.configure{ host = "builtin", lib = "{{.Lib}}", socket_dir = "{{.Dir}}" }
        local id = ngx.worker.id()
        local function go_file()
            for _ = 1, 600 do
                local f = io.open("{{.Dir}}/go")
                if f then f:close() return true end
                ngx.sleep(0.1)
            end
        end
        local function done(what, res, err)
            ngx.update_time()
            ngx.log(ngx.WARN, "idle-bench: pid ", ngx.worker.pid(), " ", what, " ",
                    res and "ok" or tostring(err), " at ", string.format("%.3f", ngx.now()))
        end
{{if eq .Mode "calls"}}
        if id < {{.Calling}} then
            ngx.timer.at(0, function(premature)
                if premature or not go_file() then return end
                local cfg = require "bench_config"
                local conn, err = qrpc.connect(cfg.addr, { ca = cfg.ca, server_name = "localhost" })
                local res
                if conn then res, err = conn:unary("echo", "hello") end
                if res then ngx.shared.idle_calls:incr(ngx.worker.pid(), 1, 0) end
                if res and {{.Burst}} > 0 then
                    local body = string.rep("b", 65536)
                    local ths = {}
                    for i = 1, {{.Burst}} do
                        ths[i] = ngx.thread.spawn(conn.unary, conn, "echo", body)
                    end
                    for i = 1, #ths do
                        local ok, r, e = ngx.thread.wait(ths[i])
                        if not (ok and r and #r.body == #body) then res, err = nil, e or r end
                    end
                end
                done("call", res, err)
            end)
        end
{{else}}
        if id < 4 then
            ngx.timer.at(0, function(premature)
                if premature or not go_file() then return end
                local cfg = require "bench_config"
                local quiet = id == 3
                local conn, err = qrpc.connect({ "{{.PoolAddr}}" }, {
                    ca = cfg.ca, server_name = "localhost",
                    check = not quiet and { method = "echo", interval = {{.CheckMS}} } or nil,
                    resolve = not quiet and {{.ResolveMS}} or nil,
                    resolver = "{{.Resolver}}",
                    shared = id < 2 and "qpools" or false,
                })
                local res
                if conn then res, err = conn:unary("echo", "hello") end
                if res then ngx.shared.idle_calls:incr(ngx.worker.pid(), 1, 0) end
                done(id < 2 and "shared" or quiet and "quiet" or "unshared", res, err)
            end)
        end
{{end}}
    }
    server {
        listen {{.Port}};
        location = /pid { return 200 "ok"; }
        # the calls each worker made: "<pid> <n>"
        location = /calls {
            content_by_lua_block {
                local d = ngx.shared.idle_calls
                for _, k in ipairs(d:get_keys(0)) do ngx.say(k, " ", d:get(k)) end
            }
        }
        # the lease holders of the shared pool: "probe <pid>", "dns <pid>"
        location = /leases {
            content_by_lua_block {
                local d = ngx.shared.qpools
                for _, k in ipairs(d:get_keys(0)) do
                    -- lp: the probe lease, ld: the DNS one; the value
                    -- names the holder, "<pid>-<random>"
                    local role = ({ lp = "probe", ld = "dns" })[k:match(":(%a+)$")]
                    if role then ngx.say(role, " ", d:get(k):match("^(%d+)-")) end
                end
            }
        }
        # /call and /profile: for -hold-idle, by hand
        location = /call {
            content_by_lua_block {
                local qrpc = require "resty.ffi.qrpc"
                local cfg = require "bench_config"
                local conn, err = qrpc.connect(cfg.addr, { ca = cfg.ca, server_name = "localhost" })
                local res
                if conn then res, err = conn:unary("echo", "hello") end
                ngx.say(ngx.worker.pid(), " ", res and "ok" or tostring(err))
            }
        }
        location = /profile {
            content_by_lua_block {
                local p, err = require("resty.ffi.qrpc").debug_profile(ngx.var.arg_kind or "heap")
                if not p then return ngx.say(err) end
                ngx.print(p)
            }
        }
    }
}
`
