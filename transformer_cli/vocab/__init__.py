"""Text to ids: the sentencepiece vocabulary of translation and BERT, and BERT's WordPiece-compatible tokenizer."""
