#!/usr/bin/env bash
# Deploying as the README says (ctest "deploy_test", `make test-deploy`):
#   1. from the source directory, `make package` as README.md writes it (with
#      BUILD_DIR=<the build directory relative to the source directory> when
#      it is not `build`), then the five packages must be in
#      BUILD_DIR/packages;
#   2. in a private mount and PID namespace with overlays over /usr, /etc and
#      /var (their upper directories in a temporary directory) and a fresh
#      /run, `apt-get install -y ./build/packages/*.deb` as written, from the
#      source directory; dpkg must say the packages are installed, the kvpool
#      user and group and the unit must be there (in_namespace.sh);
#   3. there, the installed binaries, library and Python package run a small
#      cluster the way the installed unit starts a node: two hosts and an
#      intruder as network namespaces on a bridge, one etcd; a kill -9 and
#      restart, a node without the cluster key, tenants across hosts
#      (deploy_driver.py);
#   4. the host is unchanged afterwards: no kvpool-node installed, the same
#      accounts.
# usage: deploy_test.sh BUILD_DIR
# Exit status 77 (ctest's SKIP_RETURN_CODE) when this machine cannot run it:
# not root, or no network namespaces, PID namespaces or overlayfs.
set -euo pipefail

SKIP=77
fail() { echo "deploy_test: FAIL: $*" >&2; exit 1; }
skip() { echo "deploy_test: SKIP: $*"; exit "$SKIP"; }
step() { echo "== $*"; }

[[ $# -eq 1 ]] || fail "usage: deploy_test.sh BUILD_DIR"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
# BUILD_DIR as the caller named it: absolute from ctest, relative to the
# source directory from make.
# It need not exist yet: make package configures and builds it.
BUILD="$1"
[[ "$BUILD" == /* ]] || BUILD="$SRC/$BUILD"
REL="$(realpath -m --relative-to="$SRC" "$BUILD")"
PACKAGES=(kvpool-node kvpool-tools libkvpool0 libkvpool-dev python3-kvpool)

# --- can this machine run it? ------------------------------------------------
[[ "$(id -u)" -eq 0 ]] || skip "needs root (overlay mounts, network namespaces, users)"
for tool in ip unshare nsenter setpriv mount apt-get dpkg-query useradd openssl; do
  command -v "$tool" > /dev/null || skip "needs $tool"
done
[[ -x /usr/bin/python3 ]] || skip "needs /usr/bin/python3"
command -v etcd > /dev/null || fail "no etcd on PATH (make deps installs etcd-server)"

WORK="$(mktemp -d /tmp/kvpool-deploy-test.XXXXXX)"
cleanup() {
  local rc=$?
  # Whatever still runs in the test's namespaces dies with their PID
  # namespace's first process (unshare --kill-child); the temporary
  # directory holds only the overlays' upper layers, logs and etcd's data.
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

mkdir -p "$WORK/probe/lower" "$WORK/probe/upper" "$WORK/probe/work" "$WORK/probe/merged"
if ! unshare -m --propagation private sh -c "mount -t overlay overlay -o \
lowerdir=$WORK/probe/lower,upperdir=$WORK/probe/upper,workdir=$WORK/probe/work $WORK/probe/merged" \
    > "$WORK/probe.log" 2>&1; then
  skip "overlayfs is unavailable: $(cat "$WORK/probe.log")"
fi
if ! unshare -m -p -f --mount-proc --propagation private sh -c \
    'mount -t tmpfs tmpfs /run && ip netns add deploy-probe && ip -n deploy-probe link set lo up &&
     ip netns del deploy-probe' > "$WORK/probe.log" 2>&1; then
  skip "network or PID namespaces are unavailable (ip netns): $(cat "$WORK/probe.log")"
fi
rm -rf "$WORK/probe" "$WORK/probe.log"

# --- what the host has before ------------------------------------------------
host_state() {
  local p
  for p in "${PACKAGES[@]}"; do
    echo "$p: $(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null || echo not known)"
  done
  for p in /usr/bin/kvpool-node /usr/bin/kvpoolctl /lib/systemd/system/kvpool-node.service \
           /etc/kvpool /var/lib/kvpool /etc/systemd/system/multi-user.target.wants/kvpool-node.service; do
    if [[ -e "$p" || -L "$p" ]]; then echo "$p: $(stat -c '%F %a %U:%G %s %Y' "$p")"; else echo "$p: absent"; fi
  done
  echo "passwd kvpool: $(getent passwd kvpool || echo none)"
  echo "group kvpool: $(getent group kvpool || echo none)"
  echo "users kvd-*: $(getent passwd | grep -c '^kvd-' || true)"
}
host_state > "$WORK/host-before.txt"
had_node=no
[[ -e /usr/bin/kvpool-node ]] && had_node=yes

# --- 1. make package, as the README writes it ----------------------------------
# Another build in the same tree (ninja) must finish first: two ninjas in
# one build directory corrupt each other's state.
for _ in $(seq 1 120); do
  pgrep -x ninja > /dev/null || break
  sleep 1
done
cd "$SRC"
# The command an operator types: nothing from a calling make (its flags,
# its variables) reaches it.
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
if [[ "$REL" == build ]]; then
  make_cmd=(make package)
else
  make_cmd=(make package "BUILD_DIR=$REL")
fi
step "${make_cmd[*]}    (in $SRC)"
t0=$SECONDS
rc=0
"${make_cmd[@]}" < /dev/null > "$WORK/make-package.log" 2>&1 || rc=$?
if [[ $rc -ne 0 ]]; then
  tail -60 "$WORK/make-package.log"
  fail "'${make_cmd[*]}' failed (exit status $rc)"
fi
tail -3 "$WORK/make-package.log"
t_package=$((SECONDS - t0))
version="$(sed -n '1s/^kvpool (\([0-9.]*\)).*/\1/p' "$SRC/packaging/changelog")"
[[ -n "$version" ]] || fail "no version at the top of packaging/changelog"
found=0
for p in "${PACKAGES[@]}"; do
  n=0
  for f in "$REL/packages/${p}_${version}_"*.deb; do [[ -e "$f" ]] && n=$((n + 1)); done
  [[ $n -eq 1 ]] || fail "'${make_cmd[*]}' left $n packages $p of $version in $REL/packages (want 1): $(ls "$REL/packages" 2>&1)"
  found=$((found + 1))
done
# The README's glob takes every .deb there: another version's package would
# make apt install two versions of one package.
all=("$REL"/packages/*.deb)
[[ ${#all[@]} -eq ${#PACKAGES[@]} ]] ||
  fail "$REL/packages holds ${#all[@]} .deb files, not the ${#PACKAGES[@]} of $version: ${all[*]}"
echo "deploy_test: package: '${make_cmd[*]}' built $found packages of $version in $REL/packages (${t_package} s)"

# --- 2 and 3, in the namespaces --------------------------------------------------
step "apt-get install and the cluster, in a private mount and PID namespace"
rc=0
unshare --mount --pid --fork --mount-proc --kill-child --propagation private \
  bash "$HERE/in_namespace.sh" "$WORK" "$REL" "$version" < /dev/null || rc=$?

# --- 4. the host is unchanged ---------------------------------------------------
host_state > "$WORK/host-after.txt"
if ! diff -u "$WORK/host-before.txt" "$WORK/host-after.txt"; then
  fail "the host changed (above): the install must stay inside the namespace's overlays"
fi
if [[ $had_node == no && -e /usr/bin/kvpool-node ]]; then
  fail "the host has /usr/bin/kvpool-node after the test"
fi
[[ $rc -eq 0 ]] || fail "in the namespace (exit status $rc; see above)"
echo "deploy_test: host: unchanged (no /usr/bin/kvpool-node, same packages and accounts)"
echo "deploy_test: ok"
