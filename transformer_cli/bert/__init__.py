"""BERT pretraining: the MLM + NSP training task and its setup, held-out validation, `tcli fill-mask`."""
