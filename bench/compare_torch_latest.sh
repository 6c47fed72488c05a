#!/usr/bin/env bash
# spotrain against the newest PyTorch from PyPI (CPU), with Debian's PyTorch 1.13 as a
# reference column: compare_pytorch.py, once per precision, the PyTorch workers running in
# eager mode and under torch.compile (channels_last), Debian's /usr/bin/python3 eager in both
# layouts, all alternating within each round.
#
# The first run creates a virtual environment (TORCH_VENV, default
# ~/.cache/spotrain/torch-venv) and pip-installs torch and torchvision into it: this
# downloads several GB once (PyPI's Linux wheels bring the CUDA libraries; set
# PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for the smaller CPU-only wheels, whose
# peak RSS is also lower). Later runs reuse it. Not used by CI.
#
# Environment (defaults): THREADS (nproc), STEPS (5), WARMUP (2), ROUNDS (2),
# CASES (resnet50,fmnist), PRECISIONS ("fp32 bf16"), MODES (eager,compile), SPOTRAIN
# (build/spotrain), OUT (bench-out/torch-latest), TORCH_VENV. Writes OUT/<precision>.md
# (the markdown table) and OUT/<precision>.json (every measurement); exits 1 if any
# measurement failed.
#
#   bench/compare_torch_latest.sh
#   CASES=fmnist STEPS=3 PRECISIONS=bf16 bench/compare_torch_latest.sh
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${TORCH_VENV:-$HOME/.cache/spotrain/torch-venv}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
CASES=${CASES:-resnet50,fmnist}
PRECISIONS=${PRECISIONS:-fp32 bf16}
MODES=${MODES:-eager,compile}
SPOTRAIN=${SPOTRAIN:-build/spotrain}
OUT=${OUT:-bench-out/torch-latest}
BASELINE_PY=/usr/bin/python3

die() { echo "compare_torch_latest.sh: error: $*" >&2; exit 1; }

PY=$VENV/bin/python
if [[ ! -x $PY ]]; then
    maker=""
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import venv, ensurepip' >/dev/null 2>&1; then
            maker=$cand
            break
        fi
    done
    [[ -n $maker ]] || die "cannot create the venv $VENV: no python3 with the venv module (on Debian: apt-get install python3-venv)"
    echo "creating $VENV with $(command -v "$maker") ($("$maker" --version 2>&1))" >&2
    "$maker" -m venv "$VENV" || die "cannot create the venv $VENV ($maker -m venv failed)"
fi
if ! "$PY" -c 'import torch, torchvision' >/dev/null 2>&1; then
    echo "installing torch and torchvision into $VENV (several GB, once)" >&2
    "$PY" -m pip install --upgrade pip || die "pip upgrade failed in $VENV"
    "$PY" -m pip install torch torchvision || die "pip install torch torchvision failed in $VENV"
fi
"$PY" -c 'import torch, torchvision; print("venv PyTorch:", torch.__version__, "torchvision", torchvision.__version__)' \
    || die "$PY cannot import torch and torchvision"

baseline=()
if [[ -x $BASELINE_PY ]] && "$BASELINE_PY" -c 'import torch, torchvision' >/dev/null 2>&1; then
    echo "baseline PyTorch: $("$BASELINE_PY" -c 'import torch; print(torch.__version__)') ($BASELINE_PY)"
    baseline=(--baseline-python "$BASELINE_PY" --baseline-layouts "nchw,channels_last")
else
    echo "note: $BASELINE_PY cannot import torch and torchvision (Debian: apt-get install python3-torch python3-torchvision); running without the baseline columns"
fi

mkdir -p "$OUT"
status=0
for prec in $PRECISIONS; do
    echo "== $prec: cases $CASES, $THREADS threads, $STEPS steps after $WARMUP warmup, $ROUNDS rounds, modes $MODES" >&2
    txt=$(mktemp)
    rc=0
    "$PY" "$HERE/compare_pytorch.py" --spotrain "$SPOTRAIN" --threads "$THREADS" \
        --steps "$STEPS" --warmup "$WARMUP" --rounds "$ROUNDS" --cases "$CASES" --precision "$prec" \
        --torch-python "$PY" --torch-modes "$MODES" --torch-layouts channels_last \
        "${baseline[@]}" --markdown --json-out "$OUT/$prec.json" >"$txt" || rc=$?
    cat "$txt"
    # the markdown part of stdout: from its header comment on
    sed -n '/^<!-- bench\/compare_pytorch.py/,$p' "$txt" >"$OUT/$prec.md"
    rm -f "$txt"
    if [[ $rc -ne 0 ]]; then
        echo "compare_torch_latest.sh: $prec: compare_pytorch.py exited with code $rc" >&2
        status=1
    fi
    echo "wrote $OUT/$prec.md and $OUT/$prec.json" >&2
done
exit $status
