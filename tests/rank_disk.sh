#!/bin/sh
# A disk of its own for each rank on one machine, as node-local NVMe on separate hosts:
#   rank_disk.sh DISKS MOUNT COMMAND...
# runs COMMAND in a private mount namespace with DISKS/disk-RANK (RANK from Open MPI's
# OMPI_COMM_WORLD_RANK, 0 without it) mounted at MOUNT, so every rank sees a different folder at
# the same path. Needs root (unshare -m); exits 77 where it cannot make one.
set -eu
disks=$1 mount=$2
shift 2
rank=${OMPI_COMM_WORLD_RANK:-0}
mkdir -p "$disks/disk-$rank" "$mount"
exec unshare -m --propagation private /bin/sh -c 'mount --bind "$1" "$2" || exit 77; shift 2; exec "$@"' \
  sh "$disks/disk-$rank" "$mount" "$@"
