"""The trainer every task shares: the loop (one update, evaluation, checkpoints, signals, early stopping), the
optimiser and schedule, the stop rules, the run directory and its lock, the lifecycle of a run from the lock to
the last checkpoint, and preprocessing (`tcli preprocess`).
"""
