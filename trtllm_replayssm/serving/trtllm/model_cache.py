"""One model's replay state inside TensorRT-LLM: rings, cursors and one shared scratch for all of its SSM layers,
keyed by TensorRT-LLM's layer index and bound to TensorRT-LLM's SSM-state pool (TensorRT-LLM-free, CPU-tested).

The checkpoints are TensorRT-LLM's own state tensors: the cache managers hand out a fresh view of the same pool on
every call (strided, in the unified C++ pool), so a layer's checkpoint is whatever view this step's call brings, and
the rings stay bound to the pool that view belongs to (its address, shape, strides, dtype and device). The rings are
allocated once per pool, for every SSM layer at once, sized by the pool's slot count; a new pool (TensorRT-LLM replaces
its memory-estimation cache manager before serving) reallocates them, which is refused inside CUDA-graph capture.

A decode step's slot ids (one per batch row, each slot once, CUDA-graph padding rows as ``PAD_SLOT_ID``) are computed
once per model forward, by the first SSM layer, and reused by the others.

With a stored spec (a dual read copy, stochastic rounding) TensorRT-LLM's pool is the master and the rest (read
copy, flush counts) lives here beside the rings; after upstream's prefill wrote a request's state,
:meth:`prefill_written` encodes the read copy from it (the write rule of a flush). An FP8/NVFP4 checkpoint (shared
mode) or FP8 master (dual mode) keeps its codes in the pool's bytes (``core.checkpoint.codes_in_pool``: the first
bytes of each slot's region) and its scales here. Upstream code reads and writes that pool as values, so around it
the slots change form: :meth:`layer_step` writes the decoded values of the step's context slots into the pool (a
later prefill chunk starts from them), :meth:`expose_slots` those of other slots upstream steps (GDN's mixed
batches), and :meth:`prefill_written` encodes what upstream wrote back into codes.

Speculative decoding (``spec_tokens`` N, MTP): rings of ``serving.speculative.ring_len`` records; every decode step
is a verify (:meth:`verify`, windows of 1 to N + 1 tokens per row, nothing committed) followed by :meth:`commit` of
each row's accepted count (the bonus token counted), once for all layers, as TensorRT-LLM's ``update_mamba_states``
does after sampling. A slot's cursor then holds the speculative word (``core/spec_cursor.py``), so such a cache runs
the verify op only, never the standard replay op. Plain checkpoints only (the verify kernels read fp32, fp16 or bf16
states).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.checkpoint import codes_in_pool
from trtllm_replayssm.core.checks import capturing
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.core.ops import spec
from trtllm_replayssm.core.plans import Device, LaunchPlan, Tuning
from trtllm_replayssm.serving.speculative import check_spec_tokens, ring_len
from trtllm_replayssm.serving.trtllm.core import PAD_SLOT_ID, commit_conv_windows, decode_slot_ids

_log = logging.getLogger("trtllm_replayssm")


@dataclass(frozen=True)
class PoolKey:
    """What ties a state view to the pool the rings were sized for: same memory, same slot geometry."""

    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, state: torch.Tensor) -> "PoolKey":
        return cls(state.data_ptr(), tuple(state.shape), tuple(state.stride()), state.dtype, state.device)


# Upstream's kernels before a decode op (its causal_conv1d_update; in a mixed Mamba-2 batch, then its copies) launch
# plainly, so they never let a dependent start early; behind such a kernel the state kernels run faster launched
# plainly too (docs/decisions.md, "Served decode launches the state kernels plainly").
SERVING_TUNING = Tuning(programmatic_state=False)
# Before its GDN and KDA decode ops and a Mamba-2 pure-decode batch's the module runs our conv1d step
# (core.decode_conv), which lets the next kernel launch at once: there the state kernels launch as its programmatic
# dependents, reading their slot and hinting L2 while the conv runs (docs/decisions.md, "GDN/KDA served decode
# behind the module's own conv1d step", "Mamba-2 served decode behind the module's own conv1d step").
AFTER_CONV_TUNING = Tuning()


class ModelReplayCache:
    """Replay state of one model's SSM layers of one family (``layer_ids``: TensorRT-LLM's global layer indices).

    ``num_k_heads``: TP-local group count (Mamba-2 ``n_groups``, GDN key heads; KDA ignores it). ``state``: the
    bundle's checkpoint spec (None: plain, in the pool's dtype). ``spec_tokens``: MTP draft tokens (None: standard
    decode; module docstring). Per model forward: :meth:`begin_step`, then per layer :meth:`layer` and
    :meth:`decode_slots` and :meth:`decode_plan` (and :meth:`prefill_written` after a prefill), and :meth:`end_step`;
    with ``spec_tokens`` :meth:`verify` per layer and :meth:`commit` after the forward.
    """

    def __init__(self, family: str, layer_ids: Sequence[int], num_k_heads: int, buffer_len: int,
                 act_dtype: torch.dtype, planned: tuple[int, int] | None = None,
                 state: StateSpec | None = None, spec_tokens: int | None = None) -> None:
        ids = tuple(int(i) for i in layer_ids)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"layer_ids: expected distinct layer indices, got {list(layer_ids)}")
        self.family = get_family(family)
        self.layer_ids = ids
        self._index = {layer_id: i for i, layer_id in enumerate(ids)}
        self.num_k_heads = num_k_heads
        self.buffer_len = check_buffer_len(buffer_len)
        self.act_dtype = act_dtype
        self.planned = planned  # (bytes, slots) the bundle's memory plan set aside for the rings
        self.state = state
        self.codes = state is not None and state.checkpoint_format.quantized  # codes in the pool's bytes
        self.window = 1 + (check_spec_tokens(spec_tokens) or 0)  # the longest verify window (1: standard decode)
        self.ring_len = ring_len(self.buffer_len, spec_tokens)
        if spec_tokens is not None:
            if state is not None and state.stored:
                raise ValueError(f"state: speculative verify reads plain checkpoints (fp32, fp16, bf16), the bundle's "
                                 f"is {state.label}")
            if self.ring_len < spec_cursor.min_ring_len(self.window):
                raise ValueError(f"buffer_len: windows of {self.window} tokens need rings of "
                                 f"{spec_cursor.min_ring_len(self.window)} records, L + N + 1 = {self.ring_len}")
        self._verified = 0  # the window of this step's verifies (0: none since the last commit)
        self.cache: ReplayStateCache | None = None
        self.binds = 0  # ring allocations so far (one per upstream pool)
        self._pools: dict[int, PoolKey] = {}
        self._in_step = self._handed_off = False
        self._step_slots: torch.Tensor | None = None
        self._row_ids: torch.Tensor | None = None  # 0 .. slots - 1 (int32), allocated with the rings

    # ------------------------------------------------------------------ binding
    def layer(self, layer_id: int, state: torch.Tensor):
        """Layer ``layer_id``'s ring cache with this call's ``state`` view as its checkpoint (the codes in its bytes
        for an FP8/NVFP4 checkpoint); allocates the rings for every layer when ``state`` belongs to a pool they are
        not bound to."""
        if layer_id not in self._index:
            raise ValueError(f"layer_id: expected one of the model's SSM layers {list(self.layer_ids)}, got {layer_id}")
        key = PoolKey.of(state)
        if self.cache is None or self._pools.get(layer_id, key) != key:
            self._bind(state)
        self._pools[layer_id] = key
        data = codes_in_pool(state, self.state.checkpoint_format) if self.codes else state
        return self.cache.with_checkpoint(self._index[layer_id], data)  # a layer of another geometry: ValueError

    def _bind(self, state: torch.Tensor) -> None:
        if capturing():
            raise RuntimeError("trtllm-replayssm: the SSM-state pool changed during CUDA-graph capture; the rings "
                               "must be bound by an eager step first (TensorRT-LLM runs eager warm-up steps before "
                               "capturing, so this TensorRT-LLM does something the module does not support)")
        self.cache = None  # free the old rings before allocating the new ones
        if self.state is not None and not self.codes and self.state.checkpoint_format.storage_dtype != state.dtype:
            raise RuntimeError(f"trtllm-replayssm: TensorRT-LLM's SSM pool is {state.dtype}, the bundle's "
                               f"{self.state.label} state needs its master in "
                               f"{self.state.checkpoint_format.storage_dtype} (mamba_ssm_cache_dtype in the bundle's "
                               "YAML)")
        if self.codes:
            try:
                codes_in_pool(state, self.state.checkpoint_format)
            except ValueError as exc:
                raise RuntimeError(f"trtllm-replayssm: the bundle's {self.state.label} codes cannot live in "
                                   f"TensorRT-LLM's SSM pool (mamba_ssm_cache_dtype in the bundle's YAML): "
                                   f"{exc}") from exc
        dims = self.family.dims.of_state(tuple(state.shape), self.num_k_heads)
        self.cache = self.family.new_cache(dims, len(self.layer_ids), state.shape[0], buffer_len=self.ring_len,
                                           state_dtype=self.state or state.dtype, act_dtype=self.act_dtype,
                                           device=state.device, checkpoints=False)
        self._row_ids = torch.arange(state.shape[0], dtype=torch.int32, device=state.device)
        self._pools.clear()
        self.binds += 1
        gib, slots = self.ring_bytes() / (1 << 30), state.shape[0]
        _log.info("trtllm-replayssm: %s rings for %d layers x %d slots: %.3f GiB", self.family.name,
                  len(self.layer_ids), slots, gib)
        if self.planned is not None and self.ring_bytes() > self.planned[0]:
            _log.warning("trtllm-replayssm: TensorRT-LLM's SSM-state pool has %d slots, the bundle planned the rings "
                         "for %d (%.3f GiB): the %.3f GiB they take now are outside TensorRT-LLM's memory budget "
                         "beyond what the bundle's free_gpu_memory_fraction keeps free; rebuild the bundle with "
                         "--max-batch-size %d to plan for them", slots, self.planned[1],
                         self.planned[0] / (1 << 30), gib, slots - 1)

    def ring_bytes(self) -> int:
        """Bytes of the rings, cursors and scratch allocated now (0 before the first bind)."""
        return 0 if self.cache is None else self.cache.bytes_per_slot() * self.cache.slots

    # ------------------------------------------------------------------ steps
    def begin_step(self) -> None:
        """A model forward starts: the first layer's :meth:`layer_step` hands prefills off, the first
        :meth:`decode_slots` computes the step's slot ids."""
        self._in_step, self._handed_off, self._step_slots = True, False, None

    def end_step(self) -> None:
        self._in_step, self._step_slots = False, None

    def _check_in_step(self, what: str) -> None:
        if not self._in_step:
            raise RuntimeError(f"trtllm-replayssm: {what} outside a model forward (begin_step not called)")

    def layer_step(self, layer_id: int, state: torch.Tensor, state_indices: torch.Tensor, num_contexts: int):
        """Called by every SSM layer's forward, before upstream code runs, with its state view: binds the rings to
        the view's pool (as :meth:`layer`), and the first call of a step empties the rings (cursor 0, every layer) of
        the context requests, whose prefill writes their checkpoints this step (first chunks, later chunks and a new
        request on a reused slot alike). With codes in the pool, the context slots' decoded values are written there
        (:meth:`expose_slots`: a later chunk's prefill reads them). Decided on the host from ``num_contexts``;
        device-side index writes only, no sync. Returns the layer, as :meth:`layer`."""
        self._check_in_step("layer_step")
        layer = self.layer(layer_id, state)
        if not self._handed_off:
            self._handed_off = True
            if num_contexts:
                self.cache.reset_slots(state_indices[:num_contexts])
        if num_contexts and self.codes:
            _write_values(layer, state, state_indices[:num_contexts])
        return layer

    def expose_slots(self, layer_id: int, state: torch.Tensor, slots: torch.Tensor) -> None:
        """Upstream code reads the checkpoints of ``slots`` (distinct valid ids) from ``state`` as values next: with
        codes in the pool their decoded values replace them there, in the pool's dtype (:meth:`prefill_written`
        encodes them back); nothing otherwise. Device-side only; steps with upstream prefills are never captured."""
        if self.codes:
            _write_values(self.layer(layer_id, state), state, slots)

    def prefill_written(self, layer_id: int, state: torch.Tensor, slots: torch.Tensor) -> None:
        """After upstream code wrote ``state`` (the master) for ``slots`` this step (a prefill; for GDN also the decode
        rows of a mixed batch, which its chunked kernel steps): with a stored spec, the read copy is encoded from it
        and the write counted (the write rule, the master left as upstream wrote it; codes in the pool are encoded
        from the values upstream wrote over them); nothing for a plain checkpoint. Device-side only; steps with
        prefills are never captured."""
        self._check_in_step("prefill_written")
        layer = self.layer(layer_id, state)
        if layer.storage is None or slots.numel() == 0:
            return
        ids = slots.to(device=state.device, dtype=torch.long)
        checkpoint = layer.checkpoint()
        if self.codes:  # the values, read before their bytes take the codes
            checkpoint.store_(ids, state[ids].float())
        else:
            checkpoint.store_(ids, checkpoint.fold_values(ids), write_master=False)

    def decode_slots(self, decode_state_indices: torch.Tensor) -> torch.Tensor:
        """``state_batch_indices`` of this step's decode rows for the ops (computed by the first layer that asks). On
        CUDA upstream's ids as int32: the decode and verify kernels skip a row whose id is outside the pool or repeats
        an earlier row's slot (CUDA-graph padding rows on the dummy's slot) with zero outputs, as they skip pad rows
        (docs/design.md, rows a step skips). On the CPU, whose references refuse such ids, :func:`decode_slot_ids`
        maps them to the pad id first: the same outputs."""
        self._check_in_step("decode_slots")
        if self.cache is None:
            raise RuntimeError("trtllm-replayssm: decode_slots before any layer bound the rings")
        if self._step_slots is None:
            self._step_slots = (decode_state_indices.to(torch.int32).contiguous()
                                if decode_state_indices.is_cuda else
                                decode_slot_ids(decode_state_indices, self.cache.slots))
        return self._step_slots

    def decode_plan(self, layer: Any, rows: int, device: Device | None = None, after_conv: bool = False
                    ) -> LaunchPlan:
        """The launch plan of a standard decode step of ``rows`` decode rows on ``layer`` (mode ``auto``) with
        :data:`SERVING_TUNING`, or :data:`AFTER_CONV_TUNING` right after our conv1d step (``after_conv``;
        ``device``: the GPU to plan for, default the layer's)."""
        return self.family.replay_plan(layer, rows, "auto", AFTER_CONV_TUNING if after_conv else SERVING_TUNING,
                                       device)

    # ------------------------------------------------------------------ speculative decoding
    def decode_rows(self, num_decodes: int) -> torch.Tensor:
        """``0 .. num_decodes - 1`` (int32, a view of a buffer allocated with the rings): the batch-row indices of
        the decode rows' per-draft buffers (``intermediate_state_indices`` of upstream's verify conv), without an
        allocation or a launch per layer."""
        if self._row_ids is None:
            raise RuntimeError("trtllm-replayssm: decode_rows before any layer bound the rings")
        if not 0 < num_decodes <= self._row_ids.shape[0]:
            raise ValueError(f"num_decodes: expected 1 to {self._row_ids.shape[0]} decode rows (the pool's slots), "
                             f"got {num_decodes}")
        return self._row_ids[:num_decodes]

    def verify(self, layer_id: int, state: torch.Tensor, decode_state_indices: torch.Tensor, *step_args: object,
               out: torch.Tensor, **step_kwargs: object) -> torch.Tensor:
        """A verify of the decode rows' windows on layer ``layer_id`` with this call's ``state`` view: the family's
        verify op on ``step_args`` ``[b, T, ...]`` (1 <= T <= the longest window; the same T in every layer of a
        step), ``out [b, T, ...]`` gets every window token's output; each row's window is written past its committed
        history and nothing is committed until :meth:`commit`."""
        self._check_in_step("verify")
        if self.window == 1:
            raise RuntimeError("trtllm-replayssm: verify on a cache built without spec_tokens")
        x = step_args[0]
        T = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() >= 2 else 0
        if not 1 <= T <= self.window or (self._verified and T != self._verified):
            raise ValueError(f"step_args: expected windows of 1 to {self.window} tokens [b, T, ...], the same in every "
                             f"layer of a step (this step's: {self._verified or 'none yet'}), got shape "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        layer = self.layer(layer_id, state)
        self.family.verify_step(layer, *step_args, state_batch_indices=self.decode_slots(decode_state_indices),
                                pad_slot_id=PAD_SLOT_ID, out=out, **step_kwargs)
        self._verified = T
        return out

    def commit(self, accepted: torch.Tensor, decode_state_indices: torch.Tensor) -> None:
        """After the verifies of a step: decode row ``b`` keeps its first ``accepted[b]`` window tokens (1..T, the
        bonus token counted) in every layer, a cursor move in one launch (``core/ops/spec.py`` commit_layers: on
        CUDA a count outside 1..T keeps the row's cursor, the CPU reference raises). ``decode_state_indices``: the
        rows' slots as :meth:`decode_slots` takes them, passed to the commit as they are: it skips a row whose slot
        repeats an earlier row's (a padding row) or lies outside the pool itself. Device-side, no host sync."""
        if not self._verified:
            raise RuntimeError("trtllm-replayssm: commit without a verify since the last commit")
        device = self.cache.cursor.device
        slots = decode_state_indices.to(device=device, dtype=torch.int32)
        counts = accepted.to(device=device, dtype=torch.int32)
        spec.commit_layers(self.cache.cursor, self.cache.buffer_len, counts, slots, PAD_SLOT_ID, window=self._verified)
        self._verified = 0

    def update_mamba_states(self, kv_cache_manager: Any, attn_metadata: Any, num_accepted_tokens: torch.Tensor,
                            state_indices: torch.Tensor | None = None,
                            accepted_leaf_positions: torch.Tensor | None = None) -> None:
        """TensorRT-LLM's ``update_mamba_states`` after sampling, for a model whose SSM layers all verify here
        (bound to ``kv_cache_manager`` in its place): the generation rows (after ``attn_metadata.num_contexts``
        context rows, ``attn_metadata.num_seqs`` rows in all) keep their accepted counts (:meth:`commit`) and
        their conv states take the windows of those counts (``commit_conv_windows`` on each layer's
        ``kv_cache_manager.mamba_layer_cache(layer).conv`` / ``.intermediate_conv_window``). Upstream's copy of
        per-draft SSM states is not made: the verify wrote none. Device-side, no host sync."""
        if state_indices is None:
            raise RuntimeError("trtllm-replayssm: update_mamba_states without state_indices: this TensorRT-LLM "
                               "commits speculative state in a way the module was not written against")
        if accepted_leaf_positions is not None:
            raise RuntimeError("trtllm-replayssm: update_mamba_states with tree positions: ReplaySSM verifies linear "
                               "MTP windows only")
        num_contexts = int(attn_metadata.num_contexts)
        num_gens = int(attn_metadata.num_seqs) - num_contexts
        if num_gens == 0:
            return
        accepted = num_accepted_tokens[num_contexts:num_contexts + num_gens]
        slots = state_indices[num_contexts:num_contexts + num_gens]
        self.commit(accepted, slots)
        layers = [kv_cache_manager.mamba_layer_cache(layer_id) for layer_id in self.layer_ids]
        commit_conv_windows([(layer.conv, layer.intermediate_conv_window) for layer in layers], accepted, slots)


def _write_values(layer: Any, state: torch.Tensor, slots: torch.Tensor) -> None:
    """The decoded checkpoints of ``slots`` written over their codes in ``state``, the pool whose bytes ``layer``'s codes
    are (ModelReplayCache.expose_slots)."""
    if slots.numel() == 0:
        return
    ids = slots.to(device=state.device, dtype=torch.long)
    values = layer.checkpoint().fold_values(ids)  # read before the bytes are overwritten
    state[ids] = values.nan_to_num_(nan=0.0).to(state.dtype)  # NaN: FP8 codes of bytes never written (a new slot)
