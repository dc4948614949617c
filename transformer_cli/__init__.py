"""tcli: train Transformer translation models and pretrain BERT from one YAML file."""

import os

# oneDNN, PyTorch's CPU matmul library, keeps a compiled kernel (with its buffers) for every matmul
# shape it has seen, up to 1,024; real batches have many shapes, so a training process's memory
# grew for thousands of steps. 16 keeps it flat at the same speed (BENCHMARKS.md, "Memory").
# A value in the environment wins; oneDNN reads it when it first creates a kernel.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

__version__ = "0.1.0"
