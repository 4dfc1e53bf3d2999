#!/usr/bin/env bash
# Installs every Debian package that kvpool's build, tests and benchmarks need.
# Safe to run repeatedly: packages already installed are skipped, and apt is
# not touched at all when nothing is missing. Run as root on Debian 12.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build pkg-config clang clang-format
  # libraries
  libucx-dev ucx-utils liburing-dev libssl-dev libcpp-httplib-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libzmq3-dev libmsgpack-cxx-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # integration tests and benchmarks
  etcd-server etcd-client redis-server redis-tools prometheus fio iperf3
  chromium curl procps iproute2 iptables util-linux
  # Debian packages (make package) and their test: cpack's shlibdeps, lintian,
  # systemd-analyze for the service unit
  dpkg-dev file lintian systemd
  # python package and connectors (pip/setuptools/wheel/venv: offline pip install ./python)
  python3 python3-numpy python3-pytest python3-torch python3-zmq python3-msgpack
  python3-pip python3-setuptools python3-wheel python3-venv
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm validate the Kubernetes manifests (deploy/k8s); any
# installed node and npm will do (Debian's: nodejs npm).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

  # Debian ships redis-server and etcd-server as system services; kvpool's
  # tests and benchmarks start their own instances on free ports, so the
  # system ones are not needed. Stopping them is best-effort (no init system
  # in containers).
  for svc in redis-server etcd prometheus; do
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
fi

# The manifest validator's npm packages, pinned by its lock file, installed
# again only when the lock file changed.
VALIDATE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/k8s/validate"
if ! cmp -s "$VALIDATE/package-lock.json" "$VALIDATE/node_modules/.kvpool-lock" 2>/dev/null; then
  echo "install-deps: npm ci in deploy/k8s/validate"
  (cd "$VALIDATE" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$VALIDATE/package-lock.json" "$VALIDATE/node_modules/.kvpool-lock"
fi
