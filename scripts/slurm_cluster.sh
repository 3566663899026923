#!/usr/bin/env bash
# Slurm on the two hosts of scripts/netns_cluster.sh, for the srun test (tests/multihost/check_slurm.py,
# docs/MULTIHOST.md): munged and slurmctld on the first host, a slurmd on each, every file of theirs in DIR.
#   scripts/slurm_cluster.sh up DIR [LIFETIME_S]  the hosts, then Slurm on them (a partition of both, 2 CPUs each);
#                                                 DIR's path at most 64 characters (sockets go below it)
#   scripts/slurm_cluster.sh srun DIR ARGS...     srun on the first host, as one logs in to a cluster's first node
#   scripts/slurm_cluster.sh down DIR             Slurm's daemons go with the hosts (netns_cluster.sh down)
# `up` exits 77 (autotools' "skipped") with the reason when the hosts cannot be made here or Slurm is not installed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns_cluster.sh"
readonly skip_code=77

die() { echo "slurm_cluster: $*" >&2; exit 1; }

hosts_of() { cut -d' ' -f1 "$1/hostfile"; }
address_of() { awk -v h="$2" '$2 == h { print $1 }' "$1/etc_hosts"; }
on() { "$cluster" exec "$@"; }  # on DIR HOST CMD...

# Each host reads its own slurm.conf, alike but for TmpFS: Slurm's PMIx plugin names its clients' folder under
# TmpFS by job and step alone, and these hosts share one /tmp, where a real cluster's nodes each have their own.
write_config() {
  local dir=$1 host=$2 first=$3 node
  cat <<EOF
ClusterName=ddplab-netns
SlurmctldHost=$first($(address_of "$dir" "$first"))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
DebugFlags=NO_CONF_HASH
TmpFS=$dir/tmp.$host
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmdSpoolDir=$dir/spool.%n
SlurmdLogFile=$dir/slurmd.%n.log
EOF
  for node in $(hosts_of "$dir"); do
    echo "NodeName=$node NodeAddr=$(address_of "$dir" "$node") CPUs=2 RealMemory=2000 State=UNKNOWN"
  done
  echo "PartitionName=hosts Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

up() {
  local dir=$1 lifetime=${2:-3600} tool first host
  for tool in slurmctld slurmd srun sinfo munged mungekey; do
    command -v "$tool" >/dev/null || {
      echo "slurm_cluster: no '$tool' (Debian: apt-get install slurmctld slurmd slurm-client)" >&2
      exit "$skip_code"
    }
  done
  # slurmd's step sockets, DIR/spool.<host>/<host>_<job>.<step>, are Unix sockets: their paths may not pass 107 bytes.
  local whole
  whole=$(realpath -m "$dir")
  [ ${#whole} -le 64 ] || die "$whole: a folder of at most 64 characters, as slurmd's sockets go below it (try /tmp)"
  "$cluster" up "$dir" "$lifetime"  # exits 77 itself where the hosts cannot be made
  dir=$(cd "$dir" && pwd)
  trap "$(printf '%q down %q' "$cluster" "$dir")" EXIT  # as netns_cluster.sh's up: nothing left behind
  first=$(hosts_of "$dir" | head -n1)
  mkdir "$dir/state"
  for host in $(hosts_of "$dir"); do
    mkdir "$dir/spool.$host" "$dir/tmp.$host"
    write_config "$dir" "$host" "$first" >"$dir/slurm.$host.conf"
  done
  # munged serves both hosts through its socket in DIR (a file: the hosts share the filesystem, not the network).
  mungekey --create --keyfile="$dir/munge.key"
  on "$dir" "$first" munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
  on "$dir" "$first" slurmctld -f "$dir/slurm.$first.conf"
  for host in $(hosts_of "$dir"); do on "$dir" "$host" slurmd -f "$dir/slurm.$host.conf"; done
  local deadline=$((SECONDS + 30)) idle
  until idle=$(on "$dir" "$first" env SLURM_CONF="$dir/slurm.$first.conf" sinfo -h -t idle -o %D 2>/dev/null) &&
    [ "${idle:-0}" = 2 ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "the nodes did not come up within 30 s: $(tail -n3 "$dir"/slurm*.log)"
    sleep 0.2
  done
  trap - EXIT
  echo "slurm_cluster: partition 'hosts' of $(hosts_of "$dir" | tr '\n' ' ')up in $dir"
}

srun_on() {
  local dir first
  dir=$(cd "$1" && pwd)
  shift
  first=$(hosts_of "$dir" | head -n1)
  on "$dir" "$first" env SLURM_CONF="$dir/slurm.$first.conf" srun "$@"
}

usage="usage: $0 up DIR [LIFETIME_S] | srun DIR ARGS... | down DIR"
[ $# -ge 2 ] || die "$usage"
command=$1
shift
case "$command" in
  up) up "$@" ;;
  srun) srun_on "$@" ;;
  down) "$cluster" down "$1" ;;
  *) die "$usage" ;;
esac
