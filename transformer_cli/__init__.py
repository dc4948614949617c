"""tcli: train Transformer translation models, pretrain BERT and fine-tune it, from one YAML file.

The folders import one way, from the bottom up: core, runtime, vocab, metrics, config, models, data, kinds,
checkpoint, export, train, then the tasks (translation, bert, finetune), tools and cli
(docs/development/architecture.md).
"""

import os

# oneDNN, PyTorch's CPU matmul library for bf16, compiles a kernel (with its buffers) per matmul shape
# and keeps a bounded number; a shape that comes back after eviction is compiled again. Batch, loss-row and
# decoding sizes come from small fixed sets (core/buckets.py), so the shapes of a whole run fit in this
# cache and no kernel is compiled twice (the count per workload: scripts/kernel_shapes.py and the benchmarks).
# A value in the environment wins; oneDNN reads it when it first creates a kernel.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")

__version__ = "0.1.0"
