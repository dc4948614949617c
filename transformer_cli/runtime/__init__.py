"""Where a run computes: the device and precision, the CPU's features, the allocator, kernel-friendly shapes."""
