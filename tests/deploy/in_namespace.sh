#!/usr/bin/env bash
# deploy_test.sh's second half, the first process of a private mount and PID
# namespace (unshare --mount --pid --fork --kill-child): overlays over /usr,
# /etc and /var whose upper layers are in WORK, so that what apt-get, the
# postinst and the test write goes there and the host's trees are left as
# they were; a fresh /run (no systemd runs in it, as on the CI host, and
# network namespaces made there vanish with this namespace). Then, from the
# source directory, `apt-get install -y ./BUILD/packages/*.deb` as the README
# writes it, the checks of what it installed, and deploy_driver.py.
# usage: in_namespace.sh WORK BUILD_REL VERSION
set -euo pipefail

fail() { echo "deploy_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }
WORK="$1" REL="$2" VERSION="$3"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
[[ $$ -eq 1 ]] || fail "in_namespace.sh must be the first process of its own PID namespace"

for d in usr etc var; do
  mkdir -p "$WORK/overlay/$d/upper" "$WORK/overlay/$d/work"
  mount -t overlay "deploy-$d" \
    -o "lowerdir=/$d,upperdir=$WORK/overlay/$d/upper,workdir=$WORK/overlay/$d/work" "/$d" ||
    fail "cannot lay an overlay over /$d"
done
mount -t tmpfs -o mode=0755,nosuid,nodev deploy-run /run || fail "cannot mount a tmpfs on /run"
mkdir -m 1777 /run/lock

cd "$SRC"
step "apt-get install -y ./$REL/packages/*.deb    (in $SRC)"
t0=$SECONDS
apt-get install -y ./"$REL"/packages/*.deb > "$WORK/apt-get.log" 2>&1 ||
  { cat "$WORK/apt-get.log"; fail "apt-get install -y ./$REL/packages/*.deb failed"; }
grep -E '^(Setting up|Created symlink|Processing triggers)' "$WORK/apt-get.log" || true
t_apt=$((SECONDS - t0))

for p in kvpool-node kvpool-tools libkvpool0 libkvpool-dev python3-kvpool; do
  st="$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>&1)" || true
  [[ "$st" == "install ok installed $VERSION" ]] || fail "dpkg says of $p: '$st' (want 'install ok installed $VERSION')"
done
pw="$(getent passwd kvpool)" || fail "the postinst added no kvpool user"
gr="$(getent group kvpool)" || fail "the postinst added no kvpool group"
IFS=: read -r _ _ uid gid _ home shell <<< "$pw"
[[ "$gid" == "$(cut -d: -f3 <<< "$gr")" ]] || fail "the kvpool user's group is not kvpool ($pw; $gr)"
[[ "$home" == /var/lib/kvpool && "$shell" == /usr/sbin/nologin ]] ||
  fail "the kvpool user is not the postinst's system user: $pw"
[[ "$uid" -lt 1000 ]] || fail "the kvpool user is not a system user: $pw"
unit=/lib/systemd/system/kvpool-node.service
[[ -f "$unit" ]] || fail "no $unit after the install"
dpkg -L kvpool-node | grep -qx "$unit" || fail "dpkg does not list $unit as kvpool-node's"
[[ "$(stat -c '%a %U:%G' /var/lib/kvpool)" == "750 kvpool:kvpool" ]] ||
  fail "/var/lib/kvpool is $(stat -c '%a %U:%G' /var/lib/kvpool), want 750 kvpool:kvpool"
[[ "$(/usr/bin/kvpool-node --version)" == "kvpool-node $VERSION" ]] ||
  fail "the installed kvpool-node says '$(/usr/bin/kvpool-node --version)'"
echo "deploy_test: install: 'apt-get install -y ./$REL/packages/*.deb' (${t_apt} s): 5 packages" \
     "'install ok installed $VERSION', user ${pw%%:*} uid $uid gid $gid, $unit"

step "a cluster from the installed packages (deploy_driver.py)"
# Not exec'd: the first process of a PID namespace ignores signals it has
# no handler for, so the driver runs as its child.
PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -X faulthandler "$HERE/deploy_driver.py" "$WORK"
