#!/bin/bash
# A/B of engines on a tmpfs file: this tree against an older one (BASE, a directory holding
# that commit's gpufio/, e.g. git archive COMMIT gpufio | tar -x -C BASE), interleaved, 3 s
# verified runs, 3 rounds. Each CASE is an engine and its --set keys; by default gpu-uring
# and cpu-gpu, so run as root on the GPU machine; on a CPU-only machine name CPU cases:
#   bench/ab-trees.sh BASE
#   bench/ab-trees.sh BASE "uring iodepth=32" "psync iodepth=1"
set -u
export PYTHONUNBUFFERED=1
HEAD=$PWD
BASE=$(cd "${1:?usage: bench/ab-trees.sh BASE}" && pwd)
mkdir -p /mnt/gt && mount -t tmpfs -o size=3g tmpfs /mnt/gt
trap "umount /mnt/gt" EXIT  # the file is 2 GiB of RAM: give it back
cat > /tmp/prep.toml <<P
[global]
targets = ["/mnt/gt/t.dat"]
size = "2g"
P
PYTHONPATH=/tmp/site:$HEAD python3 -m gpufio prepare --yes /tmp/prep.toml
shift
[ $# -gt 0 ] || set -- "gpu-uring rings=8 iodepth=128" "cpu-gpu segments=4 sqe_async=true iodepth=512"
for case in "$@"; do
  set -- $case; eng=$1; shift
  sets=""; for kv in "$@"; do sets="$sets --set $kv"; done
  for r in 1 2 3; do
    for tree in head base; do
      d=$HEAD; [ $tree = base ] && d=$BASE
      iops=$(cd $d && PYTHONPATH=/tmp/site:$d python3 -m gpufio run /tmp/prep.toml -q -f json \
        --set engine=$eng --set verify=true --set runtime=3s --set time_based=true $sets \
        | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(round(j['read']['iops']), j['error'], j['verify']['failures'])")
      echo "ab: $eng round $r $tree iops/error/verify_failures: $iops"
    done
  done
done
