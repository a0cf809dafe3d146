#!/usr/bin/env bash
# fetch.sh DIR NAME...: puts the verified archive of each named source of
# sources.txt in DIR/NAME.tar.gz and prints nothing else on success.
#
# Where an archive comes from: $THIRDPARTY/NAME.tar.gz when THIRDPARTY is
# set and holds it (an offline mirror: CI has no access to GitHub), else
# https://github.com/REPO/archive/REF.tar.gz.
#
# How it is verified, either way: the commit id that `git archive` (and so
# GitHub) writes into the archive must be the pinned commit. The reference
# copy's sha256 is pinned too and reported when it matches; a different
# sha256 with the right commit is accepted, because GitHub's archives of a
# commit and a mirror's `git archive` of the same commit (possibly of a
# subset of its files) differ in bytes but not in what they are. Anything
# else is refused, naming the file and both values, and so is an archive
# whose gzip check fails (a damaged copy with an intact header).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: fetch.sh DIR NAME...}
shift
mkdir -p "$dir"

line_of() {
    awk -v n="$1" '!/^#/ && $1 == n { print; found = 1 } END { exit !found }' "$here/sources.txt"
}

for name in "$@"; do
    read -r _ repo ref commit sha <<<"$(line_of "$name")" || {
        echo "fetch.sh: $name is not in $here/sources.txt" >&2
        exit 1
    }
    out=$dir/$name.tar.gz
    if [ -n "${THIRDPARTY:-}" ] && [ -f "$THIRDPARTY/$name.tar.gz" ]; then
        from=$THIRDPARTY/$name.tar.gz
        cp "$from" "$out.tmp"
    else
        from=https://github.com/$repo/archive/$ref.tar.gz
        if [ -n "${THIRDPARTY:-}" ]; then
            echo "fetch.sh: $name.tar.gz is not in THIRDPARTY=$THIRDPARTY; trying $from" >&2
        fi
        if ! curl -fsSL --retry 2 --connect-timeout 20 -o "$out.tmp" "$from"; then
            rm -f "$out.tmp"
            echo "fetch.sh: cannot download $from; without network, set THIRDPARTY to a directory holding $name.tar.gz (see nginx/flavours/sources.txt)" >&2
            exit 1
        fi
    fi
    if ! gzip -t "$out.tmp" 2>/dev/null; then
        rm -f "$out.tmp"
        echo "fetch.sh: $from is damaged (gzip -t fails)" >&2
        exit 1
    fi
    got=$(gzip -dc "$out.tmp" | git get-tar-commit-id 2>/dev/null || true)
    if [ "$got" != "$commit" ]; then
        rm -f "$out.tmp"
        echo "fetch.sh: $from is not $name: its commit is '${got:-none}', want $commit" >&2
        exit 1
    fi
    mv -f "$out.tmp" "$out"
    if [ "$(sha256sum <"$out" | cut -c1-64)" = "$sha" ]; then
        echo "fetch.sh: $name: commit $commit, sha256 $sha (reference copy)" >&2
    else
        echo "fetch.sh: $name: commit $commit (archive from $from)" >&2
    fi
done
