"""Ways out of a checkpoint and in from elsewhere: Hugging Face folders (written and read), CTranslate2
folders, checkpoint averaging.
"""
