"""BERT pretraining and what a pretrained BERT gives: the MLM + NSP training task and its setup, held-out
validation, `tcli fill-mask` and `tcli embed` (contextual vectors).
"""
