#!/usr/bin/env bash
# The GPU checks of issue 44 (posenc inside transformers models), from the checkout on a CUDA
# machine; everything lands in $OUT (default /tmp/posenc-gpu):
#
#   OUT=/some/folder bash benchmarks/gpu_patch.sh
#
# 1. tests/hf/test_patch_cuda.py: seven families of every rotation form the patch reads,
#    patched on CUDA (the Triton kernel): float32 logits within 2e-5 of the unpatched model's,
#    the same greedy tokens, training gradients, and bfloat16 rotations closer to float64
#    than transformers' own: patch_cuda_tests.txt
# 2. `posenc bench hf --device cuda`: the Llama-style model (hidden 512, 8 layers, GQA 2:1),
#    a 512-token prefill and 128 decode steps, patched against unpatched (time, the rotary
#    share, memory): gpu_hf.md, whose table goes into benchmarks/hf.md with the device name.
# Needs torch with CUDA, triton, pytest and transformers 5.x; no package index.
source "$(dirname "$0")/gpu_setup.sh" patch_device.txt
timeout 180 "$PY" -m pytest -v -s -p no:cacheprovider -o addopts= tests/hf/test_patch_cuda.py \
    > "$OUT/patch_cuda_tests.txt" 2>&1
echo "patch tests on CUDA: exit $? ($(tail -n 1 "$OUT/patch_cuda_tests.txt"))"
timeout 300 "$PY" -m posenc.app.cli bench hf --device cuda --output "$OUT/gpu_hf.md" \
    > "$OUT/hf_bench.txt" 2>&1
echo "bench hf --device cuda: exit $?"
tail -n 40 "$OUT/hf_bench.txt"
