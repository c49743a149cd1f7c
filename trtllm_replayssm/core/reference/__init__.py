"""Pure-PyTorch references: float64 sequential recurrences (ground truth) and float32 replay steps (CPU fallback)."""
