#!/usr/bin/env bash
# The GPU checks of issue 37 (attention at flash speed for every scheme), from the checkout on
# a CUDA machine; everything lands in $OUT (default /tmp/posenc-gpu):
#
#   OUT=/some/folder bash benchmarks/gpu_attention.sh
#
# 1. tests/attention/test_cuda.py: the differential grid on CUDA (every rotary/bias scheme x
#    backend x fp32/bf16 weights x window/cached decode, against float64 math), every learned
#    score_mod training through compiled flex (forward and backward, gradients against float64
#    math), bf16 staying bf16 in SDPA and flex, four lengths compiling at most twice and each
#    right (the grid runs last: a timeout cuts it, not the others; every test runs, no -x):
#    attention_cuda_tests.txt
# 2. `posenc bench bias encoder --device cuda` (CUDA-event timings, bf16; every bias scheme at
#    n = 4,096 and 16,384 against flash attention without bias and SDPA with the bias
#    materialised; the training step against torch.nn.TransformerEncoder): gpu_attention.md,
#    whose tables go into the attention section of benchmarks/gpu.md with the device name.
# Needs torch with CUDA (flex_attention, torch >= 2.5), triton and pytest; no package index.
source "$(dirname "$0")/gpu_setup.sh" attention_device.txt
timeout 240 "$PY" -m pytest -v -p no:cacheprovider -o addopts= --durations=10 \
    tests/attention/test_cuda.py \
    > "$OUT/attention_cuda_tests.txt" 2>&1
echo "attention tests on CUDA: exit $? ($(tail -n 1 "$OUT/attention_cuda_tests.txt"))"
timeout 300 "$PY" -m posenc.app.cli bench bias encoder --device cuda \
    --output "$OUT/gpu_attention.md" > "$OUT/attention_bench.txt" 2>&1
echo "bench bias encoder --device cuda: exit $?"
tail -n 60 "$OUT/attention_bench.txt"
