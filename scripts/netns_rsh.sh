#!/usr/bin/env bash
# Open MPI's rsh agent (plm_rsh_agent) for scripts/netns_cluster.sh: where ssh would log in to HOST and hand the
# command to a shell, this enters HOST's namespaces and does the same. The cluster is $DDPLAB_NETNS_DIR.
#   netns_rsh.sh HOST CMD...
set -euo pipefail
[ -n "${DDPLAB_NETNS_DIR:-}" ] || { echo "netns_rsh: DDPLAB_NETNS_DIR is not set" >&2; exit 1; }
host=$1
shift
# ssh joins its arguments with spaces for the remote shell; Open MPI quotes them for that.
exec "$(dirname "$0")/netns_cluster.sh" exec "$DDPLAB_NETNS_DIR" "$host" sh -c "$*"
