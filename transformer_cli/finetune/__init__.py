"""BERT fine-tuning: the training task and its setup, `tcli predict`, `tcli glue`."""
