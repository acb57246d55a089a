# Sourced by gpu_run.sh and gpu_attention.sh: $OUT made and made absolute (the scripts then
# move to the checkout's root, where a relative $OUT would name another folder), $PY, src on
# the path, the device and versions written to $OUT/$1.
set -u
OUT=${OUT:-/tmp/posenc-gpu}
PY=${PYTHON:-python}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=src
cd "$(dirname "${BASH_SOURCE[0]}")/.."
{ nvidia-smi -L; "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    > "$OUT/$1" 2>&1
cat "$OUT/$1"
