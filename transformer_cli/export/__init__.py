"""Ways out of a checkpoint: Hugging Face and CTranslate2 folders, checkpoint averaging."""
