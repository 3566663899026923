#!/usr/bin/env bash
# Two hosts on one machine, for multi-host runs in the test suite (docs/MULTIHOST.md). A host is a process (its
# holder) in fresh namespaces: network (only loopback and a veth to the other host), UTS (its own hostname, so Open
# MPI sees two nodes) and mount (its own /dev/shm and /etc/hosts); whatever runs on the host joins them.
#   scripts/netns_cluster.sh up DIR [LIFETIME_S]  make the hosts (DIR must not exist; default lifetime 3600 s)
#   scripts/netns_cluster.sh exec DIR HOST CMD...  run CMD on HOST, in the current directory (files are shared)
#   scripts/netns_cluster.sh mpirun DIR ARGS...    mpirun ($MPIRUN) on the first host, launching onto both hosts
#   scripts/netns_cluster.sh down DIR              kill every process on the hosts; namespaces and veth go with them
# `up` exits 77 (autotools' "skipped") with the reason when namespaces cannot be made here. A host whose lifetime
# runs out kills its own processes, so a test killed before its `down` leaves nothing running for long.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
subnet=10.77.0  # private; each cluster has network namespaces of its own, so parallel clusters never collide
readonly skip_code=77

die() { echo "netns_cluster: $*" >&2; exit 1; }
skip() { echo "netns_cluster: cannot make the hosts here: $*" >&2; exit "$skip_code"; }

# The hosts of cluster DIR, in hostfile order.
hosts_of() { cut -d' ' -f1 "$1/hostfile"; }

holder_of() { cat "$1/$2.pid" 2>/dev/null || die "$2: no such host in $1"; }

exec_on() {
  local dir=$1 host=$2 pid
  shift 2
  pid=$(holder_of "$dir" "$host")
  exec nsenter --target "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

# SIGKILL to every process in network namespace NETNS (as readlink /proc/PID/ns/net names it) but this one, until
# none is left (a dying launcher may still fork) or 10 s have passed.
kill_netns_processes() {
  local netns=$1 deadline=$((SECONDS + 10)) ns pid found
  while :; do
    found=()
    for ns in /proc/[0-9]*/ns/net; do
      pid=${ns#/proc/}
      pid=${pid%%/*}
      [ "$pid" != $$ ] && [ "$(readlink "$ns" 2>/dev/null)" = "$netns" ] && found+=("$pid")
    done
    [ ${#found[@]} -eq 0 ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || { echo "netns_cluster: still running in $netns: ${found[*]}" >&2; return 1; }
    kill -KILL "${found[@]}" 2>/dev/null || true
    sleep 0.1
  done
}

# Runs as a host's first process, inside its new namespaces: names the host, gives it its own /dev/shm (shared-memory
# names cannot collide between hosts) and an /etc/hosts naming both hosts, brings loopback up, then lives out the
# lifetime and takes the host's processes with it.
hold() {
  local dir=$1 host=$2 lifetime=$3
  echo "$host" >/proc/sys/kernel/hostname  # this UTS namespace's
  mount -t tmpfs -o mode=1777 tmpfs /dev/shm
  mount --bind "$dir/etc_hosts" /etc/hosts
  ip link set lo up
  readlink /proc/self/ns/net >"$dir/$host.netns"
  sleep "$lifetime" &
  wait $! || true  # `down` kills this shell too
  kill_netns_processes "$(readlink /proc/self/ns/net)"
}

down() {
  local dir=$1 host netns status=0
  [ -f "$dir/hostfile" ] || return 0  # not a cluster (or down already): touch nothing
  for host in $(hosts_of "$dir"); do
    netns=$(cat "$dir/$host.netns" 2>/dev/null) || continue
    kill_netns_processes "$netns" || status=1
  done
  rm -rf "$dir"
  return "$status"
}

up() {
  local dir=$1 lifetime=${2:-3600} why tool
  [[ "$lifetime" =~ ^[1-9][0-9]*$ ]] || die "lifetime '$lifetime': a whole number of seconds"
  for tool in ip unshare nsenter; do
    command -v "$tool" >/dev/null || skip "no '$tool' (Debian: apt-get install iproute2 util-linux)"
  done
  # A rehearsal in throwaway namespaces of all that a host needs; what fails here is this machine's limit, not ours.
  why=$(unshare --net --uts --mount -- sh -c 'echo probe >/proc/sys/kernel/hostname && mount -t tmpfs tmpfs /dev/shm &&
        mount --bind /etc/hosts /etc/hosts && ip link add probe0 type veth peer name probe1' 2>&1) ||
    skip "${why:-failed} (namespaces, mounts and a veth pair need root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  [ -e "$dir" ] && die "$dir exists: give a new directory"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # A failure half-way leaves nothing behind. DIR goes into the trap now: set -e leaves this function, and its
  # locals, before the EXIT trap runs.
  trap "$(printf 'down %q' "$dir")" EXIT

  # Names unique to this cluster (run files from two clusters never mix up), told apart in their first 5
  # characters (tables print hostnames cut short).
  local id hosts i host
  id=$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')
  hosts=("hosta-$id" "hostb-$id")
  for host in "${hosts[@]}"; do echo "$host slots=2"; done >"$dir/hostfile"  # first: `down` knows DIR by it
  {
    echo "127.0.0.1 localhost"
    for i in "${!hosts[@]}"; do echo "$subnet.$((i + 1)) ${hosts[i]}"; done
  } >"$dir/etc_hosts"

  for host in "${hosts[@]}"; do
    # unshare execs the holder in the same process: $! is the host's holder, seen from everywhere by that pid.
    unshare --net --uts --mount -- "$here/netns_cluster.sh" hold "$dir" "$host" "$lifetime" \
      </dev/null >/dev/null 2>"$dir/$host.log" &
    echo $! >"$dir/$host.pid"
    disown
  done
  local deadline=$((SECONDS + 10))
  for host in "${hosts[@]}"; do
    until [ -s "$dir/$host.netns" ]; do
      kill -0 "$(holder_of "$dir" "$host")" 2>/dev/null || die "$host did not start: $(cat "$dir/$host.log")"
      [ "$SECONDS" -lt "$deadline" ] || die "$host did not start within 10 s"
      sleep 0.05
    done
  done

  # The wire between them: a veth pair made with each end inside its host (no name ever exists out here).
  local pa pb
  pa=$(holder_of "$dir" "${hosts[0]}")
  pb=$(holder_of "$dir" "${hosts[1]}")
  ip link add veth0 netns "$pa" type veth peer name veth0 netns "$pb"
  for i in "${!hosts[@]}"; do
    pa=$(holder_of "$dir" "${hosts[i]}")
    # IPv4 only: the host's addresses are its loopback and $subnet.N, nothing link-local besides.
    nsenter --target "$pa" --net sh -c 'f=/proc/sys/net/ipv6/conf/veth0/disable_ipv6; [ ! -e $f ] || echo 1 >$f'
    nsenter --target "$pa" --net ip addr add "$subnet.$((i + 1))/24" dev veth0
    nsenter --target "$pa" --net ip link set veth0 up
  done
  trap - EXIT
  echo "netns_cluster: ${hosts[*]} up in $dir ($subnet.0/24, lifetime $lifetime s)"
}

# mpirun on the first host (as one logs in to a cluster's first node), ranks placed by the hostfile. Open MPI's
# out-of-band channel and its TCP BTL are held to the hosts' subnet, shared memory (vader) serves within a host,
# and the rsh agent stands in for ssh. Open MPI's session directories go in DIR: a killed job leaves them behind,
# and `down` removes DIR.
mpirun_on() {
  local dir
  dir=$(cd "$1" && pwd)  # the agent may run elsewhere
  shift
  [ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export DDPLAB_NETNS_DIR=$dir
  exec_on "$dir" "$(hosts_of "$dir" | head -n1)" "${MPIRUN:-mpirun}" --hostfile "$dir/hostfile" \
    --mca orte_tmpdir_base "$dir" --mca plm_rsh_agent "$here/netns_rsh.sh" --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" "$@"
}

usage="usage: $0 up DIR [LIFETIME_S] | exec DIR HOST CMD... | mpirun DIR ARGS... | down DIR"
[ $# -ge 2 ] || die "$usage"
command=$1
shift
case "$command" in
  up) up "$@" ;;
  exec) [ $# -ge 3 ] || die "$usage"; exec_on "$@" ;;
  mpirun) mpirun_on "$@" ;;
  down) down "$1" ;;
  hold) hold "$@" ;;  # internal: see up
  *) die "$usage" ;;
esac
