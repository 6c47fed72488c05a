#!/usr/bin/env bash
# Checkpoint costs with ResNet-50's state (23.5 M parameters + momentum, ~180 MiB a file):
#  1. preemption: SIGTERM mid-training -> the step finishes, the checkpoint is written
#     synchronously, the process exits 75; prints the seconds from the signal to the exit.
#  2. asynchronous checkpoints: step times of a run writing a checkpoint every 5 steps in the
#     background against the same run without checkpoints; prints the loop's stall (state
#     copy) and the step-time cost while the writer runs.
# Usage: bench/checkpoint_bench.sh [THREADS] (from the repository root, after a build).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SPOTRAIN_BIN:-build/spotrain}
THREADS=${1:-2}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
common=(train --model resnet50 --data synthetic --train-limit 4096 --test-limit 8 --batch-size 8
        --threads "$THREADS" --log-every 1 --lr 0.001)

# 1. SIGTERM -> exit
"$BIN" "${common[@]}" --epochs 100 --ckpt-dir "$OUT/term" > "$OUT/term.log" 2>&1 &
pid=$!
until grep -q "step 6/" "$OUT/term.log" 2>/dev/null; do sleep 0.05; done
t0=$(date +%s.%N)
kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
t1=$(date +%s.%N)
size=$(du -m "$OUT"/term/ckpt-*.h5 | awk '{print $1}')
python3 - "$t0" "$t1" "$code" "$size" <<'PY'
import sys
t0, t1, code, size = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"SIGTERM -> exit: {t1 - t0:.2f} s (exit code {code}, checkpoint {size} MiB)")
PY
grep -E "checkpoint written|stopped by" "$OUT/term.log" | sed 's/^/  /'

# 2. background checkpoints every 5 steps vs none (same run otherwise)
"$BIN" "${common[@]}" --steps 41 --ckpt-dir "" --metrics "$OUT/none.jsonl" > "$OUT/none.log" 2>&1
"$BIN" "${common[@]}" --steps 41 --ckpt-every 5 --keep 2 --ckpt-dir "$OUT/async" \
  --metrics "$OUT/async.jsonl" > "$OUT/async.log" 2>&1
python3 - "$OUT" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
def step_times(name):
    t = {}
    for line in open(f"{out}/{name}.jsonl"):
        j = json.loads(line)
        if j["type"] == "step":
            t[j["step"]] = 8 / j["images_per_sec"]
    return t
none, asy = step_times("none"), step_times("async")
steps = [s for s in none if s > 5]  # after warm-up
base = statistics.median(none[s] for s in steps)
after = [asy[s] for s in steps if (s - 1) % 5 == 0]      # first step after each checkpoint
others = [asy[s] for s in steps if (s - 1) % 5 != 0]
snaps = [float(x) for x in re.findall(r"state copied in ([0-9.]+) s", open(f"{out}/async.log").read())]
writes = [float(x) for x in re.findall(r"in ([0-9.]+) s \(background\)", open(f"{out}/async.log").read())]
print(f"median step, no checkpoints:            {base:.3f} s")
print(f"state copy (the loop's stall), median:   {statistics.median(snaps):.3f} s (max {max(snaps):.3f}, {len(snaps)} checkpoints)")
print(f"first step after a checkpoint, median:   {statistics.median(after):.3f} s (+{statistics.median(after) - base:.3f} s)")
print(f"other steps while writing, median:       {statistics.median(others):.3f} s")
print(f"background write + verify + publish:     {statistics.median(writes):.2f} s median")
print(f"total time, 36 steps: none {sum(none[s] for s in steps):.1f} s, async {sum(asy[s] for s in steps):.1f} s")
PY
