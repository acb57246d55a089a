#!/usr/bin/env bash
# The GPU checks of issue 36 (the Triton rotary kernel), from the checkout on a CUDA machine,
# in under 5 minutes; everything lands in $OUT (default /tmp/posenc-gpu):
#
#   OUT=/some/folder bash benchmarks/gpu_run.sh
#
# 1. the kernel's cases against the float64 formula, compiled on CUDA, directly and through the
#    public modules with POSENC_ROTARY_KERNEL=triton (the files the suite runs under Triton's
#    interpreter): triton_cuda_tests.txt
# 2. `posenc bench rope --device cuda` (CUDA-event timings; bf16 and fp32; posenc in and out
#    of place, transformers eager and compiled, the clone floor; a decode step): gpu_rope.md,
#    whose tables go into the rotary section of benchmarks/gpu.md with the device name.
# 3. `sync_check.py --decode`: cached decode steps in CUDA's sync debug mode (item 3):
#    decode_sync.txt
# Needs torch with CUDA, triton, pytest and transformers (any 5.x); no package index.
source "$(dirname "$0")/gpu_setup.sh" device.txt
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts= --durations=10 \
    tests/encodings/rotary/kernels/interpreted_triton.py tests/encodings/rotary/kernels/interpreted_modules.py \
    > "$OUT/triton_cuda_tests.txt" 2>&1
echo "kernel tests on CUDA: exit $? ($(tail -n 1 "$OUT/triton_cuda_tests.txt"))"
timeout 90 "$PY" benchmarks/sync_check.py --decode > "$OUT/decode_sync.txt" 2>&1
echo "decode steps without host synchronisation: exit $?"
grep -v "^ " "$OUT/decode_sync.txt" | head -n 20
timeout 300 "$PY" -m posenc.app.cli bench rope --device cuda --output "$OUT/gpu_rope.md" \
    > "$OUT/bench.txt" 2>&1
echo "bench rope --device cuda: exit $?"
tail -n 40 "$OUT/bench.txt"
