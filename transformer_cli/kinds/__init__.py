"""The kinds of fine-tuning task (classification, regression, tagging): checkpoint metadata, features, heads and
decisions that training and inference share.
"""
