"""Kernel benchmark harness: byte model, cold-L2 CUDA-graph timing, peer adapters, reports (docs/benchmarks.md)."""
