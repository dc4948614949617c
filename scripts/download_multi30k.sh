#!/usr/bin/env bash
# Fetch Multi30k task 1 (Elliott et al., 2016), raw English-German text, into data/multi30k (or $1).
# train 29,000 pairs, val 1,014, test_2016_flickr 1,000. For non-commercial research and education.
set -euo pipefail
out="${1:-data/multi30k}"
base="https://github.com/multi30k/dataset/raw/master/data/task1/raw"
mkdir -p "$out"
for split in train val test_2016_flickr; do
  for lang in en de; do
    echo "fetching $split.$lang"
    curl -fsSL "$base/$split.$lang.gz" | gunzip -c > "$out/$split.$lang"
  done
done
wc -l "$out"/*
