"""Subclasses of TensorRT-LLM's SSM mixers and hybrid models (imported only by ``register``; needs TensorRT-LLM).

Thin by design: every decision (slot mapping, prefill handoff, fallbacks) is a call into ``trtllm_core``.

* Mamba-2: ``Mamba2Mixer`` picks its decode SSU once and stores it on ``selective_state_update_func``; our mixer
  replaces that attribute with ``_replay_ssu``, which routes single-token decode calls to
  ``ops.mamba2.replay_decode`` and every other call (MTP verify) to the upstream function. Prefill is untouched.
* GDN: ``Qwen3NextGatedDeltaNet.forward_decode`` is overridden for the non-speculative branch only; mixed
  (prefill + decode) batches go through upstream ``forward_extend``, so the decode slots' rings are folded into the
  checkpoint first (``gdn_materialize_slots``).
* KDA (Kimi-Linear): ``KimiKDALinearAttention.forward_decode`` (the plain T=1 decode of the generation rows, also
  in mixed batches) is overridden: upstream's projections, conv update with ``causal_conv1d_update`` on the packed
  ``[slots, 3D, W-1]`` pool, ``ops.kda.replay_decode``, upstream's output gate. ``forward_prefill`` resets the
  cursors of the context slots after upstream wrote their state. Skipped where TensorRT-LLM has no Kimi-Linear.
* Models: after upstream ``__init__``, mixer instances get their class swapped (same parameters, same weight
  mappers). With a speculative config the swap is skipped and a warning logged.
* ``register_models`` first compares the recorded signatures (``trtllm_symbols.json``) with the installed ones.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import tensorrt_llm
import torch
from tensorrt_llm._torch.models.modeling_nemotron_h import NemotronHForCausalLM
from tensorrt_llm._torch.models.modeling_qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM
from tensorrt_llm._torch.models.modeling_qwen3_next import Qwen3NextForCausalLM
from tensorrt_llm._torch.models.modeling_utils import register_auto_model
from tensorrt_llm._torch.modules.mamba.causal_conv1d import causal_conv1d_update
from tensorrt_llm._torch.modules.mamba.gdn_mixer import Qwen3NextGatedDeltaNet
from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer

from trtllm_replayssm.serving import signature_check
from trtllm_replayssm.core.formats import torch_dtype
from trtllm_replayssm.serving.trtllm import SYMBOLS_PATH, ReplaySettings
from trtllm_replayssm.serving.trtllm.core import (PAD_SLOT_ID, bind_layer_cache, decode_slot_ids, gdn_materialize_slots, gdn_split_qkv,
                                          is_single_token_decode, kda_check_conv_pool, kda_fp32_params,
                                          kda_gate_inputs, kda_packed_conv_weight, kda_split_qkv, per_head,
                                          prefill_handoff, replay_disabled, speculative_configured, split_batch,
                                          warn_speculative_fallback)

_log = logging.getLogger("trtllm_replayssm")


def _layer_cache(owner: Any, family: str, state: torch.Tensor, num_k_heads: int) -> Any:
    """The replay cache bound to this layer's upstream SSM-state tensor (its checkpoint); rebuilt when TensorRT-LLM
    hands over a different tensor (the profiling cache manager is replaced by the real one)."""
    cached = owner.__dict__.get("_rs_cache")
    if cached is not None and cached[0] is state:
        return cached[1]
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("trtllm-replayssm: ring buffers must be allocated before CUDA-graph capture")
    settings: ReplaySettings = owner._rs_settings
    cache = bind_layer_cache(family, state, num_k_heads, settings.buffer_len,
                             torch_dtype(settings.act_dtype, "act_dtype"))
    owner.__dict__["_rs_cache"] = (state, cache)
    return cache


class ReplayMamba2Mixer(Mamba2Mixer):
    """Mamba2Mixer whose non-speculative decode SSU is ReplaySSM."""

    def _rs_setup(self, settings: ReplaySettings) -> None:
        self._rs_settings = settings
        self._rs_upstream_ssu = self.selective_state_update_func
        self.selective_state_update_func = self._replay_ssu

    def forward(self, hidden_states: torch.Tensor, attn_metadata: Any, mamba_metadata: Any,
                spec_metadata: Any = None, lora_params: dict | None = None, **kwargs: Any) -> torch.Tensor:
        cached = self.__dict__.get("_rs_cache")
        if cached is not None:
            split = split_batch(mamba_metadata.state_indices, attn_metadata.num_contexts,
                                attn_metadata.seq_lens.shape[0])
            prefill_handoff(cached[1], split.prefill_slots)
        return super().forward(hidden_states, attn_metadata, mamba_metadata, spec_metadata=spec_metadata,
                               lora_params=lora_params, **kwargs)

    def _replay_ssu(self, state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                    B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, **kw: Any) -> Any:
        if not is_single_token_decode(x, kw) or kw.get("rand_seed") is not None:
            return self._rs_upstream_ssu(state, x, dt, A, B, C, D, **kw)
        from trtllm_replayssm.core.ops import mamba2

        layer = _layer_cache(self, "mamba2", state, self.tp_ngroups).layer(0)
        slots = decode_slot_ids(kw["state_batch_indices"], state.shape[0])
        return mamba2.replay_decode(layer, x, per_head(dt, 2, "dt"), per_head(A, 1, "A"), B, C,
                                    D=per_head(D, 1, "D"), z=kw.get("z"),
                                    dt_bias=per_head(kw.get("dt_bias"), 1, "dt_bias"),
                                    dt_softplus=kw.get("dt_softplus", True), state_batch_indices=slots,
                                    pad_slot_id=PAD_SLOT_ID, out=kw.get("out"), mode="auto")


class ReplayGatedDeltaNet(Qwen3NextGatedDeltaNet):
    """Qwen3NextGatedDeltaNet whose non-speculative decode is ReplaySSM."""

    def _rs_setup(self, settings: ReplaySettings) -> None:
        self._rs_settings = settings

    def forward_core(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, attn_metadata: Any,
                     mamba_metadata: Any, spec_metadata: Any = None, output: torch.Tensor | None = None) -> Any:
        cached = self.__dict__.get("_rs_cache")
        if cached is not None:
            split = split_batch(mamba_metadata.state_indices, attn_metadata.num_contexts,
                                attn_metadata.seq_lens.shape[0])
            if split.num_contexts and split.num_decodes:
                layer = cached[1].layer(0)
                gdn_materialize_slots(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor,
                                      split.decode_slots)
            prefill_handoff(cached[1], split.prefill_slots)
        return super().forward_core(mixed_qkv, a, b, attn_metadata, mamba_metadata, spec_metadata=spec_metadata,
                                    output=output)

    def forward_decode(self, conv_states: torch.Tensor, ssm_states: torch.Tensor, query_start_loc_long: Any = None,
                       spec_metadata: Any = None, intermediate_conv_states: Any = None,
                       intermediate_ssm_states: Any = None, is_target_verify: bool = False,
                       output: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if is_target_verify:
            return super().forward_decode(conv_states, ssm_states, query_start_loc_long, spec_metadata=spec_metadata,
                                          intermediate_conv_states=intermediate_conv_states,
                                          intermediate_ssm_states=intermediate_ssm_states,
                                          is_target_verify=is_target_verify, output=output, **kwargs)
        from trtllm_replayssm.core.ops import gdn

        mixed = causal_conv1d_update(kwargs["mixed_qkv"], conv_states, self.conv1d.weight, self.conv1d.bias,
                                     self.activation, conv_state_indices=kwargs["cache_indices"])
        q, k, v = gdn_split_qkv(mixed, self.num_k_heads_per_tp, self.head_k_dim, self.num_v_heads_per_tp,
                                self.head_v_dim)
        rows = q.shape[0]
        out = (output.view(rows, self.num_v_heads_per_tp, self.head_v_dim) if output is not None
               else v.new_empty(rows, self.num_v_heads_per_tp, self.head_v_dim))
        layer = _layer_cache(self, "gdn", ssm_states, self.num_k_heads_per_tp).layer(0)
        slots = decode_slot_ids(kwargs["cache_indices"], ssm_states.shape[0])
        gdn.replay_decode(layer, q, k, v, kwargs["a"], kwargs["b"], self.A_log, self.dt_bias, scale=None,
                          state_batch_indices=slots, pad_slot_id=PAD_SLOT_ID, out=out, mode="auto")
        return out.view(1, rows, self.num_v_heads_per_tp, self.head_v_dim)


def _kimi_classes() -> tuple[type, type, type] | None:
    """(KimiLinearForCausalLM, KimiKDALinearAttention, our KDA mixer), or None when this TensorRT-LLM has no
    Kimi-Linear model (then only Mamba-2 / GDN models are registered)."""
    try:
        from tensorrt_llm._torch.models.modeling_kimi_linear import KimiLinearForCausalLM
        from tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer import KimiKDALinearAttention
    except ImportError as exc:
        _log.warning("trtllm-replayssm: this TensorRT-LLM has no Kimi-Linear model (%s); KDA is not hooked", exc)
        return None

    class ReplayKimiKDA(KimiKDALinearAttention):
        """KimiKDALinearAttention whose plain (non-speculative) decode is ReplaySSM."""

        def _rs_setup(self, settings: ReplaySettings) -> None:
            self._rs_settings = settings

        def _rs_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """fp32 A_log, fp32 dt_bias and the packed conv weight, built on the first decode (before capture)."""
            cached = self.__dict__.get("_rs_param_cache")
            if cached is None:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise RuntimeError("trtllm-replayssm: KDA decode constants must be built before CUDA-graph capture")
                a_log, dt_bias = kda_fp32_params(self.A_log, self.dt_bias, self.num_heads, self.head_k_dim)
                conv_w = kda_packed_conv_weight(self.q_conv1d.weight.detach(), self.k_conv1d.weight.detach(),
                                                self.v_conv1d.weight.detach())
                cached = (a_log, dt_bias, conv_w)
                self.__dict__["_rs_param_cache"] = cached
            return cached

        def forward_prefill(self, x2d: torch.Tensor, cu_seqlens: torch.Tensor, mamba_metadata: Any,
                            num_prefills: int, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                            slot_indices: torch.Tensor, layer_cache: Any = None,
                            output: torch.Tensor | None = None) -> torch.Tensor:
            core = super().forward_prefill(x2d, cu_seqlens, mamba_metadata, num_prefills, conv_pool, ssm_pool,
                                           slot_indices, layer_cache, output=output)
            cached = self.__dict__.get("_rs_cache")
            if cached is not None:
                prefill_handoff(cached[1], slot_indices)
            return core

        def forward_decode(self, x2d: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                           slot_indices: torch.Tensor, mamba_metadata: Any = None, layer_cache: Any = None,
                           ssm_state_indices: torch.Tensor | None = None,
                           output: torch.Tensor | None = None) -> torch.Tensor:
            from trtllm_replayssm.core.ops import kda

            kda_check_conv_pool(conv_pool, self.proj_size, self.conv_size)
            a_log, dt_bias, conv_w = self._rs_params()
            mixed = torch.cat((self.q_proj(x2d), self.k_proj(x2d), self.v_proj(x2d)), dim=-1)
            mixed = causal_conv1d_update(mixed, conv_pool, conv_w, None, "silu", conv_state_indices=slot_indices)
            q, k, v = kda_split_qkv(mixed, self.num_heads, self.head_dim)
            g, beta = kda_gate_inputs(self.f_b_proj(self.f_a_proj(x2d)), self.b_proj(x2d), self.num_heads,
                                      self.head_dim)
            layer = _layer_cache(self, "kda", ssm_pool, self.num_heads).layer(0)
            o = v.new_empty(v.shape)
            kda.replay_decode(layer, q, k, v, g, beta, a_log, dt_bias, lower_bound=self.gate_lower_bound,
                              scale=self.head_k_dim ** -0.5,
                              state_batch_indices=decode_slot_ids(slot_indices, ssm_pool.shape[0]),
                              pad_slot_id=PAD_SLOT_ID, out=o, mode="auto")
            return self._store_core(self._output_gate(x2d, o), output)

    return KimiLinearForCausalLM, KimiKDALinearAttention, ReplayKimiKDA


def _install(model: torch.nn.Module, model_config: Any, arch: str, settings: ReplaySettings,
             swaps: dict[type, type]) -> None:
    """Swap the class of every upstream mixer of ``model`` (unless speculative decoding or the disable switch)."""
    if replay_disabled():
        return
    if speculative_configured(getattr(model_config, "spec_config", None)):
        warn_speculative_fallback(arch)
        return
    for module in model.modules():
        new_cls = swaps.get(type(module))
        if new_cls is not None:
            module.__class__ = new_cls
            module._rs_setup(settings)


def _check_installed_signatures(version: str, skip_modules: tuple[str, ...]) -> None:
    """Compare every recorded callable signature with the installed one (one RuntimeError listing all)."""
    recorded = signature_check.recorded_signatures(json.loads(SYMBOLS_PATH.read_text()))
    recorded = {name: sig for name, sig in recorded.items() if name.partition(":")[0] not in skip_modules}
    signature_check.check_signatures(recorded, signature_check.resolve_all(recorded), version)


def register_models(settings: ReplaySettings) -> list[str]:
    """Check the recorded signatures, register one subclass per supported architecture; return the names."""
    kimi = _kimi_classes()
    _check_installed_signatures(tensorrt_llm.__version__, () if kimi else (
        "tensorrt_llm._torch.models.modeling_kimi_linear", "tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer"))
    bases = {"NemotronHForCausalLM": NemotronHForCausalLM, "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
             "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM, "Qwen3_5MoeForCausalLM": Qwen3_5MoeForCausalLM}
    swaps: dict[type, type] = {Mamba2Mixer: ReplayMamba2Mixer, Qwen3NextGatedDeltaNet: ReplayGatedDeltaNet}
    if kimi is not None:
        bases["KimiLinearForCausalLM"] = kimi[0]
        swaps[kimi[1]] = kimi[2]
    for arch, base in bases.items():
        def __init__(self: Any, model_config: Any, _base: type = base, _arch: str = arch) -> None:
            _base.__init__(self, model_config)
            _install(self, model_config, _arch, settings, swaps)

        cls = type(f"ReplaySSM{base.__name__}", (base,), {"__init__": __init__, "__module__": __name__})
        register_auto_model(arch)(cls)
    return list(bases)
