"""Encoder-decoder translation: the training task and its setup, beam search, `tcli translate`, attention maps."""
