#!/usr/bin/env bash
# GPU readiness check (issue 14): the test suite with CUDA visible, bf16 training throughput and MFU of
# transformer-base translation, BERT-base and BERT-large (seq 128), and beam-5 decoding speed, in at
# most 8 minutes on one GPU; everything goes into one JSON file. Without CUDA the GPU sections are
# recorded as skipped and it takes seconds. Options: scripts/gpu_check.sh --help.
#
#   scripts/gpu_check.sh                          # -> $OUT/gpu_check.json if $OUT is set, else ./gpu_check.json
#   scripts/gpu_check.sh --out results/gpu.json --only train_bert_large,decode_beam5
#
# Python: $PYTHON if set, else the active virtual environment's, else the repository's .venv, else python3.
# On a GPU machine that interpreter needs a CUDA build of torch (the JSON says so when it has none).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    py="$VIRTUAL_ENV/bin/python"
elif [[ -x "$here/../.venv/bin/python" ]]; then
    py="$here/../.venv/bin/python"
else
    py=python3
fi
exec "$py" "$here/gpu_check.py" "$@"
