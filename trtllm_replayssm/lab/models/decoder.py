"""Reference hybrid decoders (Nemotron-H, Qwen3.5): prefill with a sequential scan, then decode steps or
speculative verify steps (a window of tokens per row, then a commit of each row's accepted count).

Module and parameter names follow the Hugging Face checkpoints (``backbone.*`` for NemotronH, ``model.*`` for
Qwen3.5), so a checkpoint loads by name (see :mod:`.weights`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from trtllm_replayssm.lab.layers.ops import conv1d_commit_

from .config import HybridConfig
from .layers import Attention, DenseExpertMoE, GatedRMSNorm, KVCache, ReluSqMLP, RMSNorm, SwiGLUMLP
from .mixers import FP32_PARAMS, GatedDeltaNetMixer, Mamba2Mixer
from .ssm_state import SSMStates


class NemotronBlock(nn.Module):
    """``h + mixer(norm(h))`` with one mixer per layer (Mamba-2, attention, MLP or MoE)."""

    def __init__(self, cfg: HybridConfig, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        if kind == "mamba2":
            self.mixer: nn.Module = Mamba2Mixer(cfg)
        elif kind == "attention":
            self.mixer = Attention(cfg.hidden_size, cfg.attn_heads, cfg.kv_heads, cfg.attn_head_dim, qwen=False,
                                   rotary_dim=0, rope_theta=cfg.rope_theta, eps=cfg.rms_eps, window=cfg.attn_window)
        elif kind == "mlp":
            self.mixer = ReluSqMLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            self.mixer = DenseExpertMoE(cfg.hidden_size, cfg.moe_dense_width, cfg.moe_shared, cfg.moe_latent_size,
                                        "relu2")


class QwenBlock(nn.Module):
    """``h + mixer(input_layernorm(h))`` then ``h + mlp(post_attention_layernorm(h))``."""

    def __init__(self, cfg: HybridConfig, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, unit_offset=True)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, unit_offset=True)
        if kind == "gdn":
            self.linear_attn = GatedDeltaNetMixer(cfg)
        else:
            self.self_attn = Attention(cfg.hidden_size, cfg.attn_heads, cfg.kv_heads, cfg.attn_head_dim, qwen=True,
                                       rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta, eps=cfg.rms_eps,
                                       window=cfg.attn_window)
        if cfg.moe_top_k:
            self.mlp: nn.Module = DenseExpertMoE(cfg.hidden_size, cfg.moe_dense_width, cfg.moe_shared,
                                                 cfg.moe_latent_size, "swiglu")
        else:
            self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.kind == "gdn" else self.self_attn


class _Trunk(nn.Module):
    def __init__(self, cfg: HybridConfig, embed_name: str, norm_name: str, block: type[nn.Module]) -> None:
        super().__init__()
        setattr(self, embed_name, nn.Embedding(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(block(cfg, kind) for kind in cfg.layer_kinds)
        setattr(self, norm_name, RMSNorm(cfg.hidden_size, cfg.rms_eps, unit_offset=cfg.arch == "qwen3_5"))


@dataclass
class DecodeState:
    """Everything a decode step mutates: SSM states (baseline or replay), conv states, KV caches; with speculative
    windows (``ssm.spec_tokens`` > 1) the conv inputs of the window being verified (``conv_window``, per SSM layer
    ``[b, T, C]``)."""

    ssm: SSMStates
    conv: list[torch.Tensor]
    kv: list[KVCache]
    batch: int
    max_len: int
    conv_window: list[torch.Tensor]

    def reset(self) -> None:
        """Zero all state in place (buffer addresses are kept, so a captured graph stays valid)."""
        self.ssm.reset()
        for c in self.conv:
            c.zero_()
        for kv in self.kv:
            kv.reset()


class HybridLM(nn.Module):
    """A Nemotron-H or Qwen3.5 style hybrid decoder."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.arch == "nemotron_h":
            self.backbone = _Trunk(cfg, "embeddings", "norm_f", NemotronBlock)
        else:
            self.model = _Trunk(cfg, "embed_tokens", "norm", QwenBlock)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.ssm_index = {i: j for j, i in enumerate(cfg.ssm_layers)}
        self.attn_index = {i: j for j, i in enumerate(k for k, kind in enumerate(cfg.layer_kinds)
                                                      if kind == "attention")}

    @property
    def trunk(self) -> _Trunk:
        return self.backbone if self.cfg.arch == "nemotron_h" else self.model

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, cfg: HybridConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
              seed: int = 0) -> "HybridLM":
        """A decoder with random weights (see :meth:`init_random_`) in ``dtype`` on ``device``."""
        with torch.device("meta"):
            model = cls(cfg)
        model.to_empty(device=torch.device(device))
        model.init_random_(seed)
        return model.cast_(dtype)

    def cast_(self, dtype: torch.dtype) -> "HybridLM":
        """Cast parameters to ``dtype`` in place, keeping ``A_log``, ``D`` and ``dt_bias`` in float32."""
        for name, p in self.named_parameters():
            want = torch.float32 if name.rsplit(".", 1)[-1] in FP32_PARAMS else dtype
            if p.dtype != want:
                p.data = p.data.to(want)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def init_random_(self, seed: int = 0) -> None:
        """Random weights that keep activations O(1): linear ``N(0, 1/fan_in)``, residual-branch outputs scaled by
        ``1/sqrt(2 * layers)``, unit norms, Mamba-2 ``dt`` in [1e-3, 1e-1] and ``A`` in [1, 16], GDN decay rates in
        [0.02, 0.5], logits with standard deviation about 2 (peaked, not degenerate)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        dev = self.device
        residual_scale = 1.0 / math.sqrt(2 * len(self.cfg.layer_kinds))

        def normal_(t: torch.Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=gen, device=dev) * std)

        residual_out: set[nn.Module] = set()
        for name, module in self.named_modules():
            if isinstance(module, DenseExpertMoE):
                residual_out.add(module.latent_out if module.latent_out is not None else module.expert.down_proj)
                if module.shared is not None:
                    residual_out.add(module.shared.down_proj)
            elif name.rsplit(".", 1)[-1] in ("out_proj", "o_proj") or (
                    name.endswith("down_proj") and ".expert." not in name and ".shared." not in name):
                residual_out.add(module)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = module.in_features ** -0.5 * (residual_scale if module in residual_out else 1.0)
                normal_(module.weight, std)
            elif isinstance(module, nn.Embedding):
                normal_(module.weight, 1.0)
            elif isinstance(module, nn.Conv1d):
                normal_(module.weight, module.kernel_size[0] ** -0.5)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, (RMSNorm, GatedRMSNorm)):
                module.weight.fill_(0.0 if getattr(module, "unit_offset", False) else 1.0)
            elif isinstance(module, Mamba2Mixer):
                log_dt = math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * torch.rand(
                    module.h, generator=gen, device=dev)
                dt = torch.exp(log_dt)
                module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
                module.A_log.copy_(math.log(16.0) * torch.rand(module.h, generator=gen, device=dev))
                module.D.fill_(1.0)
            elif isinstance(module, GatedDeltaNetMixer):
                module.A_log.copy_(torch.log(0.02 + 0.48 * torch.rand(module.hv, generator=gen, device=dev)))
                module.dt_bias.zero_()
        normal_(self.lm_head.weight, 2.0 * self.cfg.hidden_size ** -0.5)

    # ------------------------------------------------------------------ state
    def allocate(self, batch: int, max_len: int, ssm_impl: str = "baseline", state_dtype: torch.dtype = torch.float32,
                 buffer_len: int = 16, replay_mode: str = "auto", spec_tokens: int = 1) -> DecodeState:
        """Decode state for ``batch`` sequences of up to ``max_len`` tokens; ``ssm_impl`` picks the SSM op;
        ``spec_tokens`` > 1: also speculative windows of that many tokens (:meth:`verify_step`)."""
        if batch < 1 or max_len < 2:
            raise ValueError(f"batch/max_len: expected >= 1 and >= 2, got {batch} and {max_len}")
        cfg, dev, act = self.cfg, self.device, self.dtype
        dims = cfg.ssm_dims
        ssm = SSMStates(ssm_impl, len(cfg.ssm_layers), batch, dims, state_dtype, act, buffer_len, dev, replay_mode,
                        spec_tokens)
        conv = [torch.zeros((batch, dims.conv_dim, cfg.conv_kernel - 1), dtype=act, device=dev)
                for _ in cfg.ssm_layers]
        kv = [KVCache.allocate(batch, max_len, cfg.kv_heads, cfg.attn_head_dim, act, dev, cfg.attn_window)
              for _ in self.attn_index]
        window = [torch.zeros((batch, spec_tokens, dims.conv_dim), dtype=act, device=dev)
                  for _ in cfg.ssm_layers] if spec_tokens > 1 else []
        return DecodeState(ssm, conv, kv, batch, max_len, window)

    # ------------------------------------------------------------------ forward
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.backbone.embeddings if self.cfg.arch == "nemotron_h" else self.model.embed_tokens
        return emb(tokens)

    def _final(self, h: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        norm = self.backbone.norm_f if self.cfg.arch == "nemotron_h" else self.model.norm
        return self.lm_head(_residual_norm(norm, delta, h))

    def _mixer(self, i: int, block: nn.Module, x: torch.Tensor, state: DecodeState, mode: str) -> torch.Tensor:
        kind = block.kind
        if kind in ("mamba2", "gdn"):
            j = self.ssm_index[i]
            if mode == "prefill":
                out, conv_state, ssm_state = block.mixer.prefill(x)
                state.conv[j].copy_(conv_state)
                state.ssm.load_prefill(j, ssm_state)
                return out
            if mode == "verify":
                return block.mixer.verify(x, state.conv[j], state.conv_window[j], state.ssm, j)
            return block.mixer.decode(x, state.conv[j], state.ssm, j)
        if kind == "attention":
            return getattr(block.mixer, mode)(x, state.kv[self.attn_index[i]])
        return block.mixer(x)

    def _forward(self, tokens: torch.Tensor, state: DecodeState, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The residual stream ``h`` and the last block's output ``delta`` not yet added to it (each norm adds the
        previous block's output to ``h`` in place and normalises the sum in one fused op). ``mode``: ``prefill``,
        ``decode`` or ``verify`` (the mixers' method of that name)."""
        h = self._embed(tokens)
        delta = None  # nothing to add before the first block
        for i, block in enumerate(self.trunk.layers):
            if self.cfg.arch == "nemotron_h":
                delta = self._mixer(i, block, _residual_norm(block.norm, delta, h), state, mode)
            else:
                delta = self._mixer(i, block, _residual_norm(block.input_layernorm, delta, h), state, mode)
                delta = block.mlp(block.post_attention_layernorm.add_forward(delta, h))
        return h, delta

    def logits(self, tokens: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Teacher-forced logits of every position of ``tokens [b, T]`` ``[b, T, vocab]``, differentiable (training):
        the prefill path without caches, residual adds out of place, the fused ops' PyTorch references; ``chunk``:
        the SSM layers' chunked scans."""
        h = self._embed(tokens)
        for block in self.trunk.layers:
            if block.kind in ("mamba2", "gdn"):
                mix = lambda x, m=block.mixer: m.prefill(x, chunk)[0]  # noqa: E731
            elif block.kind == "attention":
                mix = lambda x, m=block.mixer: m.prefill(x, None)  # noqa: E731
            else:
                mix = block.mixer
            if self.cfg.arch == "nemotron_h":
                h = h + mix(block.norm(h))
            else:
                h = h + mix(block.input_layernorm(h))
                h = h + block.mlp(block.post_attention_layernorm(h))
        norm = self.backbone.norm_f if self.cfg.arch == "nemotron_h" else self.model.norm
        return self.lm_head(norm(h))

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Run prompts ``tokens [b, T]`` from an empty state; hands the SSM states to ``state``. Returns the logits of
        the last position ``[b, vocab]`` in the model dtype."""
        b, t = tokens.shape
        if b != state.batch or t >= state.max_len:
            raise ValueError(f"tokens: expected shape [{state.batch}, < {state.max_len}], got {list(tokens.shape)}")
        state.reset()
        h, delta = self._forward(tokens, state, "prefill")
        return self._final(h[:, -1].contiguous(), delta[:, -1])

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """One decode step for ``tokens [b]``; returns the logits ``[b, vocab]`` in the model dtype (as the lm_head
        computes them; their argmax is the float32 argmax). No host sync (graph safe)."""
        return self._final(*self._forward(tokens, state, "decode"))

    @torch.no_grad()
    def verify_step(self, tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """A speculative window per row, ``tokens [b, T]`` (the last sampled token, then T - 1 drafts; T =
        ``state.ssm.spec_tokens``); returns the logits after every window token ``[b, T, vocab]``. Nothing is
        committed (:meth:`commit`): the SSM layers verify from their committed state, the conv sees the window
        without shifting it, the attention layers write the window's keys and values past the cached length."""
        if tokens.dim() != 2 or tuple(tokens.shape) != (state.batch, state.ssm.spec_tokens):
            raise ValueError(f"tokens: expected shape [{state.batch}, {state.ssm.spec_tokens}] (spec_tokens of the "
                             f"state), got {list(tokens.shape)}")
        return self._final(*self._forward(tokens, state, "verify"))

    @torch.no_grad()
    def commit(self, accepted: torch.Tensor, state: DecodeState) -> None:
        """After :meth:`verify_step`: row b keeps its first ``accepted[b]`` window tokens (``[b]``, 1 .. T, the
        bonus token counted). The SSM layers commit them (:meth:`SSMStates.commit`), the conv windows shift by them
        and the KV caches grow by them; the rejected tokens leave no trace."""
        accepted = accepted.to(self.device, torch.long)
        for j in range(len(self.cfg.ssm_layers)):
            state.ssm.commit(j, accepted)
            conv1d_commit_(state.conv[j], state.conv_window[j], accepted)
        for kv in state.kv:
            kv.pos.add_(accepted)

    def ssm_probe(self, state: DecodeState, seed: int = 0,
                  accepted: torch.Tensor | None = None) -> Callable[[], None]:
        """A function running only the SSM ops of every SSM layer for one step, on static random inputs (to time the
        SSM share of a step); with ``accepted [b]`` a speculative window of ``spec_tokens`` per row, verified and
        committed with these counts. It mutates ``state``'s SSM buffers."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        mixers = [self.trunk.layers[i].mixer for i in self.cfg.ssm_layers]
        window = accepted is not None
        if window:
            accepted = accepted.to(self.device)  # a graph of the probe cannot copy it from the host
        lead = (state.batch, state.ssm.spec_tokens) if window else (state.batch,)
        inputs = [m.probe_inputs(lead, self.dtype, gen) for m in mixers]

        def run() -> None:
            for j, (mixer, args) in enumerate(zip(mixers, inputs)):
                mixer.ssm_step(state.ssm, j, *args, window=window)
                if window:
                    state.ssm.commit(j, accepted)

        return run


def _residual_norm(norm: nn.Module, delta: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    """``norm(h + delta)`` with ``h += delta`` in place (the residual stream); ``delta`` None: ``norm(h)``."""
    return norm(h) if delta is None else norm.add_forward(delta, h)
