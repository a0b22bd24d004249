#!/usr/bin/env bash
# Run one gpufio profile while sampling the kernel's side every second, so that a stall, if
# one comes, shows who held the I/Os: each disk's requests in flight (/sys/block/*/inflight),
# I/O and memory pressure, every gpufio thread's state and wait channel, and the stacks of
# io_uring's worker and SQ threads. The samples (the last 2 MB) go to $OUT/samples.txt, the
# run's output to $OUT/run.log, its result to $OUT/run.json.
#
#     OUT=/tmp/watch bash bench/stall_watch.sh profiles/gnn-igbh.toml [gpufio run options]
set -o pipefail
export PYTHONUNBUFFERED=1
profile=${1:?usage: OUT=DIR bench/stall_watch.sh PROFILE [gpufio run options]}
shift
OUT=${OUT:?set OUT to the directory the samples go to}
mkdir -p "$OUT"
( python3 -m gpufio run "$profile" -f json -o "$OUT/run.json" "$@" > "$OUT/run.log" 2>&1
  echo "rc $?" >> "$OUT/run.log" ) &
RUN=$!
while kill -0 $RUN 2>/dev/null; do
  {
    echo "== $(date +%T.%N)"
    for f in /sys/block/*/inflight; do echo "$f $(cat "$f")"; done
    cat /proc/pressure/io /proc/pressure/memory 2>/dev/null
    for p in $(pgrep -f "gpufio run $profile"); do
      for t in /proc/$p/task/*; do
        echo "$t $(cat "$t/comm") $(awk '{print $3}' "$t/stat") $(cat "$t/wchan" 2>/dev/null)"
      done
    done
    for t in $(pgrep iou-wrk) $(pgrep iou-sqp); do
      echo "worker $t $(cat "/proc/$t/comm") $(awk '{print $3}' "/proc/$t/stat")"
      head -8 "/proc/$t/stack" 2>/dev/null
    done
  } >> "$OUT/samples.txt" 2>&1
  tail -c 2000000 "$OUT/samples.txt" > "$OUT/samples.tmp" && mv "$OUT/samples.tmp" "$OUT/samples.txt"
  sleep 1
done
tail -3 "$OUT/run.log"
