#!/usr/bin/env bash
# The Debian packages, tested as an operator gets them (ctest "package_test",
# and `make package`): built with cpack from this build, checked by lintian
# (no errors), extracted into a temporary root with dpkg -x, and used from
# there:
#   kvpool-node --version and kvpoolctl --help run from the root, the tools
#   linked to the root's libkvpool.so.0;
#   a C program compiles and links against the installed libkvpool-dev with
#   `pkg-config --cflags --libs kvpool`, and again through find_package(kvpool);
#   the installed python3-kvpool imports and reports this version;
#   the kvpool-node.service unit passes systemd-analyze verify, and its
#   ExecStart line, run as written as the unit's user, sends READY=1 on a
#   notify socket, serves the C program and the Python client through the
#   configured socket, and stops cleanly on SIGTERM (unit_check.py, in a
#   private mount and network namespace);
#   the container image's entrypoint (deploy/entrypoint.sh) passes flags to
#   the node, runs other commands, and with no arguments execs the node with
#   the packaged configuration, which serves and stops the same way.
# usage: package_test.sh BUILD_DIR [OUT_DIR]
#   OUT_DIR: keep the packages there (make package); default: a temporary
#   directory, removed at the end.
set -euo pipefail

fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }
[[ $# -ge 1 && -d "$1" ]] || fail "usage: package_test.sh BUILD_DIR [OUT_DIR] (no build directory '${1:-}')"
BUILD="$(cd "$1" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
WORK="$(mktemp -d /tmp/kvpool-package-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
# OUT_DIR as the caller named it, relative to the caller's directory (make
# package passes build/packages): made absolute before anything changes
# directory.
OUT="${2:-$WORK/debs}"
mkdir -p "$OUT" || fail "cannot create the output directory $OUT"
OUT="$(cd "$OUT" && pwd)"

version="$(sed -n '1s/^kvpool (\([0-9.]*\)).*/\1/p' "$SRC/packaging/changelog")"
[[ -n "$version" ]] || fail "no version at the top of packaging/changelog"

step "cpack: the packages of $version"
rm -rf "$OUT/_CPack_Packages"
# Other versions' packages left by an earlier build would be installed
# alongside by the README's `apt install ./build/packages/*.deb`.
for p in kvpool-node kvpool-tools libkvpool0 libkvpool-dev python3-kvpool; do
  rm -f "$OUT/${p}_"*.deb
done
(cd "$BUILD" && cpack -B "$OUT" > "$WORK/cpack.log" 2>&1) || { cat "$WORK/cpack.log"; fail "cpack"; }
rm -rf "$OUT/_CPack_Packages"
debs=()
for p in kvpool-node kvpool-tools libkvpool0 libkvpool-dev python3-kvpool; do
  f=""
  for g in "$OUT/${p}_${version}_"*.deb; do [[ -e "$g" ]] && { f="$g"; break; }; done
  [[ -n "$f" ]] || fail "no $p package for $version in $OUT (cpack wrote: $(cd "$OUT" && echo *))"
  debs+=("$f")
  echo "$(basename "$f"): Depends: $(dpkg-deb -f "$f" Depends)"
done

step "lintian"
lintian --allow-root "${debs[@]}" > "$WORK/lintian.txt" 2>&1 || true  # its exit code counts warnings too
cat "$WORK/lintian.txt"
if grep -q '^E: ' "$WORK/lintian.txt"; then fail "lintian reports errors"; fi

step "dpkg -x into $WORK/root"
ROOT="$WORK/root"
for f in "${debs[@]}"; do dpkg -x "$f" "$ROOT"; done
lib="$(find "$ROOT" -name libkvpool.so.0)"
[[ -n "$lib" ]] || fail "no libkvpool.so.0 in the packages"
LIBDIR="$(dirname "$lib")"

step "the binaries"
got="$("$ROOT/usr/bin/kvpool-node" --version)"
[[ "$got" == "kvpool-node $version" ]] || fail "kvpool-node --version said '$got'"
echo "$got"
LD_LIBRARY_PATH="$LIBDIR" "$ROOT/usr/bin/kvpoolctl" --help > "$WORK/ctl-help.txt" ||
  fail "kvpoolctl --help"
grep -q '^usage: kvpoolctl' "$WORK/ctl-help.txt" || fail "kvpoolctl --help printed no usage"
# Output taken whole before grep reads it: `grep -q` quits at the first
# match, and under pipefail the writer's SIGPIPE would fail the check.
linked="$(LD_LIBRARY_PATH="$LIBDIR" ldd "$ROOT/usr/bin/kvpoolctl")"
grep -q "libkvpool.so.0 => $LIBDIR/" <<< "$linked" ||
  fail "kvpoolctl does not link the installed libkvpool.so.0"
echo "kvpoolctl --help: ok (libkvpool.so.0 from the root)"

step "a C program against libkvpool-dev (pkg-config)"
flags="$(PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --cflags --libs kvpool)"
echo "pkg-config --cflags --libs kvpool: $flags"
pc_var() { PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --variable="$1" kvpool; }
[[ "$(realpath "$(pc_var includedir)")" == "$ROOT/usr/include" &&
   "$(realpath "$(pc_var libdir)")" == "$LIBDIR" ]] ||
  fail "pkg-config does not point into the installed root"
[[ "$(PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --modversion kvpool)" == "$version" ]] ||
  fail "kvpool.pc has another version"
# shellcheck disable=SC2086  # the flags are words
cc -std=c11 -Wall -Werror -o "$WORK/smoke" "$SRC/tests/c_api_smoke.c" $flags ||
  fail "the C program does not build against the installed package"

step "the same program through find_package(kvpool)"
mkdir -p "$WORK/cmake-user"
cp "$SRC/tests/c_api_smoke.c" "$WORK/cmake-user/"
cat > "$WORK/cmake-user/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(kvpool_user C)
find_package(kvpool $version EXACT REQUIRED)
add_executable(smoke_cmake c_api_smoke.c)
target_link_libraries(smoke_cmake PRIVATE kvpool::kvpool)
CMAKE
cmake -S "$WORK/cmake-user" -B "$WORK/cmake-user/build" -DCMAKE_PREFIX_PATH="$ROOT/usr" \
  > "$WORK/cmake-user.log" 2>&1 && cmake --build "$WORK/cmake-user/build" >> "$WORK/cmake-user.log" 2>&1 ||
  { cat "$WORK/cmake-user.log"; fail "find_package(kvpool) and kvpool::kvpool"; }
echo "find_package(kvpool $version) and kvpool::kvpool: ok"

step "python3-kvpool"
PYTHONPATH="$ROOT/usr/lib/python3/dist-packages" KVPOOL_LIBRARY="$lib" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 -c '
import sys, kvpool
root, version = sys.argv[1], sys.argv[2]
assert kvpool.__file__.startswith(root), kvpool.__file__
assert kvpool.__version__ == version, kvpool.__version__
assert kvpool.version() == version, kvpool.version()
print("import kvpool:", kvpool.__version__, "from", kvpool.__file__)' "$ROOT" "$version" ||
  fail "python3-kvpool"

step "the container image's entrypoint (deploy/entrypoint.sh)"
entry="$SRC/deploy/entrypoint.sh"
got="$(PATH="$ROOT/usr/bin:$PATH" KVPOOL_CONFIG="$ROOT/etc/kvpool/kvpool-node.conf" "$entry" --version)"
[[ "$got" == "kvpool-node $version" ]] || fail "entrypoint --version said '$got'"
help="$(PATH="$ROOT/usr/bin:$PATH" LD_LIBRARY_PATH="$LIBDIR" "$entry" kvpoolctl --help)" ||
  fail "entrypoint kvpoolctl --help"
grep -q '^usage: kvpoolctl' <<< "$help" || fail "entrypoint kvpoolctl --help printed no usage"
echo "entrypoint: flags go to kvpool-node, commands run as given"

step "the kvpool-node.service unit, then the entrypoint, started as their callers would"
KVPOOL_LIBRARY="$lib" KVPOOL_ENTRYPOINT="$entry" unshare -m -n /usr/bin/python3 "$HERE/unit_check.py" "$ROOT" \
  "$WORK/smoke" "$WORK/cmake-user/build/smoke_cmake" || fail "the service unit"

echo "package_test: ok"
