"""Subclasses of TensorRT-LLM's SSM mixers and hybrid models; importing this module registers the models (needs
TensorRT-LLM).

Thin by design: the decisions (refusals, the swap, binding rings to the state pool, slot mapping, prefill hand-off)
live in TensorRT-LLM-free modules (``install``, ``model_cache``, ``core``) tested on CPU.

* Models: module-level subclasses registered with ``register_auto_model`` at import, so that a worker process that
  imports this module (TensorRT-LLM sends workers ``{architecture: cls.__module__}``, or pickles the classes by
  reference) finds them. After upstream ``__init__`` the model's mixers get their class swapped (same parameters,
  same weight mappers), or none is when the configuration has something replay cannot serve; every forward brackets
  the replay step (``ReplayModel.begin_step`` / ``end_step``).
* Mamba-2: a pure-decode batch without MTP runs ``core.mamba2_decode`` between upstream's ``in_proj`` and its gated
  norm and ``out_proj``: our conv1d step on the xBC section, then ``ops.mamba2.replay_decode`` on views of its output
  as the conv's programmatic dependent, with none of upstream's copies of x, B, C and dt. Other batches run upstream's
  ``forward``: ``Mamba2Mixer`` stores its single-token decode SSU in an attribute (``selective_state_update_func``, or
  ``_stp_ssu_func`` in some revisions, whose per-draft MTP verify calls ``_mtp_ssu_func``: ``core.mamba2_ssu_attrs``);
  ours points each at ``_replay_ssu``, which routes single-token decode calls to ``ops.mamba2.replay_decode`` and
  raises on any other call (``core.mamba2_ssu_call``: upstream's SSU would update the lagging checkpoint). With MTP
  (the bundle's ``--spec-tokens``) every call must be the mixers' verify (4-D inputs, ``disable_state_update``,
  per-draft state buffers), which goes to ``ModelReplayCache.verify``, writing no per-draft state, and the cache
  manager's ``update_mamba_states`` after sampling becomes ``ModelReplayCache.update_mamba_states`` (cursor commit
  + the accepted conv windows).
* GDN: ``Qwen3NextGatedDeltaNet.forward_decode`` is overridden for pure-decode batches; mixed batches run upstream's
  chunked kernel over the decode rows too, so ``forward_core`` folds those rows' rings into the checkpoint first
  (and, with codes in the pool, writes their values there: ``ModelReplayCache.expose_slots``).
  With MTP every decode row verifies its window here, in pure-decode batches (``forward_decode`` with
  ``is_target_verify``) and in mixed ones (``forward_extend``: upstream's prefill path on the prefill rows alone,
  then the decode rows' verify): upstream's verify conv (which leaves each token's conv window for the commit), then
  ``ModelReplayCache.verify``; the commit is the cache manager's ``update_mamba_states``, taken over as for Mamba-2.
* KDA (Kimi-Linear, where TensorRT-LLM has it): ``KimiKDALinearAttention.forward_decode`` (the decode rows of every
  batch) is overridden: upstream's projections, conv update on the packed ``[slots, 3D, W-1]`` pool,
  ``ops.kda.replay_decode``, upstream's output gate. With MTP, ``forward_verify`` likewise: the verify conv that
  leaves each token's window in the layer cache's ``intermediate_conv_window``, then ``ModelReplayCache.verify``.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import tensorrt_llm
import torch
from tensorrt_llm._torch.models.modeling_nemotron_h import NemotronHForCausalLM
from tensorrt_llm._torch.models.modeling_qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM
from tensorrt_llm._torch.models.modeling_qwen3_next import Qwen3NextForCausalLM
from tensorrt_llm._torch.models.modeling_utils import register_auto_model
from tensorrt_llm._torch.modules.mamba.causal_conv1d import causal_conv1d_update
from tensorrt_llm._torch.modules.mamba.causal_conv1d_triton import causal_conv1d_update as causal_conv1d_update_triton
from tensorrt_llm._torch.modules.mamba.gdn_mixer import Qwen3NextGatedDeltaNet
from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer

from trtllm_replayssm.core.checks import capturing
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.formats import parse_state_label, torch_dtype
from trtllm_replayssm.core.ops import gdn, kda, mamba2
from trtllm_replayssm.serving.trtllm import check_installed_trtllm, settings_from_env
from trtllm_replayssm.serving.trtllm.core import (PAD_SLOT_ID, SINGLE_TOKEN_SSU_ATTRS, as_windows, check_verify_call,
                                                  decode_conv, gdn_materialize_slots, gdn_prefill_kwargs,
                                                  kda_check_conv_pool, kda_fp32_params, kda_gate_inputs,
                                                  kda_packed_conv_weight, mamba2_decode,
                                                  mamba2_ssu_attrs, mamba2_ssu_call, per_head, refusals_from_llm_args,
                                                  refusals_from_quant_config, replay_disabled, speculative_refusals,
                                                  split_batch)
from trtllm_replayssm.serving.trtllm.install import ReplayModel

try:
    from tensorrt_llm._torch.models.modeling_kimi_linear import KimiLinearForCausalLM
    from tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer import KimiKDALinearAttention
except ImportError as _kimi_error:
    KimiLinearForCausalLM = KimiKDALinearAttention = None
    KIMI_MISSING = str(_kimi_error)

_log = logging.getLogger("trtllm_replayssm")


def _verify_conv(cache: Any, mixed: torch.Tensor, num_decodes: int, window: int, conv_states: torch.Tensor,
                 weight: torch.Tensor, bias: torch.Tensor | None, activation: str, slots: torch.Tensor,
                 conv_windows: torch.Tensor) -> torch.Tensor:
    """Upstream's verify conv of ``num_decodes`` windows of ``window`` tokens (``mixed [n * T, C]``, each row's tokens
    adjacent), which leaves row r's conv window after token t in ``conv_windows[r, t]`` for the commit; returns the
    activations ``[n * T, C]``."""
    x = causal_conv1d_update_triton(mixed.reshape(num_decodes, window, -1).transpose(1, 2), conv_states, weight, bias,
                                    activation, conv_state_indices=slots, intermediate_conv_window=conv_windows,
                                    intermediate_state_indices=cache.decode_rows(num_decodes))
    return x.transpose(1, 2).reshape(num_decodes * window, -1)


class ReplayMamba2Mixer(Mamba2Mixer):
    """Mamba2Mixer whose single-token decode SSU is ReplaySSM."""

    @staticmethod
    def _rs_cannot_hook(module: Any) -> str | None:
        if not mamba2_ssu_attrs(module):
            return f"Mamba2Mixer has no single-token SSU attribute ({' or '.join(SINGLE_TOKEN_SSU_ATTRS)})"
        return None

    def _rs_num_k_heads(self) -> int:
        return self.tp_ngroups

    def _rs_setup(self, cache: Any) -> None:
        self._rs_cache = cache
        self._rs_dims = Mamba2Dims(nheads=self.tp_nheads, head_dim=self.head_dim, d_state=self.d_state,
                                   n_groups=self.tp_ngroups)
        self._rs_upstream_ssus = {name: getattr(self, name) for name in mamba2_ssu_attrs(self)}
        for name in self._rs_upstream_ssus:
            setattr(self, name, functools.partial(self._replay_ssu, name))

    def _rs_teardown(self) -> None:
        for name, upstream in self._rs_upstream_ssus.items():
            setattr(self, name, upstream)

    def forward(self, hidden_states: torch.Tensor, attn_metadata: Any, mamba_metadata: Any,
                spec_metadata: Any = None, lora_params: dict | None = None, **kwargs: Any) -> torch.Tensor:
        state = attn_metadata.kv_cache_manager.get_ssm_states(self.layer_idx)
        layer = self._rs_cache.layer_step(self.layer_idx, state, mamba_metadata.state_indices,
                                          attn_metadata.num_contexts)
        if not attn_metadata.num_contexts and self._rs_cache.window == 1:
            return self._rs_decode(layer, hidden_states, attn_metadata, mamba_metadata, lora_params)
        out = super().forward(hidden_states, attn_metadata, mamba_metadata, spec_metadata=spec_metadata,
                              lora_params=lora_params, **kwargs)
        if attn_metadata.num_contexts:  # prefill wrote these states: a read copy or codes follow
            self._rs_cache.prefill_written(self.layer_idx, state,
                                           mamba_metadata.state_indices[:attn_metadata.num_contexts])
        return out

    def _rs_decode(self, layer: Any, hidden_states: torch.Tensor, attn_metadata: Any, mamba_metadata: Any,
                   lora_params: dict | None) -> torch.Tensor:
        """A pure-decode batch without MTP: upstream's in_proj, ``core.mamba2_decode`` (the conv1d step, then our
        decode op on views of its output, no copies), upstream's gated norm and out_proj."""
        rows = attn_metadata.num_tokens
        zxbcdt = self.in_proj(hidden_states, lora_params=lora_params, layer_idx=self.layer_idx)
        conv_states = attn_metadata.kv_cache_manager.get_conv_states(self.layer_idx)
        indices = mamba_metadata.state_indices[:rows]
        y, z = mamba2_decode(
            layer, self._rs_dims, zxbcdt[:rows], conv_states, self.conv1d.weight, self.conv1d.bias, self.A, self.D,
            self.dt_bias, self.delta_softplus, self._rs_cache.decode_slots(indices),
            lambda after_conv: self._rs_cache.decode_plan(layer, rows, after_conv=after_conv),
            lambda xbc: causal_conv1d_update(xbc, conv_states, self.conv1d.weight, self.conv1d.bias,
                                             activation="silu", conv_state_indices=indices))
        out = self.out_proj(self.norm(y, z), lora_params=lora_params, layer_idx=self.layer_idx)
        return out[:rows]

    def _replay_ssu(self, name: str, state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                    A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None,  # noqa: N803
                    **kw: Any) -> Any:
        """A call of the mixer's SSU attribute ``name``: the MTP verify or the single-token decode, on our cache
        (core.mamba2_ssu_call; any other call is an error, never upstream's SSU on the lagging checkpoint)."""
        if mamba2_ssu_call(name, x, kw, self._rs_cache.window > 1) == "verify":
            return self._rs_cache.verify(self.layer_idx, state, kw["state_batch_indices"], x, per_head(dt, 3, "dt"),
                                         per_head(A, 1, "A"), B, C, D=per_head(D, 1, "D"), z=kw.get("z"),
                                         dt_bias=per_head(kw.get("dt_bias"), 1, "dt_bias"),
                                         dt_softplus=kw.get("dt_softplus", True), out=kw["out"])
        layer = self._rs_cache.layer(self.layer_idx, state)
        slots = self._rs_cache.decode_slots(kw["state_batch_indices"])
        return mamba2.replay_decode(layer, x, per_head(dt, 2, "dt"), per_head(A, 1, "A"), B, C,
                                    D=per_head(D, 1, "D"), z=kw.get("z"),
                                    dt_bias=per_head(kw.get("dt_bias"), 1, "dt_bias"),
                                    dt_softplus=kw.get("dt_softplus", True), state_batch_indices=slots,
                                    pad_slot_id=PAD_SLOT_ID, out=kw.get("out"),
                                    plan=self._rs_cache.decode_plan(layer, x.shape[0]))


class ReplayGatedDeltaNet(Qwen3NextGatedDeltaNet):
    """Qwen3NextGatedDeltaNet whose decode (and, with MTP, verify) is ReplaySSM."""

    def _rs_num_k_heads(self) -> int:
        return self.num_k_heads_per_tp

    def _rs_setup(self, cache: Any) -> None:
        self._rs_cache = cache
        self._rs_dims = GDNDims(num_k_heads=self.num_k_heads_per_tp, num_v_heads=self.num_v_heads_per_tp,
                                head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim)

    def forward_core(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, attn_metadata: Any,
                     mamba_metadata: Any, spec_metadata: Any = None, output: torch.Tensor | None = None) -> Any:
        state = attn_metadata.kv_cache_manager.mamba_layer_cache(self.layer_idx).temporal
        batch = split_batch(mamba_metadata.state_indices, attn_metadata.num_contexts, attn_metadata.seq_lens.shape[0])
        layer = self._rs_cache.layer_step(self.layer_idx, state, mamba_metadata.state_indices, batch.num_contexts)
        verifies = self._rs_cache.window > 1  # MTP: the decode rows of every batch verify here
        if batch.num_contexts and batch.num_decodes and not verifies:  # upstream's chunked kernel reads their state
            gdn_materialize_slots(layer, batch.decode_slots)
            self._rs_cache.expose_slots(self.layer_idx, state, batch.decode_slots)
        out = super().forward_core(mixed_qkv, a, b, attn_metadata, mamba_metadata, spec_metadata=spec_metadata,
                                   output=output)
        if batch.num_contexts:  # upstream wrote these masters (prefills; a mixed batch's decodes without MTP): the
            # read copy follows
            written = batch.num_contexts + (0 if verifies else batch.num_decodes)
            self._rs_cache.prefill_written(self.layer_idx, state, mamba_metadata.state_indices[:written])
        return out

    def forward_decode(self, conv_states: torch.Tensor, ssm_states: torch.Tensor, query_start_loc_long: Any = None,
                       spec_metadata: Any = None, intermediate_conv_states: Any = None,
                       intermediate_ssm_states: Any = None, is_target_verify: bool = False,
                       output: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        check_verify_call("GDN", is_target_verify, self._rs_cache.window)
        if is_target_verify:
            n = kwargs["num_decodes"]
            return self._rs_verify(conv_states, ssm_states, intermediate_conv_states, kwargs["mixed_qkv"], kwargs["a"],
                                   kwargs["b"], kwargs["cache_indices"][:n], n,
                                   spec_metadata.runtime_draft_len + 1, output)
        slots = self._rs_cache.decode_slots(kwargs["cache_indices"])
        mixed, own_conv = decode_conv(
            kwargs["mixed_qkv"], conv_states, self.conv1d.weight, self.conv1d.bias, self.activation, slots,
            lambda: causal_conv1d_update(kwargs["mixed_qkv"], conv_states, self.conv1d.weight, self.conv1d.bias,
                                         self.activation, conv_state_indices=kwargs["cache_indices"]))
        q, k, v = self._rs_dims.split_qkv(mixed)
        rows = q.shape[0]
        out = (output.view(rows, self.num_v_heads_per_tp, self.head_v_dim) if output is not None
               else v.new_empty(rows, self.num_v_heads_per_tp, self.head_v_dim))
        layer = self._rs_cache.layer(self.layer_idx, ssm_states)
        gdn.replay_decode(layer, q, k, v, kwargs["a"], kwargs["b"], self.A_log, self.dt_bias, scale=None,
                          state_batch_indices=slots, pad_slot_id=PAD_SLOT_ID, out=out,
                          plan=self._rs_cache.decode_plan(layer, rows, after_conv=own_conv))
        return out.view(1, rows, self.num_v_heads_per_tp, self.head_v_dim)

    def forward_extend(self, conv_states: torch.Tensor, ssm_states: torch.Tensor, spec_metadata: Any = None,
                       intermediate_conv_states: Any = None, intermediate_ssm_states: Any = None,
                       is_target_verify: bool = False, output: torch.Tensor | None = None,
                       **kwargs: Any) -> torch.Tensor:
        if kwargs["num_decodes"]:
            check_verify_call("GDN", is_target_verify, self._rs_cache.window)
        if not (is_target_verify and kwargs["num_decode_tokens"]):
            return super().forward_extend(conv_states, ssm_states, spec_metadata=spec_metadata,
                                          intermediate_conv_states=intermediate_conv_states,
                                          intermediate_ssm_states=intermediate_ssm_states,
                                          is_target_verify=is_target_verify, output=output, **kwargs)
        # a mixed batch with MTP: upstream's prefill path on the prefill rows, then the decode rows' verify here
        p, n = kwargs["num_prefill_tokens"], kwargs["num_decodes"]
        if output is None:
            output = kwargs["mixed_qkv"].new_empty(1, kwargs["mixed_qkv"].shape[0], self.num_v_heads_per_tp,
                                                   self.head_v_dim)
        super().forward_extend(conv_states, ssm_states, spec_metadata=spec_metadata, is_target_verify=False,
                               output=output[:, :p], **gdn_prefill_kwargs(kwargs))
        self._rs_verify(conv_states, ssm_states, intermediate_conv_states, kwargs["mixed_qkv"][p:], kwargs["a"][p:],
                        kwargs["b"][p:], kwargs["state_indices_d"], n, spec_metadata.runtime_draft_len + 1,
                        output[:, p:])
        return output

    def _rs_verify(self, conv_states: torch.Tensor, ssm_states: torch.Tensor, conv_windows: torch.Tensor,
                   mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, num_decodes: int,
                   window: int, output: torch.Tensor | None) -> torch.Tensor:
        """The verify of ``num_decodes`` windows of ``window`` tokens (rows' tokens adjacent): upstream's verify conv,
        which leaves row r's conv window after token t in ``conv_windows[r, t]`` for the commit, then
        ``ModelReplayCache.verify``. Returns ``[1, num_decodes * window, HV, V]`` (``output`` when given)."""
        mixed = _verify_conv(self._rs_cache, mixed_qkv, num_decodes, window, conv_states, self.conv1d.weight,
                             self.conv1d.bias, self.activation, slots, conv_windows)
        q, k, v = self._rs_dims.split_qkv(mixed)
        q, k, v, a, b = as_windows(num_decodes, window, q=q, k=k, v=v, a=a, b=b)
        shape = (num_decodes, window, self.num_v_heads_per_tp, self.head_v_dim)
        out = output.view(shape) if output is not None else v.new_empty(shape)
        self._rs_cache.verify(self.layer_idx, ssm_states, slots, q, k, v, a, b, self.A_log, self.dt_bias, out=out)
        return out.view(1, num_decodes * window, *shape[2:])


if KimiKDALinearAttention is not None:
    class ReplayKimiKDA(KimiKDALinearAttention):
        """KimiKDALinearAttention whose decode (and, with MTP, verify) is ReplaySSM."""

        def _rs_num_k_heads(self) -> int:
            return self.num_heads

        def _rs_setup(self, cache: Any) -> None:
            self._rs_cache = cache
            self._rs_dims = KDADims(num_heads=self.num_heads, head_dim=self.head_dim)
            self._rs_param_cache = None

        def _rs_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """fp32 A_log, fp32 dt_bias and the packed conv weight, built by the first (eager) forward."""
            if self._rs_param_cache is None:
                if capturing():
                    raise RuntimeError("trtllm-replayssm: KDA decode constants must be built before CUDA-graph "
                                       "capture")
                a_log, dt_bias = kda_fp32_params(self.A_log, self.dt_bias, self.num_heads, self.head_k_dim)
                conv_w = kda_packed_conv_weight(self.q_conv1d.weight.detach(), self.k_conv1d.weight.detach(),
                                                self.v_conv1d.weight.detach())
                self._rs_param_cache = (a_log, dt_bias, conv_w)
            return self._rs_param_cache

        def _forward_impl(self, hidden_states: torch.Tensor, attn_metadata: Any,
                          output: torch.Tensor | None = None) -> torch.Tensor:
            state = attn_metadata.kv_cache_manager.mamba_layer_cache(self.layer_idx).temporal
            indices = attn_metadata.mamba_metadata.state_indices
            self._rs_cache.layer_step(self.layer_idx, state, indices, attn_metadata.num_contexts)
            self._rs_params()
            out = super()._forward_impl(hidden_states, attn_metadata, output=output)
            if attn_metadata.num_contexts:  # prefill wrote these states: a read copy or codes follow
                self._rs_cache.prefill_written(self.layer_idx, state, indices[:attn_metadata.num_contexts])
            return out

        def forward_decode(self, x2d: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                           slot_indices: torch.Tensor, mamba_metadata: Any = None, layer_cache: Any = None,
                           ssm_state_indices: torch.Tensor | None = None,
                           output: torch.Tensor | None = None) -> torch.Tensor:
            check_verify_call("KDA", False, self._rs_cache.window)
            kda_check_conv_pool(conv_pool, self.proj_size, self.conv_size)
            a_log, dt_bias, conv_w = self._rs_params()
            # the gate's projections first, so that the conv runs right before the decode op
            g, beta = kda_gate_inputs(self.f_b_proj(self.f_a_proj(x2d)), self.b_proj(x2d), self.num_heads,
                                      self.head_dim)
            mixed = torch.cat((self.q_proj(x2d), self.k_proj(x2d), self.v_proj(x2d)), dim=-1)
            slots = self._rs_cache.decode_slots(slot_indices)
            mixed, own_conv = decode_conv(
                mixed, conv_pool, conv_w, None, "silu", slots,
                lambda: causal_conv1d_update(mixed, conv_pool, conv_w, None, "silu", conv_state_indices=slot_indices))
            q, k, v = self._rs_dims.split_qkv(mixed)
            layer = self._rs_cache.layer(self.layer_idx, ssm_pool)
            o = v.new_empty(v.shape)
            kda.replay_decode(layer, q, k, v, g, beta, a_log, dt_bias, lower_bound=self.gate_lower_bound,
                              scale=self.head_k_dim ** -0.5, state_batch_indices=slots, pad_slot_id=PAD_SLOT_ID,
                              out=o, plan=self._rs_cache.decode_plan(layer, q.shape[0], after_conv=own_conv))
            # [B, 1, hidden], as upstream's decode fallback passes it
            return self._store_core(self._output_gate(x2d.unsqueeze(1), o), output)

        def forward_verify(self, x2d: torch.Tensor, num_steps: int, layer_cache: Any, conv_pool: torch.Tensor,
                           ssm_pool: torch.Tensor, slot_indices: torch.Tensor,
                           output: torch.Tensor | None = None) -> torch.Tensor:
            """MTP verify of the generation rows' windows of ``num_steps`` tokens: upstream's projections, upstream's
            verify conv on the packed pool (row r's conv window after token t left in the manager's
            ``intermediate_conv_window[r, t]`` for the commit), ``ModelReplayCache.verify``, upstream's output gate."""
            check_verify_call("KDA", True, self._rs_cache.window)
            kda_check_conv_pool(conv_pool, self.proj_size, self.conv_size)
            a_log, dt_bias, conv_w = self._rs_params()
            n = x2d.shape[0] // num_steps
            mixed = _verify_conv(self._rs_cache,
                                 torch.cat((self.q_proj(x2d), self.k_proj(x2d), self.v_proj(x2d)), dim=-1), n,
                                 num_steps, conv_pool, conv_w, None, "silu", slot_indices,
                                 layer_cache.intermediate_conv_window)
            q, k, v = self._rs_dims.split_qkv(mixed)
            g, beta = kda_gate_inputs(self.f_b_proj(self.f_a_proj(x2d)), self.b_proj(x2d), self.num_heads,
                                      self.head_dim)
            q, k, v, g, beta = as_windows(n, num_steps, q=q, k=k, v=v, g=g, beta=beta)
            o = v.new_empty(v.shape)
            self._rs_cache.verify(self.layer_idx, ssm_pool, slot_indices, q, k, v, g, beta, a_log, dt_bias,
                                  lower_bound=self.gate_lower_bound, scale=self.head_k_dim ** -0.5, out=o)
            return self._store_core(self._output_gate(x2d.view(n, num_steps, -1), o), output)



# ---------------------------------------------------------------------------------------------------- models
_LLM_ARGS_REFUSALS: dict[str, list[str]] = {}  # per model class: what its llm_args configure that replay cannot serve


class ReplaySSMModel:
    """What every registered model class adds to its TensorRT-LLM base (first in the bases): the defaults hook, the
    mixer swap after ``__init__`` and the per-forward replay step. ``_rs_family`` / ``_rs_swaps`` name the SSM
    family and {upstream mixer class: replay mixer class}."""

    _rs_family: str
    _rs_swaps: dict[type, type]

    @classmethod
    def get_model_defaults(cls, llm_args: Any) -> dict:
        base = getattr(super(), "get_model_defaults", None)
        defaults = dict((base(llm_args) if base else None) or {})
        kv_cache_config = dict(defaults.get("kv_cache_config") or {})
        kv_cache_config.setdefault("enable_block_reuse", False)
        defaults["kv_cache_config"] = kv_cache_config
        _LLM_ARGS_REFUSALS[cls.__name__] = refusals_from_llm_args(llm_args)
        return defaults

    @classmethod
    def get_preferred_kv_cache_manager_version(cls, pretrained_config: Any = None) -> str:
        """V1, the C++ unified pool, for ``use_kv_cache_manager_v2: auto``: the V2 manager may move a live request
        to another slot, which the rings would not follow."""
        return "V1"

    def __init__(self, model_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(model_config, *args, **kwargs)
        self._rs_model = _install(self, model_config)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        replay = self.__dict__.get("_rs_model")
        attn_metadata = kwargs["attn_metadata"] if "attn_metadata" in kwargs else args[0]
        if replay is None or not replay.begin_step(attn_metadata):
            return super().forward(*args, **kwargs)
        try:
            return super().forward(*args, **kwargs)
        finally:
            replay.end_step()


def _install(model: Any, model_config: Any) -> ReplayModel | None:
    """Check this TensorRT-LLM (once per process), then swap ``model``'s mixers unless replay is switched off or
    the configuration has something replay cannot serve."""
    arch = type(model).__name__.removeprefix("ReplaySSM")
    if replay_disabled():
        _log.info("trtllm-replayssm: TRTLLM_REPLAYSSM_DISABLE=1: %s runs upstream TensorRT-LLM kernels", arch)
        return None
    check_installed_trtllm(tensorrt_llm.__version__, skip_kimi=KimiKDALinearAttention is None)
    settings = settings_from_env()
    if settings.family != model._rs_family:
        raise RuntimeError(f"trtllm-replayssm: the bundle was built for a {settings.family} model, this is {arch} "
                           f"({model._rs_family}): build a bundle for this model")
    state = parse_state_label(settings.state, arg="state")
    spec_config = getattr(model_config, "spec_config", None)
    refusals = list(_LLM_ARGS_REFUSALS.get(type(model).__name__, []))
    refusals += refusals_from_quant_config(getattr(model_config, "quant_config", None))
    refusals += speculative_refusals(model._rs_family, spec_config, settings.spec_tokens, state.stored)
    return ReplayModel.install(model, arch, model._rs_family, model._rs_swaps, settings.buffer_len,
                               torch_dtype(settings.act_dtype, "act_dtype"), refusals,
                               (settings.planned_ring_bytes, settings.planned_slots), state,
                               settings.spec_tokens if spec_config is not None else None)


_MAMBA2 = {Mamba2Mixer: ReplayMamba2Mixer}
_GDN = {Qwen3NextGatedDeltaNet: ReplayGatedDeltaNet}


class ReplaySSMNemotronHForCausalLM(ReplaySSMModel, NemotronHForCausalLM):
    _rs_family, _rs_swaps = "mamba2", _MAMBA2


class ReplaySSMQwen3NextForCausalLM(ReplaySSMModel, Qwen3NextForCausalLM):
    _rs_family, _rs_swaps = "gdn", _GDN


class ReplaySSMQwen3_5ForCausalLM(ReplaySSMModel, Qwen3_5ForCausalLM):
    _rs_family, _rs_swaps = "gdn", _GDN


class ReplaySSMQwen3_5MoeForCausalLM(ReplaySSMModel, Qwen3_5MoeForCausalLM):
    _rs_family, _rs_swaps = "gdn", _GDN


MODELS: dict[str, type] = {"NemotronHForCausalLM": ReplaySSMNemotronHForCausalLM,
                           "Qwen3NextForCausalLM": ReplaySSMQwen3NextForCausalLM,
                           "Qwen3_5ForCausalLM": ReplaySSMQwen3_5ForCausalLM,
                           "Qwen3_5MoeForCausalLM": ReplaySSMQwen3_5MoeForCausalLM}

if KimiKDALinearAttention is not None:
    class ReplaySSMKimiLinearForCausalLM(ReplaySSMModel, KimiLinearForCausalLM):
        _rs_family, _rs_swaps = "kda", {KimiKDALinearAttention: ReplayKimiKDA}

    MODELS["KimiLinearForCausalLM"] = ReplaySSMKimiLinearForCausalLM
else:
    _log.warning("trtllm-replayssm: this TensorRT-LLM has no Kimi-Linear model (%s); KDA is not hooked", KIMI_MISSING)

for _arch, _cls in MODELS.items():  # at import: workers find the classes by importing this module
    register_auto_model(_arch)(_cls)
