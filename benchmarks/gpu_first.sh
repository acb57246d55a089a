#!/usr/bin/env bash
# The first script to run on a new GPU (issue 43): versions; RoPE against a clone, three ways;
# host time per eager call; a decode step against transformers, with a sync check; ALiBi, T5
# and FIRE attention against flash at n = 4,096, forward and forward + backward; a training
# step against torch.nn.TransformerEncoder; a decode step, flex calls with a mask and training
# steps in CUDA's sync debug mode, and which SDPA kernel takes grouped heads. About 8 minutes (--budget 480), inside one 600-s
# GPU call with its start; every row printed as it is measured, into $OUT/gpu_first.md:
#
#   OUT=/some/folder bash benchmarks/gpu_first.sh
#
# Needs torch with CUDA, triton and transformers (any 5.x); no package index.
source "$(dirname "$0")/gpu_setup.sh" first_device.txt
timeout 540 "$PY" benchmarks/gpu_first.py --budget 480 | tee "$OUT/gpu_first.md"
echo "gpu_first: exit ${PIPESTATUS[0]}"
