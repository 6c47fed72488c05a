#!/usr/bin/env bash
# Several "hosts" on one machine for the multi-host tests: network namespaces on a private
# bridge, reachable from the launcher (this namespace) on a private /24, and an rsh agent that
# Open MPI uses to start its daemons "on" a host (ip netns exec instead of ssh).
#   netns_hosts.sh up PREFIX N [DISK]  make bridge PREFIX-br and namespaces PREFIX-1..N, hosts
#                                    NET.1..NET.N (NET.254 is the launcher); prints the agent's
#                                    path, then NET; exit 77 when namespaces cannot be made here.
#                                    With DISK (a path): each host sees a disk of its own there
#                                    (a private mount namespace; /tmp/PREFIX-netns/disk-I),
#                                    as node-local NVMe
#   netns_hosts.sh wipe PREFIX I     empty host I's disk (a replacement instance's new disk)
#   netns_hosts.sh hosts PREFIX      the addresses of the hosts whose link is up, one a line
#                                    (a host-discovery command for mpirun.sh)
#   netns_hosts.sh cut PREFIX I      cut host I's link (no packet in or out, no reset sent)
#   netns_hosts.sh poweroff PREFIX I cut host I's link and SIGKILL everything running on it
#   netns_hosts.sh restore PREFIX I  the host's link back up
#   netns_hosts.sh pids PREFIX I     what runs on host I: "PID NAME" lines
#   netns_hosts.sh quota PREFIX I S  host I gets S of one core (e.g. 0.4; "none": no limit), now and
#                                    for what starts on it later: the kernel's CPU quota (cgroup
#                                    v1 cpu.cfs_quota_us, or v2 cpu.max) in 10 ms periods, so that
#                                    hosts sharing a machine run at the speeds they are given, not
#                                    the machine's; exit 77 where no cgroup can be made here
#   netns_hosts.sh down PREFIX       kill what runs on the hosts, remove them and the bridge
# Traffic stays inside: the bridge has no uplink and forwarding is not touched. A host's cgroup is
# entered before `ip netns exec`, which remounts /sys (hiding the cgroups from inside).
set -euo pipefail
cmd=${1:?up|wipe|hosts|cut|poweroff|restore|pids|quota|down} prefix=${2:?prefix}
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "PREFIX: 1-8 lower-case letters and digits" >&2; exit 2; }
net="10.213.$(( $(printf '%s' "$prefix" | cksum | cut -d' ' -f1) % 200 + 20 ))"
dir=/tmp/$prefix-netns
ns_pids() { ip netns pids "$prefix-$1" 2>/dev/null || true; }
# The CPU cgroup of host $1: v1's cpu controller, else the unified (v2) hierarchy.
cgroup_of() {
  if [[ -d /sys/fs/cgroup/cpu && -f /sys/fs/cgroup/cpu/cpu.cfs_period_us ]]; then
    echo "/sys/fs/cgroup/cpu/spotrain-$prefix-$1"
  elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    echo "/sys/fs/cgroup/spotrain-$prefix-$1"
  fi
}
case "$cmd" in
  up)
    n=${3:?number of hosts}
    disk=${4:-}
    command -v ip >/dev/null || { echo "no 'ip' command (Debian: iproute2)" >&2; exit 77; }
    [[ $(id -u) -eq 0 ]] || { echo "network namespaces need root" >&2; exit 77; }
    "$0" down "$prefix" >/dev/null 2>&1 || true
    mkdir -p "$dir"
    if ! ip link add "$prefix-br" type bridge 2>/dev/null; then
      echo "cannot create a bridge (needs CAP_NET_ADMIN)" >&2
      exit 77
    fi
    ip addr add "$net.254/24" dev "$prefix-br"
    ip link set "$prefix-br" up
    for i in $(seq 1 "$n"); do
      ns=$prefix-$i
      ip netns add "$ns" 2>/dev/null || { echo "cannot create network namespaces" >&2; "$0" down "$prefix"; exit 77; }
      ip link add "$prefix-v$i" type veth peer name eth0 netns "$ns"
      ip link set "$prefix-v$i" master "$prefix-br" up
      ip -n "$ns" addr add "$net.$i/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      echo "$net.$i $ns $prefix-v$i $i" >> "$dir/map"
      if [[ -n "$disk" ]]; then mkdir -p "$dir/disk-$i"; fi
    done
    if [[ -n "$disk" ]]; then
      mkdir -p "$disk"
      echo "$disk" > "$dir/disk"
      # Each host's commands run with its own disk mounted at $disk.
      run='ip netns exec "$2" unshare -m --propagation private /bin/sh -c '"'"'mount --bind "$1" "$2" && exec /bin/sh -c "$3"'"'"' sh '"$dir"'/disk-$4 '"$disk"' "$1"'
    else
      run='ip netns exec "$2" /bin/sh -c "$1"'
    fi
    # The rsh agent: `agent [options] HOST command...` runs the command in HOST's namespace.
    # It stays here, on the launcher, as ssh does; and as ssh to a host that went away
    # without a reset, it does not return while the host's link is down.
    cat > "$dir/agent" <<AGENT
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
set -- "\$*" \$(awk -v h="\$host" '\$1 == h { print \$2, \$3, \$4 }' $dir/map)
[ -n "\${2:-}" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
# A /tmp of the host's own, as separate machines have: Open MPI's daemons make their session
# folders there, and two daemons making the same one at once in a shared /tmp can collide.
TMPDIR=$dir/tmp-\$4; export TMPDIR; mkdir -p "\$TMPDIR"
# The host's share of the CPU (netns_hosts.sh quota), entered here: ip netns exec hides /sys/fs/cgroup.
[ -f "$dir/cgroup-\$4" ] && echo \$\$ > "\$(cat "$dir/cgroup-\$4")/cgroup.procs"
$run
rc=\$?
while ip link show "\$3" 2>/dev/null | grep -q 'state DOWN'; do sleep 1; done
exit \$rc
AGENT
    chmod +x "$dir/agent"
    echo "$dir/agent"
    echo "$net"
    ;;
  cut) ip link set "$prefix-v${3:?host}" down ;;
  poweroff)
    ip link set "$prefix-v${3:?host}" down
    for pid in $(ns_pids "$3"); do kill -9 "$pid" 2>/dev/null || true; done
    ;;
  restore) ip link set "$prefix-v${3:?host}" up ;;
  wipe)
    [[ -d "$dir/disk-${3:?host}" ]] || { echo "netns_hosts.sh: host $3 of $prefix has no disk (made by 'up PREFIX N DISK')" >&2; exit 1; }
    find "$dir/disk-$3" -mindepth 1 -delete ;;
  hosts)
    while read -r addr ns veth i; do
      ip link show "$veth" 2>/dev/null | grep -q 'state DOWN' || echo "$addr"
    done < "$dir/map"
    ;;
  pids) for pid in $(ns_pids "${3:?host}"); do echo "$pid $(cat /proc/$pid/comm 2>/dev/null)"; done ;;
  quota)
    i=${3:?host} share=${4:?share of a core, e.g. 0.4, or none}
    cg=$(cgroup_of "$i")
    [[ -n "$cg" ]] || { echo "no CPU cgroup controller here (cgroup v1 cpu or v2 cpu.max)" >&2; exit 77; }
    mkdir -p "$cg" 2>/dev/null || { echo "cannot make cgroup $cg" >&2; exit 77; }
    if [[ "$share" == none ]]; then us=-1; else
      [[ "$share" =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "quota: SHARE must be a number of cores or none" >&2; exit 2; }
      us=$(awk -v s="$share" 'BEGIN { printf "%d", s * 10000 }')
      ((us >= 1000)) || { echo "quota: at least 0.1 of a core" >&2; exit 2; }
    fi
    if [[ -f "$cg/cpu.cfs_quota_us" ]]; then
      echo 10000 > "$cg/cpu.cfs_period_us"
      echo "$us" > "$cg/cpu.cfs_quota_us"
    else
      if ((us < 0)); then echo "max 10000" > "$cg/cpu.max"; else echo "$us 10000" > "$cg/cpu.max"; fi
    fi
    echo "$cg" > "$dir/cgroup-$i"
    # What runs on the host now (threads follow their process).
    for pid in $(ns_pids "$i"); do echo "$pid" > "$cg/cgroup.procs" 2>/dev/null || true; done
    ;;
  down)
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-[0-9]*$" || true); do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    # The host ends of the links before the bridge: a namespace's own cleanup is asynchronous.
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$prefix-v[0-9]*$" || true); do
      ip link del "$l" 2>/dev/null || true
    done
    ip link del "$prefix-br" 2>/dev/null || true
    for f in "$dir"/cgroup-*; do [[ -f "$f" ]] && rmdir "$(cat "$f")" 2>/dev/null || true; done
    rm -rf "$dir"
    ;;
  *) echo "unknown command '$cmd'" >&2; exit 2 ;;
esac
