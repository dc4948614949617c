"""Tasks: what a model family gives the shared trainer (data order, loss, evaluation, checkpoint metadata)."""
