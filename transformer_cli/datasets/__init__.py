"""Datasets: text files -> token sequences -> batches."""
