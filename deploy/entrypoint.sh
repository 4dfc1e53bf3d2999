#!/bin/sh
# kvpool-node image entrypoint.
#   (no arguments)      kvpool-node --config $KVPOOL_CONFIG
#   -FLAGS ...          kvpool-node --config $KVPOOL_CONFIG FLAGS ... (flags
#                       override the file; Kubernetes passes the node id and
#                       peer address this way)
#   COMMAND ...         runs COMMAND (kvpoolctl stat, a shell, ...)
# The node replaces this script (exec), so it is the container's first
# process and gets the SIGTERM of a stop: it writes DRAM to the SSD tier and
# exits.
set -eu
KVPOOL_CONFIG="${KVPOOL_CONFIG:-/etc/kvpool/kvpool-node.conf}"
KVPOOL_NODE="${KVPOOL_NODE:-kvpool-node}"

if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  if [ -f "$KVPOOL_CONFIG" ]; then
    exec "$KVPOOL_NODE" --config "$KVPOOL_CONFIG" "$@"
  fi
  exec "$KVPOOL_NODE" "$@"
fi
exec "$@"
