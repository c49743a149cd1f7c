"""Kernel configs, NVRTC compilation with an on-disk cubin cache, and cuda-python loading/launching."""
