"""TensorRT-LLM-free core of the serving glue: metadata mapping, prefill handoff, fallbacks, version gate.

``trtllm_replayssm.serving.trtllm`` only subclasses TensorRT-LLM classes and calls these functions, so everything here is
tested on CPU without TensorRT-LLM. All tensor functions are device-side (no host sync), hence CUDA-graph safe.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from trtllm_replayssm.core.cache import GDNLayerCache, Mamba2LayerCache
from trtllm_replayssm.core.dims import Mamba2Dims
from trtllm_replayssm.core.ops import conv, mamba2
from trtllm_replayssm.core.plans import LaunchPlan
from trtllm_replayssm.core.reference import gdn as gdn_ref

# The TensorRT-LLM names, signatures and call-site keywords the module relies on (package data;
# build_scripts/extract_trtllm_symbols.py).
SYMBOLS_PATH = Path(__file__).with_name("trtllm_symbols.json")


@functools.cache
def recorded_symbols() -> dict[str, Any]:
    """The record at SYMBOLS_PATH, read once."""
    return json.loads(SYMBOLS_PATH.read_text())


SUPPORTED_TRTLLM_VERSIONS: tuple[str, ...] = ("1.4.0rc1", "1.3.0rc29")
ALLOW_VERSION_ENV = "TRTLLM_REPLAYSSM_ALLOW_ANY_TRTLLM"
DISABLE_ENV = "TRTLLM_REPLAYSSM_DISABLE"
# Mamba2Mixer's MTP verify through TensorRT-LLM's CUDA custom op instead of the SSU attribute the module hooks
MTP_CUSTOM_OP_ENV = "TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP"
PAD_SLOT_ID = -1

_log = logging.getLogger("trtllm_replayssm")


def check_trtllm_version(version: str) -> None:
    """RuntimeError naming the supported versions unless ``version`` is one (or ALLOW_VERSION_ENV=1)."""
    if version in SUPPORTED_TRTLLM_VERSIONS or os.environ.get(ALLOW_VERSION_ENV) == "1":
        return
    raise RuntimeError(f"tensorrt_llm {version} is not supported by trtllm-replayssm; supported: "
                       f"{', '.join(SUPPORTED_TRTLLM_VERSIONS)} (set {ALLOW_VERSION_ENV}=1 to try anyway)")


@dataclass(frozen=True)
class BatchSplit:
    """A TensorRT-LLM batch: context (prefill) requests first, then generation (decode) requests."""

    num_contexts: int
    num_decodes: int
    prefill_slots: torch.Tensor
    decode_slots: torch.Tensor


def split_batch(state_indices: torch.Tensor, num_contexts: int, num_seqs: int) -> BatchSplit:
    """Split ``mamba_metadata.state_indices`` into prefill and decode cache slots.

    ``num_contexts`` is ``attn_metadata.num_contexts``; ``num_seqs`` is ``attn_metadata.seq_lens.shape[0]``
    (contexts + generations, CUDA-graph padding requests included).
    """
    if state_indices.dim() != 1:
        raise ValueError(f"state_indices: expected a 1-D tensor, got shape {tuple(state_indices.shape)}")
    if not 0 <= num_contexts <= num_seqs <= state_indices.shape[0]:
        raise ValueError(f"num_contexts/num_seqs: expected 0 <= {num_contexts} <= {num_seqs} <= "
                         f"len(state_indices)={state_indices.shape[0]}")
    return BatchSplit(num_contexts, num_seqs - num_contexts, state_indices[:num_contexts],
                      state_indices[num_contexts:num_seqs])


def decode_slot_ids(decode_slots: torch.Tensor, num_slots: int, pad_slot_id: int = PAD_SLOT_ID) -> torch.Tensor:
    """``state_batch_indices`` for our ops: int32, each slot at most once per batch.

    CUDA-graph padding requests share the dummy request's slot (one dummy slot without speculation), and padded
    rows may carry negative ids. Every repeat of a slot after its first row, every negative id and every id
    ``>= num_slots`` becomes ``pad_slot_id`` (those rows are skipped by the kernels). Device-side, no host sync.
    """
    if decode_slots.dim() != 1:
        raise ValueError(f"decode_slots: expected a 1-D tensor, got shape {tuple(decode_slots.shape)}")
    if num_slots < 1:
        raise ValueError(f"num_slots: expected a positive integer, got {num_slots}")
    idx = decode_slots.to(torch.int64)
    valid = (idx >= 0) & (idx < num_slots)
    safe = torch.where(valid, idx, torch.full_like(idx, num_slots))  # out-of-range rows go to a spare bucket
    rows = torch.arange(idx.shape[0], device=idx.device, dtype=torch.int64)
    first = torch.full((num_slots + 1,), idx.shape[0], device=idx.device, dtype=torch.int64)
    first.scatter_reduce_(0, safe, rows, reduce="amin")
    keep = valid & (first[safe] == rows)
    return torch.where(keep, idx, torch.full_like(idx, pad_slot_id)).to(torch.int32)


def commit_conv_windows(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], accepted: torch.Tensor,
                        state_indices: torch.Tensor) -> None:
    """MTP's conv-state commit after a verify, for each layer's ``(conv_states, windows)``: decode row ``b`` (slot
    ``state_indices[b]``) takes the conv window its ``accepted[b]``-th window token left, ``conv_states[
    state_indices[b]] = windows[b, accepted[b] - 1]``: ``windows`` [rows >= b, T, ...] as TensorRT-LLM's verify conv
    leaves them in ``intermediate_conv_window`` (row b at its decode position), ``accepted`` 1..T (the bonus token
    counted). Rows that repeat a slot (CUDA-graph padding rows on the dummy's slot, which nothing reads) each write
    it, as in upstream's promotion. The indices are built once for all layers. Device-side, no host sync."""
    n = state_indices.shape[0]
    if accepted.shape != (n,):
        raise ValueError(f"accepted: expected shape ({n},) (one count per decode row), got {tuple(accepted.shape)}")
    for conv_states, windows in layers:
        if (windows.dim() != conv_states.dim() + 1 or windows.shape[0] < n
                or windows.shape[2:] != conv_states.shape[1:]):
            raise ValueError(f"windows: expected [>= {n}, T, {', '.join(map(str, conv_states.shape[1:]))}], got "
                             f"shape {tuple(windows.shape)}")
    if not layers:
        return
    dev = layers[0][1].device
    rows, dst = torch.arange(n, device=dev), state_indices.to(device=dev, dtype=torch.long)
    src = accepted.to(device=dev, dtype=torch.long) - 1
    for conv_states, windows in layers:
        conv_states[dst] = windows[rows, src]


def per_head(t: torch.Tensor | None, lead: int, name: str) -> torch.Tensor | None:
    """Collapse a tie-hdim expanded tensor to one value per head.

    Mamba2Mixer passes ``A`` as ``[H, P, N]``, ``dt_bias`` / ``D`` as ``[H, P]`` and ``dt`` as ``[b, H, P]``
    (repeated along P and N). ``lead`` is the number of leading dims to keep (1 for params, 2 for ``dt``); the
    trailing dims must be broadcast copies, which the caller's ``post_load_weights`` guarantees.
    """
    if t is None:
        return None
    if t.dim() < lead:
        raise ValueError(f"{name}: expected at least {lead} dims, got shape {tuple(t.shape)}")
    while t.dim() > lead:
        t = t[..., 0]
    return t


# Mamba2Mixer's SSU attributes by revision: the single-token one (``selective_state_update_func`` @02140fd4, whose
# per-draft MTP verify calls it too; ``_stp_ssu_func`` where the mixer splits them) and, where split, the one its
# per-draft MTP verify calls (``_mtp_ssu_func``, read in a later stored revision).
SINGLE_TOKEN_SSU_ATTRS = ("selective_state_update_func", "_stp_ssu_func")
MTP_SSU_ATTRS = ("_mtp_ssu_func",)


def mamba2_ssu_attrs(mixer: Any) -> tuple[str, ...]:
    """The SSU attributes of an upstream Mamba2Mixer that ReplaySSM takes over: its single-token SSU (the first of
    SINGLE_TOKEN_SSU_ATTRS it has) and every MTP SSU it has, so that a verify reaches ReplaySSM whichever attribute
    the revision calls; empty without a single-token SSU (then the mixer cannot be hooked)."""
    single = next((name for name in SINGLE_TOKEN_SSU_ATTRS if hasattr(mixer, name)), None)
    if single is None:
        return ()
    return (single, *(name for name in MTP_SSU_ATTRS if hasattr(mixer, name)))


def mamba2_ssu_call(name: str, x: torch.Tensor, kwargs: dict[str, Any], verifies: bool) -> str:
    """What a call of the Mamba2Mixer SSU attribute ``name`` is: ``"decode"`` (the non-speculative single-token
    call: x ``[b, H, P]``, no intermediate-state buffers, no Philox seed) or, in a model that verifies MTP windows
    (``verifies``), ``"verify"`` (4-D x, ``disable_state_update``, no Philox seed). Anything else is a RuntimeError:
    upstream's SSU would update the checkpoint in place, which lags the live state by the ring's tokens."""
    seeded = kwargs.get("rand_seed") is not None
    if verifies:
        if x.dim() == 4 and kwargs.get("disable_state_update") and not seeded:
            return "verify"
        what = "an MTP verify"
    else:
        if (x.dim() == 3 and kwargs.get("intermediate_states_buffer") is None and kwargs.get("cache_steps") is None
                and not seeded):
            return "decode"
        what = "a single-token decode"
    raise RuntimeError(f"trtllm-replayssm: a Mamba-2 SSU call ({name}: x {tuple(x.shape)}, disable_state_update="
                       f"{kwargs.get('disable_state_update')}, rand_seed {'set' if seeded else 'none'}) that is not "
                       f"{what}: this TensorRT-LLM decodes in a way the module does not support "
                       "(TRTLLM_REPLAYSSM_DISABLE=1 serves with upstream kernels)")


def refusals_from_llm_args(llm_args: Any) -> list[str]:
    """What the model's ``TorchLlmArgs`` configure that ReplaySSM cannot serve yet, one line each (read in the
    model class's ``get_model_defaults`` hook, in every worker, before the model is built). Block reuse is checked
    on the live cache manager instead: ``enable_block_reuse`` defaults to true before the model's defaults apply."""
    reasons = []
    kv_cache_config = getattr(llm_args, "kv_cache_config", None)
    if getattr(kv_cache_config, "use_kv_cache_manager_v2", None) is True:
        reasons.append("kv_cache_config.use_kv_cache_manager_v2 is true: the V2 cache manager may move a live "
                       "request to another slot, which its rings would not follow")
    if getattr(llm_args, "cache_transceiver_config", None) is not None:
        reasons.append("cache_transceiver_config is set: disaggregated serving fills slots without a local prefill, "
                       "so their rings would not be reset")
    if getattr(llm_args, "kv_connector_config", None) is not None:
        reasons.append("kv_connector_config is set: a KV connector may restore a slot without a local prefill")
    if (getattr(llm_args, "max_beam_width", 1) or 1) > 1:
        reasons.append(f"max_beam_width is {llm_args.max_beam_width}: beams share one SSM slot per request")
    if getattr(llm_args, "torch_compile_config", None) is not None:
        reasons.append("torch_compile_config is set: the module's per-step host logic (ring binding, prefill "
                       "hand-off, slot ids) was not written for a traced forward")
    return reasons


def refusals_from_quant_config(quant_config: Any) -> list[str]:
    """What the model's ``quant_config`` asks of upstream's SSM kernels that ReplaySSM does not do, one line each:
    ``mamba_ssm_stochastic_rounding`` makes upstream's decode SSU round its fp16 state stochastically (a Philox seed
    in the call), which the module does not run (a bundle's ``--stochastic-rounding`` rounds our checkpoint)."""
    if getattr(quant_config, "mamba_ssm_stochastic_rounding", False):
        return ["quant_config.mamba_ssm_stochastic_rounding is set: upstream's stochastically rounded SSU does not "
                "run under ReplaySSM (build the bundle with --stochastic-rounding for our checkpoint's)"]
    return []


def speculative_refusals(family: str, spec_config: Any, bundle_spec_tokens: int | None,
                         stored_state: bool) -> list[str]:
    """Why ReplaySSM cannot serve the speculative decoding the model's ``spec_config`` configures (None: none), one
    line each: it verifies linear MTP windows (``family``: the model's SSM family) of one draft count, the one the
    bundle's rings were sized for (``bundle_spec_tokens``: the manifest's, None without ``--spec-tokens``), on plain
    checkpoints, through the calls it hooks."""
    if spec_config is None:
        return []
    reasons = []
    decoding = getattr(spec_config, "decoding_type", "MTP")
    if decoding != "MTP":
        reasons.append(f"speculative_config.decoding_type is {decoding!r}: ReplaySSM verifies MTP windows only")
    drafts = getattr(spec_config, "max_draft_len", None) or getattr(spec_config, "num_nextn_predict_layers", None)
    total = getattr(spec_config, "max_total_draft_tokens", None)
    if drafts is not None and total is not None and total != drafts:
        reasons.append(f"speculative_config drafts a tree ({total} draft tokens for {drafts} steps): ReplaySSM "
                       "verifies linear windows only")
    if bundle_spec_tokens is None:
        reasons.append(f"speculative decoding is configured ({drafts} draft tokens) but the bundle was built without "
                       f"--spec-tokens: rebuild it with --spec-tokens {drafts}")
    elif drafts != bundle_spec_tokens:
        reasons.append(f"speculative_config has {drafts} draft tokens, the bundle's rings were sized for "
                       f"{bundle_spec_tokens}: rebuild it with --spec-tokens {drafts}")
    if stored_state:
        reasons.append("speculative decoding with a stored (quantized or dual-copy) checkpoint: the verify kernels "
                       "read plain fp32/fp16/bf16 checkpoints")
    if getattr(spec_config, "draft_len_schedule", None):
        reasons.append("speculative_config.draft_len_schedule is set: the draft count changes with the batch size "
                       "(down to none), ReplaySSM verifies windows of the bundle's draft count")
    if family == "mamba2" and os.environ.get(MTP_CUSTOM_OP_ENV) == "1":
        reasons.append(f"{MTP_CUSTOM_OP_ENV}=1: the mixers verify through TensorRT-LLM's custom op, not the SSU "
                       "call the module hooks")
    return reasons


def refusals_from_cache_manager(kv_cache_manager: Any, beam_width: int, speculative: bool = False,
                                layer_cache: Any = None) -> list[str]:
    """What the live cache manager (``attn_metadata.kv_cache_manager``) and beam width show that ReplaySSM cannot
    serve yet, one line each (checked on the first forward with each manager, an eager warm-up step).
    ``speculative``: the model verifies MTP windows (speculative_refusals passed), which needs the Python Mamba
    cache's speculative state without TensorRT-LLM's own MTP replay; ``layer_cache``: the manager's
    ``mamba_layer_cache`` of one of the model's SSM layers, whose per-draft conv windows the commit copies."""
    reasons = []
    if getattr(kv_cache_manager, "enable_block_reuse", False):
        reasons.append("kv_cache_config.enable_block_reuse is true: prefix-cache blocks would hold a checkpoint, "
                       "not the live state")
    if getattr(kv_cache_manager, "kv_connector_manager", None) is not None:
        reasons.append("a KV connector is configured: it may restore a slot without a local prefill")
    if any(c.__name__ == "MambaHybridCacheManagerV2" for c in type(kv_cache_manager).__mro__):
        reasons.append("the V2 cache manager is in use: it may move a live request to another slot, which its "
                       "rings would not follow")
    is_speculative = getattr(kv_cache_manager, "is_speculative", None)
    manager_speculative = callable(is_speculative) and is_speculative()
    if manager_speculative and not speculative:
        reasons.append("the cache manager is speculative, the model has no speculative configuration ReplaySSM "
                       "serves")
    if speculative:
        if not manager_speculative:
            reasons.append("speculative decoding is configured but the cache manager is not speculative")
        if getattr(kv_cache_manager, "use_replay_state_update", False):
            reasons.append("the cache manager runs TensorRT-LLM's own MTP replay (use_replay_state_update): its "
                           "mixers call that kernel, not the verify the module hooks")
        if not all(callable(getattr(kv_cache_manager, name, None))
                   for name in ("mamba_layer_cache", "update_mamba_states")):
            reasons.append("the cache manager has no mamba_layer_cache / update_mamba_states (the Python Mamba "
                           "cache's speculative state, which MTP verify needs)")
        if getattr(layer_cache, "has_kda_replay_caches", False):
            reasons.append("the cache manager keeps TensorRT-LLM's KDA replay caches (its fused KDA MTP verify) "
                           "instead of the per-draft conv windows the module's commit reads")
        elif layer_cache is not None and getattr(layer_cache, "intermediate_conv_window", None) is None:
            reasons.append("the cache manager's layer cache has no intermediate_conv_window: the module's commit "
                           "takes each row's conv state from it")
    if beam_width > 1:
        reasons.append(f"beam width {beam_width}: beams share one SSM slot per request")
    return reasons


def replay_disabled() -> bool:
    """TRTLLM_REPLAYSSM_DISABLE=1 keeps upstream kernels everywhere (A/B comparison with the same bundle)."""
    return os.environ.get(DISABLE_ENV) == "1"


def as_windows(num_decodes: int, window: int, **tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views ``[n, T, ...]`` of the per-token tensors ``tokens`` (``[n * T, ...]``, in the order given) of
    ``n = num_decodes`` MTP verify windows of ``T = window`` tokens, each decode row's tokens adjacent (TensorRT-LLM's
    layout of a verify batch); a ValueError names the tensor that does not hold ``n * T`` tokens."""
    for name, t in tokens.items():
        if num_decodes < 1 or window < 1 or t.dim() < 1 or t.shape[0] != num_decodes * window:
            raise ValueError(f"{name}: expected {num_decodes} windows of {window} tokens, [{num_decodes * window}, "
                             f"...], got shape {tuple(t.shape)}")
    return tuple(t.unflatten(0, (num_decodes, window)) for t in tokens.values())


def check_verify_call(family: str, verify: bool, window: int) -> None:
    """RuntimeError unless a mixer call of ``family`` is a verify (``verify``) exactly when the model verifies MTP
    windows (``window`` > 1, ``ModelReplayCache.window``): an MTP slot's cursor holds the speculative word, which only
    the verify op reads, and a model without MTP windows has no rings for them."""
    if verify == (window > 1):
        return
    call = "an MTP verify" if verify else "a single-token decode"
    model = "does not verify MTP windows" if verify else "verifies MTP windows"
    raise RuntimeError(f"trtllm-replayssm: {call} of a {family} layer in a model that {model}: this TensorRT-LLM "
                       "decodes in a way the module does not support (TRTLLM_REPLAYSSM_DISABLE=1 serves with upstream "
                       "kernels)")


# forward_extend keywords that describe the decode rows; the prefill-only call drops or empties them
# The keywords GDN's forward_core builds for forward_extend in the revision the glue was written against, as
# recorded; gdn_prefill_kwargs refuses others, which could carry full-batch layouts into the prefill path.
GDN_FORWARD_CORE_KWARGS = frozenset(
    recorded_symbols()["modules"]["tensorrt_llm._torch.modules.mamba.gdn_mixer"]["Qwen3NextGatedDeltaNet"]["dict_keys"]
    ["forward_core"]["kwargs"])
_GDN_DECODE_KWARGS = ("replay_metadata", "layer_cache", "replay_work_items", "replay_n_writes")


def gdn_prefill_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``Qwen3NextGatedDeltaNet.forward_extend`` for the prefill rows alone of a mixed batch whose
    decode rows ReplaySSM verifies: the first ``num_prefill_tokens`` tokens and ``num_prefill`` sequences, no
    decode rows (``forward_core`` builds the keywords; upstream's prefill path then runs its conv and chunked kernel
    on those rows only). Slices of the caller's tensors; no host sync. RuntimeError for a keyword outside
    GDN_FORWARD_CORE_KWARGS."""
    unknown = sorted(set(kwargs) - GDN_FORWARD_CORE_KWARGS)
    if unknown:
        raise RuntimeError(f"trtllm-replayssm: GDN forward_core passes keywords the module was not written against "
                           f"({', '.join(unknown)}): its prefill path could take them for the whole batch and write "
                           "the decode rows' state too (TRTLLM_REPLAYSSM_DISABLE=1 serves with upstream kernels)")
    tokens, seqs = int(kwargs["num_prefill_tokens"]), int(kwargs["num_prefill"])
    if seqs < 1:
        raise ValueError(f"num_prefill: expected a batch with prefill rows, got {seqs}")
    out = {k: v for k, v in kwargs.items() if k not in _GDN_DECODE_KWARGS}
    out.update(mixed_qkv=kwargs["mixed_qkv"][:tokens], a=kwargs["a"][:tokens], b=kwargs["b"][:tokens],
               batch_size=seqs, has_initial_states=kwargs["has_initial_states"][:seqs],
               cache_indices=kwargs["state_indices_p"], query_start_loc=kwargs["query_start_loc"][:seqs + 1],
               query_start_loc_long=kwargs["query_start_loc_long"][:seqs + 1], num_decode_tokens=0, num_decodes=0,
               state_indices_d=kwargs["state_indices_d"][:0], use_replay=False,
               use_cached_replay_all_layer_commit=False)
    return out


def gdn_materialize_slots(layer: GDNLayerCache, slots: torch.Tensor) -> None:
    """Fold the rings of ``slots`` into their checkpoint as a flush does and set their cursor to 0 (in place,
    device-side): the master, and in dual mode the read copy, are written from the same float32 state by the
    checkpoint's write rule (core/checkpoint.py; a flush counted under stochastic rounding).

    Needed before upstream code reads ``layer.state`` as the live state: TensorRT-LLM runs the decode rows of a mixed
    (prefill + decode) batch through its chunked kernel, which starts from ``ssm_states``. The fold is the float32
    reference's (:func:`~trtllm_replayssm.core.reference.gdn.folded_states`). ``slots``: distinct valid slot ids (a
    mixed batch's decode rows carry no padding); no host sync.
    """
    slots = slots.to(torch.int64)
    checkpoint = layer.checkpoint()
    w = layer.cursor.index_select(0, slots).to(torch.int64)
    checkpoint.store_(slots, gdn_ref.folded_states(checkpoint.fold_values(slots), layer.u_ring, layer.k_ring,
                                                   layer.g_ring.unsqueeze(-1), slots, w))
    layer.cursor.index_fill_(0, slots, 0)


def decode_conv(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None, slots: torch.Tensor, upstream: Callable[[], torch.Tensor]
                ) -> tuple[torch.Tensor, bool]:
    """The conv1d step of the decode rows right before a decode op: ``x [b, C]``, TensorRT-LLM's conv pool
    ``[slots, C, W-1]``, ``weight [C, W]``, ``slots`` the rows' ids as the ops take them (``decode_slots``). Ours
    (``ops.conv.conv1d_update`` with upstream's numerics, ``round_once``) where it takes these tensors, which lets
    the decode op's state kernels launch as its programmatic dependents: (its output, True); else upstream's conv
    (``upstream()``): (its output, False)."""
    if activation in (None, "silu", "swish"):
        try:
            conv.check_args(x, conv_states, weight, bias, slots, PAD_SLOT_ID, None)
        except (TypeError, ValueError) as e:
            _log.debug("trtllm-replayssm: upstream's conv1d update (%s)", e)
        else:
            return conv.conv1d_update(x, conv_states, weight, bias, activation is not None, slots, PAD_SLOT_ID,
                                      round_once=True, checked=True), True
    return upstream(), False


def mamba2_decode(layer: Mamba2LayerCache, dims: Mamba2Dims, zxbcdt: torch.Tensor, conv_states: torch.Tensor,
                  conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, A: torch.Tensor,  # noqa: N803
                  D: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,  # noqa: N803
                  slots: torch.Tensor, plan: Callable[[bool], LaunchPlan],
                  upstream_conv: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A pure-decode batch of a Mamba-2 layer of (one rank's) ``dims`` from ``Mamba2Mixer.in_proj``'s output
    ``zxbcdt [b, ...]`` to the SSM output: the conv1d step on the xBC section (:func:`decode_conv`;
    ``upstream_conv(xbc)`` where ours cannot take the tensors), then ``ops.mamba2.replay_decode`` on strided views of
    its output and of ``dt`` (no copies; ``A``, ``D``, ``dt_bias`` [H] fp32) with ``plan(after_our_conv)``. ``slots``:
    the rows' ids as the ops take them (``decode_slots``). Returns ``(y [b, H*P], z [b, H*P])``, what upstream's gated
    norm takes."""
    z, xbc, dt = dims.split_zxbcdt(zxbcdt)
    activations, own_conv = decode_conv(xbc, conv_states, conv_weight, conv_bias, "silu", slots,
                                        lambda: upstream_conv(xbc))
    x, B, C = dims.split_xbc(activations)  # noqa: N806
    y = x.new_empty(x.shape[0], dims.d_inner)
    mamba2.replay_decode(layer, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                         state_batch_indices=slots, pad_slot_id=PAD_SLOT_ID, out=y.view(x.shape),
                         plan=plan(own_conv))
    return y, z


def kda_packed_conv_weight(q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor) -> torch.Tensor:
    """``[3D, W]`` depthwise conv weight (sections q | k | v) from the three ``ShortConvolution`` weights
    ``[D, 1, W]`` (or ``[D, W]``), in the order of TensorRT-LLM's packed KDA conv pool ``[slots, 3D, W-1]``."""
    parts = []
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight), ("v_weight", v_weight)):
        if w.dim() == 3 and w.shape[1] == 1:
            w = w[:, 0]
        if w.dim() != 2:
            raise ValueError(f"{name}: expected shape [D, 1, W] or [D, W], got {tuple(w.shape)}")
        parts.append(w)
    if len({tuple(p.shape) for p in parts}) != 1:
        raise ValueError(f"q_weight/k_weight/v_weight: expected equal shapes, got {[tuple(p.shape) for p in parts]}")
    return torch.cat(parts, dim=0).contiguous()


def kda_check_conv_pool(conv_pool: torch.Tensor, proj_size: int, conv_size: int) -> None:
    """ValueError unless ``conv_pool`` is the packed ``[slots, 3 * proj_size, conv_size - 1]`` layout the replay
    hook's conv update assumes (older TensorRT-LLM revisions kept a full ``W``-wide window)."""
    want = (3 * proj_size, conv_size - 1)
    if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != want:
        raise ValueError(f"conv_pool: expected shape [slots, {want[0]}, {want[1]}], got {tuple(conv_pool.shape)}")


def kda_gate_inputs(g_hidden: torch.Tensor, beta: torch.Tensor, num_heads: int, head_dim: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw gate ``g [b, H, K]`` and beta logits ``[b, H]`` for ``ops.kda.replay_decode`` from the mixer's
    ``f_b_proj(f_a_proj(x))`` ``[b, H*K]`` and ``b_proj(x)`` ``[b, H]`` (the op applies A_log, dt_bias, the
    lower bound and the beta sigmoid itself, as upstream's kernel does)."""
    if g_hidden.dim() != 2 or g_hidden.shape[1] != num_heads * head_dim:
        raise ValueError(f"g_hidden: expected shape [tokens, {num_heads * head_dim}], got {tuple(g_hidden.shape)}")
    if beta.dim() != 2 or tuple(beta.shape) != (g_hidden.shape[0], num_heads):
        raise ValueError(f"beta: expected shape [{g_hidden.shape[0]}, {num_heads}], got {tuple(beta.shape)}")
    return g_hidden.unflatten(1, (num_heads, head_dim)), beta


def kda_fp32_params(A_log: torch.Tensor, dt_bias: torch.Tensor, num_heads: int, head_dim: int  # noqa: N803
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous fp32 ``A_log [H]`` and ``dt_bias [H, K]`` copies (the mixer casts its parameters to bf16;
    our op takes fp32). Built once per layer, outside CUDA-graph capture."""
    if A_log.numel() != num_heads:
        raise ValueError(f"A_log: expected {num_heads} elements, got shape {tuple(A_log.shape)}")
    if dt_bias.numel() != num_heads * head_dim:
        raise ValueError(f"dt_bias: expected {num_heads * head_dim} elements, got shape {tuple(dt_bias.shape)}")
    return (A_log.detach().reshape(num_heads).float().contiguous(),
            dt_bias.detach().reshape(num_heads, head_dim).float().contiguous())
