#!/usr/bin/env bash
# build-openresty.sh PREFIX: an OpenResty-equivalent nginx (`nginx -v` says
# openresty/1.27.1.2) from the pinned sources of sources.txt:
#   nginx 1.27.1 + OpenResty 1.27.1.2's nginx patches (socket_cloexec among
#   them: ngx.pipe needs it) + lua-nginx-module 0.10.28 and
#   stream-lua-nginx-module 0.0.16 compiled in (--with-stream,
#   --with-stream_ssl_module, --with-stream_ssl_preread_module) + OpenResty's
#   LuaJIT2 2.1-20240314 built with Lua 5.2 compat as OpenResty does +
#   lua-resty-core 0.1.31 and lua-resty-lrucache 0.15 in PREFIX/lualib, with
#   PREFIX/site/lualib then PREFIX/lualib as the compiled-in Lua path.
# Sources come through fetch.sh (THIRDPARTY=dir serves them offline).
# Needs: build-essential patch libpcre3-dev zlib1g-dev libssl-dev git curl.
# Env: JOBS (default nproc). A PREFIX whose stamp matches (the hash of
# sources.txt and of this script) is left as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${1:?usage: build-openresty.sh PREFIX}
mkdir -p "$PREFIX"; PREFIX=$(cd "$PREFIX" && pwd)
JOBS=${JOBS:-$(nproc)}
stamp=$("$here/stamp.sh" openresty)
if [ -x "$PREFIX/sbin/nginx" ] && [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "build-openresty: $PREFIX is up to date"; exit 0
fi
SRC=$(mktemp -d "${TMPDIR:-/tmp}/orbuild.XXXXXX"); trap 'rm -rf "$SRC"' EXIT
names=(nginx-1.27.1 luajit2-2.1-20240314 lua-nginx-module-0.10.28
       stream-lua-nginx-module-0.0.16 lua-resty-core-0.1.31
       lua-resty-lrucache-0.15 openresty-1.27.1.2-patches)
"$here/fetch.sh" "$SRC/dl" "${names[@]}"
for t in "${names[@]}"; do
    mkdir -p "$SRC/$t"
    tar -xzf "$SRC/dl/$t.tar.gz" -C "$SRC/$t" --strip-components=1
done
t0=$(date +%s)
LUAJIT=$PREFIX/luajit
# A git archive lacks .relver, which LuaJIT's release tarballs carry: the
# pinned commit's time, as `git show -s --format=%ct v2.1-20240314` prints.
echo 1710398010 > "$SRC/luajit2-2.1-20240314/.relver"
LJ=(PREFIX="$LUAJIT" TARGET_STRIP=@: CCDEBUG=-g XCFLAGS=-DLUAJIT_ENABLE_LUA52COMPAT)
echo "build-openresty: LuaJIT"
make -C "$SRC/luajit2-2.1-20240314" -j"$JOBS" "${LJ[@]}" >"$SRC/luajit.log" 2>&1 || { tail -20 "$SRC/luajit.log"; exit 1; }
make -C "$SRC/luajit2-2.1-20240314" install "${LJ[@]}" >>"$SRC/luajit.log" 2>&1

cd "$SRC/nginx-1.27.1"
OR=$SRC/openresty-1.27.1.2-patches
minor=$(sed -n 's/^minor_ver=//p' "$OR/util/ver")
# The order util/mirror-tarballs applies them; two do not apply to 1.27.1.
grep -oE 'patches/nginx-\$(main_ver|ver)-[A-Za-z0-9_.-]+\.patch' "$OR/util/mirror-tarballs" \
  | sed -E 's/\$(main_ver|ver)/1.27.1/' | awk '!s[$0]++' | while read -r p; do
    [ -f "$OR/$p" ] || continue
    case $p in *-setting_args_invalidates_uri.patch|*-no_pool.patch) continue ;; esac
    sed "s/NGINX_VERSION \".unknown\"/NGINX_VERSION \".$minor\"/" "$OR/$p" \
      | patch -p1 -s --no-backup-if-mismatch >/dev/null || { echo "patch $p failed" >&2; exit 1; }
done
export LUAJIT_LIB="$LUAJIT/lib" LUAJIT_INC="$LUAJIT/include/luajit-2.1"
S=$PREFIX/site/lualib L=$PREFIX/lualib
for m in lua-nginx-module-0.10.28:http stream-lua-nginx-module-0.0.16:stream; do
cat >> "$SRC/${m%%:*}/config" <<EOC

echo '
#ifndef LUA_DEFAULT_PATH
#define LUA_DEFAULT_PATH "$S/?.ljbc;$S/?/init.ljbc;$L/?.ljbc;$L/?/init.ljbc;$S/?.lua;$S/?/init.lua;$L/?.lua;$L/?/init.lua"
#endif

#ifndef LUA_DEFAULT_CPATH
#define LUA_DEFAULT_CPATH "$S/?.so;$L/?.so"
#endif
' >> "\$ngx_addon_dir/src/ngx_${m##*:}_lua_autoconf.h"
EOC
done
echo "build-openresty: nginx"
# nginx's git tree has auto/configure, not ./configure
auto/configure --prefix="$PREFIX" --with-threads --with-http_ssl_module --with-stream \
  --with-stream_ssl_module --with-stream_ssl_preread_module \
  --add-module="$SRC/lua-nginx-module-0.10.28" --add-module="$SRC/stream-lua-nginx-module-0.0.16" \
  --with-ld-opt="-Wl,-rpath,$LUAJIT/lib" >"$SRC/configure.log" 2>&1 || { tail -20 "$SRC/configure.log"; exit 1; }
make -j"$JOBS" >"$SRC/nginx.log" 2>&1 || { tail -20 "$SRC/nginx.log"; exit 1; }
make install >>"$SRC/nginx.log" 2>&1
mkdir -p "$PREFIX/lualib" "$PREFIX/site/lualib"
cp -a "$SRC/lua-resty-core-0.1.31/lib/." "$SRC/lua-resty-lrucache-0.15/lib/." "$PREFIX/lualib/"
echo "$stamp" > "$PREFIX/.stamp"
"$PREFIX/sbin/nginx" -v
echo "build-openresty: $PREFIX in $(( $(date +%s) - t0 )) s"
