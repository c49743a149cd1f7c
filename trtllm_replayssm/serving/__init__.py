"""Serving: model presets and HF configs, the memory plan, the bundle, and the TensorRT-LLM module. Imports core."""
