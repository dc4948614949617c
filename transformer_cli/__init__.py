"""tcli: train Transformer translation models and pretrain BERT from one YAML file."""

import os

# oneDNN, PyTorch's CPU matmul library for bf16, compiles a kernel (with its buffers) per matmul shape
# and keeps this many; a shape that comes back after eviction is compiled again. Batches, loss rows and
# decoding batches take their sizes from small fixed sets (models/buckets.py), so a training process,
# its validation and its beam search together use a few hundred GEMM shapes (scripts/kernel_shapes.py
# counts them): 1,024 holds them all, so no kernel is compiled twice and the cache, bounded by the shape
# set, stops growing once each shape has been seen (BENCHMARKS.md, "Memory").
# A value in the environment wins; oneDNN reads it when it first creates a kernel.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")

__version__ = "0.1.0"
