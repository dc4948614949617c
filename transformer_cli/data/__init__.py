"""Data to batches: sharded preprocessed corpora, translation pairs, BERT pretraining instances, labelled tables."""
