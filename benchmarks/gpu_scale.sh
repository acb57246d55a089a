#!/usr/bin/env bash
# The study of issue #38 in one command: `posenc extrapolate --preset scale` on one GPU, from
# the repository root, written to $OUT (default extrapolate-results-scale), resumable: run it
# again with the same $OUT (in a second GPU session, say) and it continues where it stopped —
# finished models are not trained or evaluated again, a model cut short continues from its
# last checkpoint (every 5 minutes of training), and results.json / results.md / the figures
# are rewritten after every model, so a session that ends early keeps every finished one.
#
#   OUT=/path/to/out bash benchmarks/gpu_scale.sh               # the preset
#   OUT=/path/to/out bash benchmarks/gpu_scale.sh --compile     # extra flags go to the command
#   STEP_COST=1 OUT=... bash benchmarks/gpu_scale.sh            # also the step-cost probe after
#   SYNC_CHECK=1 OUT=... bash benchmarks/gpu_scale.sh           # first check that no training
#                                                               # step waits for the GPU (~1 min)
#
# Beside the results it writes environment.txt (GPU, driver, Python, torch, the corpus's
# Python version), log.txt (the run's output) and wall_seconds.txt (this session's wall time,
# appended per session).
set -euo pipefail
OUT="${OUT:-extrapolate-results-scale}"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
{
    date -u +"started %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PYTHON" -c 'import platform, torch, posenc; print("python", platform.python_version(), "(the default corpus: its standard library)"); print("torch", torch.__version__, "cuda", torch.version.cuda); print("posenc", posenc.__version__)'
} >>"$OUT/environment.txt" 2>&1
if [ "${SYNC_CHECK:-0}" = 1 ]; then
    "$PYTHON" benchmarks/sync_check.py 2>&1 | tee -a "$OUT/sync_check.txt" || true
fi
started=$SECONDS
"$PYTHON" -m posenc.extrapolate --preset scale --device cuda --out "$OUT" --resume --no-progress "$@" 2>&1 | tee -a "$OUT/log.txt"
echo "$((SECONDS - started))" >>"$OUT/wall_seconds.txt"
if [ "${STEP_COST:-0}" = 1 ]; then
    "$PYTHON" benchmarks/step_cost.py --device cuda --dim 512 --depth 8 --heads 8 --train-len 256 \
        --batch-size 32 --precision bf16 --steps 200 --rounds 1 --json "$OUT/step_cost.json" \
        2>&1 | tee -a "$OUT/step_cost.txt"
fi
