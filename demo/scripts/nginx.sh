# Sourced by demo/scripts/deps and demo/scripts/up: which nginx to run.
#
# QRPC_NGINX (the variable the test suites read too) names it:
#   unset        openresty when it is on PATH, else nginx (Debian's)
#   debian       nginx from PATH or /usr/sbin (apt's nginx + ngx_lua)
#   openresty    $QRPC_BUILD_DIR/openresty/sbin/nginx (`make test-openresty`
#                builds it there), else `openresty` on PATH
#   resty-ffi    $QRPC_BUILD_DIR/resty-ffi/sbin/nginx (`make test-resty-ffi`)
#   a path       that binary;  another word: that command on PATH
# NGINX, the older name, is still read when QRPC_NGINX is unset, and then
# removed from the environment: nginx itself reads NGINX (listening sockets
# inherited from an upgrading master) and, given a path there, logs
# "invalid socket number" and stays in the foreground.
#
# resolve_nginx ROOT sets nginx_bin, and nginx_apt=1 when the binary is
# Debian's (its packages are then what deps checks). Fails with a message.
resolve_nginx() {
    local root=$1 sel build
    sel=${QRPC_NGINX:-${NGINX:-}}
    unset NGINX
    build=${QRPC_BUILD_DIR:-$root/.build}
    nginx_apt=0
    case $sel in
    "")
        if command -v openresty >/dev/null 2>&1; then
            nginx_bin=openresty
        else
            nginx_bin=nginx nginx_apt=1
        fi
        ;;
    debian | nginx)
        nginx_bin=nginx nginx_apt=1
        ;;
    openresty | resty-ffi)
        if [[ -x $build/$sel/sbin/nginx ]]; then
            nginx_bin=$build/$sel/sbin/nginx
        elif [[ $sel == openresty ]] && command -v openresty >/dev/null 2>&1; then
            nginx_bin=openresty
        else
            echo "QRPC_NGINX=$sel: $build/$sel/sbin/nginx is not built (make test-$sel builds it)" >&2
            return 1
        fi
        ;;
    */*)
        [[ -x $sel ]] || { echo "QRPC_NGINX=$sel: not an executable file" >&2; return 1; }
        nginx_bin=$sel
        ;;
    *)
        command -v "$sel" >/dev/null 2>&1 || {
            echo "QRPC_NGINX=$sel: want debian, openresty, resty-ffi, or an nginx binary (path or command)" >&2
            return 1
        }
        nginx_bin=$sel
        ;;
    esac
    # Debian keeps nginx in /usr/sbin, which an ordinary user's PATH may lack.
    if ! command -v "$nginx_bin" >/dev/null 2>&1 && [[ -x /usr/sbin/$nginx_bin ]]; then
        nginx_bin=/usr/sbin/$nginx_bin
    fi
    return 0
}
