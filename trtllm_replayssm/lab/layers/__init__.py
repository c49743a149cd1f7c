"""Fused decoder-layer kernels of the reference decoders (norms, conv1d update, activations, RoPE, attention) and
their PyTorch reference."""
