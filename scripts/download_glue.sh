#!/usr/bin/env bash
# Fetch the GLUE tasks (Wang et al., 2019) in GLUE's own glue_data/ layout into data/glue (or $1):
# CoLA, SST-2, STS-B, QQP, MNLI, QNLI, RTE, WNLI from the archives GLUE's baseline scripts use, and MRPC built
# from Microsoft's paraphrase corpus as those scripts build it (train minus the dev ids, dev = the dev ids).
# Each task's licence is its own (see gluebenchmark.com). `tcli glue --data-dir data/glue` reads the result.
#   scripts/download_glue.sh                 # all tasks
#   scripts/download_glue.sh data/glue SST-2 RTE
set -euo pipefail
out="${1:-data/glue}"
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI)
base="https://dl.fbaipublicfiles.com/glue/data"
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for task in "${tasks[@]}"; do
  echo "fetching $task"
  if [ "$task" = MRPC ]; then
    senteval="https://dl.fbaipublicfiles.com/senteval/senteval_data"
    curl -fsSL "$senteval/msr_paraphrase_train.txt" -o "$tmp/train.txt"
    curl -fsSL "$base/mrpc_dev_ids.tsv" -o "$tmp/dev_ids.tsv"
    mkdir -p "$out/MRPC"
    # rows of the training file whose (#1 ID, #2 ID) pair is a dev id go to dev.tsv, the rest to train.tsv
    awk -F'\t' -v dev="$tmp/dev_ids.tsv" -v out="$out/MRPC" '
      BEGIN { while ((getline line < dev) > 0) { split(line, f, "\t"); ids[f[1] "\t" f[2]] = 1 } }
      NR == 1 { print > (out "/train.tsv"); print > (out "/dev.tsv"); next }
      { sub(/\r$/, ""); if (($2 "\t" $3) in ids) print > (out "/dev.tsv"); else print > (out "/train.tsv") }
    ' "$tmp/train.txt"
  else
    curl -fsSL "$base/$task.zip" -o "$tmp/$task.zip"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp/$task.zip" "$out"
  fi
done
wc -l "$out"/*/train.tsv
