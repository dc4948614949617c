"""What every part of tcli uses: user errors, files written atomically, the console, text input and output,
sentences and CJK character classes, a run's metrics log (metrics.jsonl and TensorBoard), arrays written in
chunks, length buckets, figures and their fonts, the names of the fine-tuning kinds.
"""
