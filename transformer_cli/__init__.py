"""tcli: train Transformer translation models and pretrain BERT from one YAML file."""

__version__ = "0.1.0"
