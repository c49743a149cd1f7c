"""Core: the decode kernels (NVRTC build and load), their custom ops with PyTorch references, the replay state
cache, the family descriptions, launch plans and the byte model. Imports neither serving nor lab."""
