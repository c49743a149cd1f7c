"""TensorRT-LLM's SSM-state pools as its cache managers lay them out and hand them out, rebuilt from the source
(NVIDIA/TensorRT-LLM, tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py @00bce92c; the same code in
kv_cache/mamba_cache_manager/legacy.py + common.py @28295084). Only the memory layout and the view semantics are
reproduced; no TensorRT-LLM behaviour beyond that is claimed.

* ``UnifiedPool``: ``CppMambaHybridCacheManager._setup_states``: one uint8 pool ``{layers, blocks, ssm_bytes +
  conv_bytes}``, so a layer's SSM view ``[blocks, H, P, N]`` has a block stride of ``(ssm_bytes + conv_bytes) /
  itemsize`` elements; ``get_ssm_states(layer_idx)`` indexes ``all_ssm_states[offset]``, a new view object on every
  call. Slot ids are block ids; the block count is the pool's, not the batch size.
* ``PythonPool``: ``PythonMambaCacheManager``: contiguous ``[layers, slots, H, P, N]``; ``at_layer_idx`` builds a new
  view per call.
* ``SpeculativePythonPool``: ``PythonMambaCacheManager`` with speculative decoding (``SpeculativeState``): besides
  ``temporal`` (the SSM states, as ``PythonPool``), ``conv [layers, slots, conv_dim, W-1]`` and
  ``intermediate_conv_window [layers, max_batch, T, conv_dim, W-1]`` (the verify conv's window after each window
  token, row b of the generation rows at index b); ``mamba_layer_cache(layer_idx)`` gives one layer's views. The
  per-draft SSM buffer (``intermediate_ssm``) is left out: nothing on the replay path reads or writes it.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch


class UnifiedPool:
    def __init__(self, layer_ids: list[int], blocks: int, state_shape: tuple[int, ...], state_dtype: torch.dtype,
                 conv_bytes: int, device: torch.device | str) -> None:
        itemsize = torch.empty((), dtype=state_dtype).element_size()
        self.ssm_bytes = math.prod(state_shape) * itemsize
        if (self.ssm_bytes + conv_bytes) % itemsize:
            raise ValueError("ssm_bytes + conv_bytes must be a multiple of the state itemsize (as upstream checks)")
        self.offsets = {layer_id: i for i, layer_id in enumerate(layer_ids)}  # mamba_layer_offsets
        pool = torch.zeros(len(layer_ids), blocks, self.ssm_bytes + conv_bytes, dtype=torch.uint8, device=device)
        self.pool = pool
        self.all_ssm_states = pool[:, :, :self.ssm_bytes].view(state_dtype).view(
            [len(layer_ids), blocks, *state_shape])

    def get_ssm_states(self, layer_idx: int) -> torch.Tensor:
        return self.all_ssm_states[self.offsets[layer_idx]]


class PythonPool:
    def __init__(self, layer_ids: list[int], slots: int, state_shape: tuple[int, ...], state_dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.offsets = {layer_id: i for i, layer_id in enumerate(layer_ids)}
        self.ssm_states = torch.zeros(len(layer_ids), slots, *state_shape, dtype=state_dtype, device=device)

    def get_ssm_states(self, layer_idx: int) -> torch.Tensor:
        return self.ssm_states[self.offsets[layer_idx]]


class SpeculativePythonPool:
    def __init__(self, layer_ids: list[int], slots: int, state_shape: tuple[int, ...], state_dtype: torch.dtype,
                 conv_shape: tuple[int, int], window: int, max_batch: int, device: torch.device | str) -> None:
        self.offsets = {layer_id: i for i, layer_id in enumerate(layer_ids)}
        n = len(layer_ids)
        self.all_ssm_states = torch.zeros(n, slots, *state_shape, dtype=state_dtype, device=device)
        self.conv = torch.zeros(n, slots, *conv_shape, dtype=torch.float32, device=device)
        self.intermediate_conv_window = torch.zeros(n, max_batch, window, *conv_shape, dtype=torch.float32,
                                                    device=device)

    def get_ssm_states(self, layer_idx: int) -> torch.Tensor:
        return self.all_ssm_states[self.offsets[layer_idx]]

    def mamba_layer_cache(self, layer_idx: int) -> SimpleNamespace:
        i = self.offsets[layer_idx]
        return SimpleNamespace(temporal=self.all_ssm_states[i], conv=self.conv[i],
                               intermediate_conv_window=self.intermediate_conv_window[i])

