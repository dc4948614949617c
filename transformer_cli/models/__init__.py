"""Models: pure nn.Modules (no config, no I/O, no device logic)."""
