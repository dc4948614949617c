"""What every part of tcli uses: user errors, files written atomically, the console, text input and output,
a run's metrics log (metrics.jsonl and TensorBoard), length buckets, figures.
"""
