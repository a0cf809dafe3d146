#!/usr/bin/env bash
# stamp.sh FLAVOUR: the build stamp of nginx/flavours/build-FLAVOUR.sh, the
# sha256 of the pinned source list, that script and the scripts it runs; a
# change of any of them makes the next build start over.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
f=${1:?usage: stamp.sh FLAVOUR}
cat "$here/sources.txt" "$here/build-$f.sh" "$here/fetch.sh" | sha256sum | cut -c1-64
