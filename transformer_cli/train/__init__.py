"""The shared trainer: runtime (device, precision), optimiser, checkpoints, metrics, loop."""
