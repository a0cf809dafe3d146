// Package nginx holds the integration suite of the nginx side: it builds
// libffi_qrpc.so, starts a real qrpc server and a real nginx (Debian's
// nginx + libnginx-mod-http-lua + lua-resty-core) per test from
// nginx.conf.tmpl, and checks over HTTP what `require "resty.ffi.qrpc"`
// does. Run it with `go test ./nginx/...`; without nginx installed the
// tests skip, except under CI=true where that is a failure.
package nginx
