#!/usr/bin/env bash
# build-resty-ffi.sh PREFIX: an nginx that runs real lua-resty-ffi (commit 33b6630, pinned in sources.txt):
# Debian 12's own nginx 1.22.1 source with ngx_lua 0.10.23 + NDK 0.3.2 compiled in statically,
# threads on, symbols kept and exported (-Wl,-E), then libresty_ffi.so built against that exact
# binary (lua-resty-ffi checks the nginx build-id) and lua-resty-ffi's own Go echo example.
# Debian's source packages come with apt-get source (dpkg-source checks them against their .dsc);
# lua-resty-ffi comes through fetch.sh (THIRDPARTY=dir serves it offline). Root, Debian 12.
# Result: PREFIX/sbin/nginx; PREFIX/lib/libresty_ffi.so and resty_ffi.lua; PREFIX/lib/libffi_go_echo.so.
# Run nginx with LD_LIBRARY_PATH=PREFIX/lib, "PREFIX/lib/?.lua;/usr/share/lua/5.1/?.lua;;" on
# lua_package_path, and `require "resty_ffi"` in init_by_lua (that defines ngx.load_ffi).
# Needs Go on PATH for the example. A PREFIX whose stamp matches (the hash of sources.txt and of
# this script) is left as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${1:?usage: build-resty-ffi.sh PREFIX}
mkdir -p "$PREFIX/lib"; PREFIX=$(cd "$PREFIX" && pwd)
stamp=$("$here/stamp.sh" resty-ffi)
if [ -x "$PREFIX/sbin/nginx" ] && [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build-resty-ffi: $PREFIX is up to date"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# deb-src entries copied from the machine's own deb entries
if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/debian-src.sources
  apt-get update -q
fi
apt-get install -y -q --no-install-recommends dpkg-dev build-essential libluajit2-5.1-dev \
    libpcre3-dev zlib1g-dev libssl-dev file >/dev/null
SRC=$(mktemp -d "${TMPDIR:-/tmp}/rffibuild.XXXXXX"); trap 'rm -rf "$SRC"' EXIT
cd "$SRC"
# the newest deb12 revision's .dsc may not be served yet; deb12u9 is the same 1.22.1 upstream
apt-get source -q --download-only nginx=1.22.1-9+deb12u9 libnginx-mod-http-lua libnginx-mod-http-ndk >/dev/null 2>&1 \
  || apt-get source -q --download-only nginx libnginx-mod-http-lua libnginx-mod-http-ndk >/dev/null
for d in *.dsc; do dpkg-source -x "$d" >/dev/null; done
ngx=$(ls -d nginx-1.22.*/ | head -1); lua=$(ls -d libnginx-mod-http-lua-*/ | head -1); ndk=$(ls -d libnginx-mod-http-ndk-*/ | head -1)
cd "$SRC/$ngx"
export LUAJIT_INC=/usr/include/luajit-2.1 LUAJIT_LIB=/usr/lib/x86_64-linux-gnu
echo "build-resty-ffi: nginx"
./configure --prefix="$PREFIX" --with-threads --with-file-aio --with-http_ssl_module \
  --with-http_v2_module --without-pcre2 --with-pcre-jit \
  --with-cc-opt='-g -O2 -Wno-error' --with-ld-opt='-Wl,-E -Wl,--build-id' \
  --add-module="$SRC/$ndk" --add-module="$SRC/$lua" >"$SRC/configure.log" 2>&1 || { tail -20 "$SRC/configure.log"; exit 1; }
grep -q 'NGX_HAVE_EVENTFD  1' objs/ngx_auto_config.h
make -j"$(nproc)" >"$SRC/nginx.log" 2>&1 || { tail -20 "$SRC/nginx.log"; exit 1; }
make install >>"$SRC/nginx.log" 2>&1      # never strip: lua-resty-ffi reads nginx's static symbols
echo "build-resty-ffi: libresty_ffi.so"
"$here/fetch.sh" "$SRC/dl" lua-resty-ffi-33b6630
mkdir -p "$SRC/lrf"; tar -xzf "$SRC/dl/lua-resty-ffi-33b6630.tar.gz" -C "$SRC/lrf" --strip-components=1
bin=$PREFIX/sbin/nginx
sa() { nm "$bin" | awk -v s="$1" '$3==s {print "0x" $1}'; }
{ a0=$(sa ngx_cycle)
  printf "#define NGX_THREAD_POOL_DONE_OFFSET 0x%X\n" $(( $(sa ngx_thread_pool_done) - a0 ))
  printf "#define NGX_THREAD_POOL_DONE_LOCK_OFFSET 0x%X\n" $(( $(sa ngx_thread_pool_done_lock) - a0 ))
  a0=$(sa ngx_calloc)
  printf "#define NGX_THREAD_POOL_HANDLER_OFFSET 0x%X\n" $(( $(sa ngx_thread_pool_handler) - a0 ))
  echo "#define NGX_BUILD_ID \"$(file "$bin" | sed -En 's/.*BuildID\[sha1\]=([a-z0-9]+).*/\1/p')\""
} > "$SRC/lrf/symbols.h"
NGX_LUA_SRC="$SRC/$lua/src" NGX_OBJS_MAKEFILE=$PWD/objs/Makefile SRC="$SRC/lrf" \
  make -f "$SRC/lrf/Makefile" >"$SRC/lrf.log" 2>&1 || { tail -20 "$SRC/lrf.log"; exit 1; }
cp "$SRC/lrf/libresty_ffi.so" "$SRC/lrf/resty_ffi.lua" "$PREFIX/lib/"
echo "build-resty-ffi: Go echo example"
(cd "$SRC/lrf/examples/go" && GOFLAGS=-mod=mod go build -buildmode=c-shared -o "$PREFIX/lib/libffi_go_echo.so" echo.go)
echo "$stamp" > "$PREFIX/.stamp"
"$PREFIX/sbin/nginx" -v
