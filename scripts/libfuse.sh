#!/usr/bin/env bash
# Builds libfuse 3.17 as a static library into build-deps/fuse3, where CMake looks for it first.
# Debian 12 ships libfuse 3.14, which cannot open files in FUSE passthrough mode (the kernel then
# reads and writes the cache's staging file itself, at the local disk's speed); Debian 13's source
# package fuse3 (3.17.2) can. The source comes from Debian's archive through a source list of its
# own, so the machine's apt configuration stays untouched. Idempotent: a built copy is kept.
# Without this library ckptfs builds against the system's libfuse and serves every file through
# the daemon (logged at mount).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$PWD/build-deps/fuse3
if [[ -f $prefix/lib/libfuse3.a && -f $prefix/VERSION ]]; then
  exit 0
fi
work=$PWD/build-deps/fuse3-src
rm -rf "$work" "$prefix"
mkdir -p "$work/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
  >"$work/sources.list"
apt_private=(-o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=-
  -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
echo "libfuse: fetching Debian 13's source package fuse3"
apt-get "${apt_private[@]}" update -qq
(cd "$work" && apt-get "${apt_private[@]}" source --download-only -qq fuse3 >/dev/null)
# Debian's patches are applied (dpkg-source); the archive's signature was checked by apt.
dsc=$(ls "$work"/fuse3_*.dsc)
version=$(sed -n 's/^Version: //p' "$dsc")
case $version in
  3.1[7-9]* | 3.[2-9]*) ;;
  *) echo "libfuse: Debian 13 carries fuse3 $version, older than 3.17" >&2; exit 1 ;;
esac
(cd "$work" && dpkg-source --no-check -x "$dsc" src >/dev/null)
meson setup "$work/build" "$work/src" --prefix="$prefix" --libdir=lib --buildtype=release \
  -Ddefault_library=static -Db_staticpic=true -Dexamples=false -Dutils=false -Dtests=false \
  >"$work/meson.log"
ninja -C "$work/build" >/dev/null
ninja -C "$work/build" install >/dev/null
echo "$version" >"$prefix/VERSION"
rm -rf "$work"
echo "libfuse: $version built into $prefix"
