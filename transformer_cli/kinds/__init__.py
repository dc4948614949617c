"""The kinds of fine-tuning task, one module each (classification.py, regression.py, tagging.py, multilabel.py)
on the `Kind` of base.py: how a kind reads its labels, builds features, which head and loss it trains, how it
decides from logits, scores, prints and exports; registry.KINDS names them all. finetuned.py is what training and
inference share of a fine-tuned model (checkpoint metadata, batches, predictions), features.py the encoding of
examples.
"""
