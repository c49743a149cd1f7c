"""ReplayStateCache: per-layer checkpoint states, input rings and per-slot device cursors for one model's SSM layers.

Layout per layer (TP-local; docs/design.md):

* Mamba-2: ``state [slots, H, P, N]``, ``x_ring [slots, H, L, P]`` (act), ``dt_ring [slots, H, L]`` (fp32, Δ after
  bias + softplus), ``B_ring [slots, G, L, N]`` (act).
* GDN:     ``state [slots, HV, V, K]``, ``u_ring [slots, HV, L, V]`` (act), ``k_ring [slots, H, L, K]`` (act),
  ``g_ring [slots, HV, L]`` (fp32, inclusive cumulative log-gate since the checkpoint).
* KDA:     as GDN with ``g_ring [slots, HV, L, K]`` (fp32, per channel) and ``k_ring [slots, HV, L, K]``: one key per
  value head, pre-decayed (``e^{-G_j} k_j``) while the cumulative gate allows (core/reference/gdn.py PREDECAY_FLOOR);
  activation dtype, fp32 for fp16 activations.

Every layer also has ``cursor [slots]`` (int32, ring fill of each slot) and ``arrive [slots]`` (int32, the in-launch
arrival counter that lets the decode launch advance the cursor). Slot operations (prefill hand-off, reset on reuse)
are device-side index writes: no host sync, safe to call between CUDA-graph replays.

A cache built with ``checkpoints=False`` holds rings, cursors and scratch only: the checkpoint of each layer is a
tensor someone else owns (a serving engine's SSM-state pool, possibly strided), handed in per call with
:meth:`ReplayStateCache.with_checkpoint`.

The checkpoint storage follows a StateSpec (core/formats.py, core/checkpoint.py): ``state`` holds the plain
checkpoint, the quantized checkpoint's codes (shared mode) or the master (dual mode); ``storage`` holds everything
else (scales, the read copy, the stochastic-rounding flush counters) and is None for a plain spec without stochastic
rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar, Sequence

import torch

from trtllm_replayssm.core.checkpoint import Checkpoint, data_cols
from trtllm_replayssm.core.checks import check_slot_values
from trtllm_replayssm.core.formats import StateSpec, state_spec
from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.core.layouts import delta_record_len, key_ring_dtype


@dataclass
class _LayerCache:
    """Tensors of one layer; ``cursor``/``arrive`` are views into the cache-wide [layers, slots] tensors; ``state``
    is None in a cache without checkpoints until :meth:`ReplayStateCache.with_checkpoint` binds one."""

    state: torch.Tensor | None
    cursor: torch.Tensor
    arrive: torch.Tensor
    storage: Checkpoint | None = field(default=None, kw_only=True)

    @property
    def slots(self) -> int:
        return self.cursor.shape[0]

    @property
    def spec(self) -> StateSpec:
        """How the checkpoint is stored."""
        return self.storage.spec if self.storage is not None else state_spec(self.require_state().dtype, arg="state")

    def checkpoint(self) -> Checkpoint:
        """The checkpoint storage the references read and write (its master data is ``state``)."""
        state = self.require_state()
        if self.storage is None:
            return Checkpoint.of_tensor(state)
        return replace(self.storage, master=replace(self.storage.master, data=state))

    def require_state(self) -> torch.Tensor:
        """The checkpoint; ValueError when none is bound (a ``checkpoints=False`` cache's own layers)."""
        if self.state is None:
            raise ValueError("layer.state: no checkpoint bound (this cache holds rings only: pass "
                             "ReplayStateCache.with_checkpoint(index, state))")
        return self.state

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f.name: t for f in fields(self) if isinstance(t := getattr(self, f.name), torch.Tensor)}
        if self.storage is not None:
            out.update(_storage_tensors(self.storage))
        return out

    shared_scratch: ClassVar[tuple[str, ...]] = ()  # fields shared by all layers (counted once per cache)

    def slot_tensors(self) -> dict[str, torch.Tensor]:
        """The per-slot tensors (state, rings, cursors), without the per-step scratch (indexed by batch row)."""
        return {name: t for name, t in self.tensors().items() if name not in self.shared_scratch}

    def nbytes_per_slot(self, include_shared: bool = False) -> int:
        return sum(t[0].numel() * t.element_size() for name, t in self.tensors().items()
                   if include_shared or name not in self.shared_scratch)


@dataclass
class Mamba2LayerCache(_LayerCache):
    """``coef`` [slots, H, L+1] fp32 and ``step`` [slots + 1] int32 are per-step scratch indexed by batch row and
    shared by all layers of a cache (layers run one after another on a stream): the replay's prep launch writes them,
    its main launch reads them; ``step[0]`` is the main launch's tile-claim counter, ``step[1:]`` the rows' words."""

    x_ring: torch.Tensor
    dt_ring: torch.Tensor
    B_ring: torch.Tensor
    coef: torch.Tensor
    step: torch.Tensor
    shared_scratch: ClassVar[tuple[str, ...]] = ("coef", "step")

    @property
    def buffer_len(self) -> int:
        return self.x_ring.shape[2]

    @property
    def rings(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_ring, dt_ring, B_ring)``, in the order the references take them."""
        return self.x_ring, self.dt_ring, self.B_ring


@dataclass
class GDNLayerCache(_LayerCache):
    """``coef`` [slots, HV, record] fp32 and ``step`` [slots + 1] int32: per-step scratch indexed by batch row and
    shared by all layers (the replay's prep launch writes one record per (row, value head), its main launch reads
    them); ``step[0]`` is the main launch's tile-claim counter (plugins/replayssm_common.cuh
    produce_tiles_claiming_tail), ``step[1:]`` the rows' words."""

    u_ring: torch.Tensor
    k_ring: torch.Tensor
    g_ring: torch.Tensor
    coef: torch.Tensor
    step: torch.Tensor
    shared_scratch: ClassVar[tuple[str, ...]] = ("coef", "step")

    @property
    def buffer_len(self) -> int:
        return self.u_ring.shape[2]

    @property
    def rings(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(u_ring, k_ring, g_ring)``, in the order the references take them."""
        return self.u_ring, self.k_ring, self.g_ring


@dataclass
class KDALayerCache(GDNLayerCache):
    """KDA: ``g_ring`` carries one cumulative log-gate per key channel ([slots, HV, L, K]), ``k_ring`` one
    pre-decayed key per value head ([slots, HV, L, K])."""


class ReplayStateCache:
    """Checkpoint + ring buffers + cursors for ``num_layers`` SSM layers of one family; build with a factory."""

    def __init__(self, family: str, layers: list[_LayerCache], cursor: torch.Tensor, arrive: torch.Tensor,
                 act_dtype: torch.dtype, buffer_len: int, state_shape: tuple[int, ...], spec: StateSpec) -> None:
        self.family = family
        self._layers = layers
        self.cursor = cursor
        self.arrive = arrive
        self.act_dtype = act_dtype
        self.buffer_len = buffer_len
        self.state_shape = state_shape  # one slot's checkpoint
        self.spec = spec
        self.state_dtype = spec.checkpoint_format.storage_dtype  # of ``state`` (dual mode: the master)

    # ------------------------------------------------------------------ factories
    @classmethod
    def mamba2(cls, num_layers: int, slots: int, nheads: int, head_dim: int, d_state: int, ngroups: int,
               buffer_len: int = 16, state_dtype: str | torch.dtype | StateSpec = "fp32",
               act_dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
               checkpoints: bool = True) -> "ReplayStateCache":
        """Cache for Mamba-2 layers (TP-local ``nheads``/``ngroups``); ``checkpoints=False``: rings only.
        ``state_dtype``: a format name, dtype or StateSpec (quantized checkpoints, dual mode, stochastic rounding)."""
        _check_positive(num_layers=num_layers, slots=slots, nheads=nheads, head_dim=head_dim, d_state=d_state,
                        ngroups=ngroups)
        if nheads % ngroups:
            raise ValueError(f"ngroups: must divide nheads={nheads}, got {ngroups}")
        L, spec = check_buffer_len(buffer_len), state_spec(state_dtype, arg="state_dtype")
        cursor, arrive = _cursors(num_layers, slots, device)
        coef = torch.zeros(slots, nheads, L + 1, dtype=torch.float32, device=device)
        step = torch.zeros(slots + 1, dtype=torch.int32, device=device)
        state_shape = (nheads, head_dim, d_state)
        layers = [Mamba2LayerCache(
            **_checkpoint(spec, slots, state_shape, device, checkpoints, i),
            cursor=cursor[i], arrive=arrive[i],
            x_ring=torch.zeros(slots, nheads, L, head_dim, dtype=act_dtype, device=device),
            dt_ring=torch.zeros(slots, nheads, L, dtype=torch.float32, device=device),
            B_ring=torch.zeros(slots, ngroups, L, d_state, dtype=act_dtype, device=device),
            coef=coef, step=step,
        ) for i in range(num_layers)]
        return cls("mamba2", layers, cursor, arrive, act_dtype, L, state_shape, spec)

    @classmethod
    def gdn(cls, num_layers: int, slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
            buffer_len: int = 16, state_dtype: str | torch.dtype | StateSpec = "fp32",
            act_dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
            checkpoints: bool = True) -> "ReplayStateCache":
        """Cache for Gated DeltaNet layers (state [HV, V, K]; one key ring per key head)."""
        return cls._delta(GDNLayerCache, "gdn", num_layers, slots, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                          buffer_len, state_dtype, act_dtype, device, checkpoints)

    @classmethod
    def kda(cls, num_layers: int, slots: int, num_heads: int, head_dim: int, buffer_len: int = 16,
            state_dtype: str | torch.dtype | StateSpec = "fp32", act_dtype: torch.dtype = torch.bfloat16,
            device: torch.device | str = "cuda", checkpoints: bool = True) -> "ReplayStateCache":
        """Cache for Kimi Delta Attention layers (per-channel gate ring)."""
        return cls._delta(KDALayerCache, "kda", num_layers, slots, num_heads, num_heads, head_dim, head_dim,
                          buffer_len, state_dtype, act_dtype, device, checkpoints)

    @classmethod
    def _delta(cls, layer_cls: type[GDNLayerCache], family: str, num_layers: int, slots: int, num_k_heads: int,
               num_v_heads: int, head_k_dim: int, head_v_dim: int, buffer_len: int,
               state_dtype: str | torch.dtype | StateSpec,
               act_dtype: torch.dtype, device: torch.device | str, checkpoints: bool) -> "ReplayStateCache":
        _check_positive(num_layers=num_layers, slots=slots, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                        head_k_dim=head_k_dim, head_v_dim=head_v_dim)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_k_heads: must divide num_v_heads={num_v_heads}, got {num_k_heads}")
        L, spec = check_buffer_len(buffer_len), state_spec(state_dtype, arg="state_dtype")
        cursor, arrive = _cursors(num_layers, slots, device)
        kda = family == "kda"
        gate_shape = (slots, num_v_heads, L, head_k_dim) if kda else (slots, num_v_heads, L)
        key_heads = num_v_heads if kda else num_k_heads
        coef = torch.zeros(slots, num_v_heads, delta_record_len(L, head_k_dim, kda), dtype=torch.float32, device=device)
        step = torch.zeros(slots + 1, dtype=torch.int32, device=device)
        state_shape = (num_v_heads, head_v_dim, head_k_dim)
        layers = [layer_cls(
            **_checkpoint(spec, slots, state_shape, device, checkpoints, i),
            cursor=cursor[i], arrive=arrive[i],
            u_ring=torch.zeros(slots, num_v_heads, L, head_v_dim, dtype=act_dtype, device=device),
            k_ring=torch.zeros(slots, key_heads, L, head_k_dim, dtype=key_ring_dtype(act_dtype, kda), device=device),
            g_ring=torch.zeros(gate_shape, dtype=torch.float32, device=device),
            coef=coef, step=step,
        ) for i in range(num_layers)]
        return cls(family, layers, cursor, arrive, act_dtype, L, state_shape, spec)

    # ------------------------------------------------------------------ access
    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def slots(self) -> int:
        return self.cursor.shape[1]

    def layer(self, index: int) -> _LayerCache:
        if not 0 <= index < len(self._layers):
            raise IndexError(f"layer: expected an index in [0, {len(self._layers)}), got {index}")
        return self._layers[index]

    def with_checkpoint(self, index: int, state: torch.Tensor) -> _LayerCache:
        """Layer ``index`` with ``state`` as its checkpoint, for one call (a cheap host-side view; the rings are this
        cache's). ``state``: the master's data (dual mode; else the checkpoint's) in the cache's state dtype on its
        device: [slots, *state_shape], or for FP8/NVFP4 codes (their scales are this cache's) [slots, heads, rows,
        cols or cols / 2] (``checkpoint.codes_in_pool``). Slot and head dims of any stride (the kernels read them
        from the tensor; quantized codes: the slot dim only), the rest dense."""
        layer = self.layer(index)
        heads, rows, cols = self.state_shape
        expected = (self.slots, heads, rows, data_cols(self.spec.checkpoint_format, cols))
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != expected:
            got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(f"state: expected shape {expected}, got {got}")
        if state.dtype != self.state_dtype or state.device != self.cursor.device:
            raise ValueError(f"state: expected {self.state_dtype} on {self.cursor.device}, got {state.dtype} on "
                             f"{state.device}")
        return replace(layer, state=state)

    def bytes_per_slot(self) -> int:
        """Bytes one slot (sequence) occupies over all layers: checkpoints, rings, cursors, arrival counters and the
        per-step scratch shared by the layers."""
        layers = self._layers
        return sum(layer.nbytes_per_slot() for layer in layers) + (
            layers[0].nbytes_per_slot(include_shared=True) - layers[0].nbytes_per_slot())

    # ------------------------------------------------------------------ slot lifecycle
    def reset_slots(self, slot_ids: torch.Tensor | Sequence[int], layers: Sequence[int] | None = None) -> None:
        """Empty the rings of ``slot_ids`` (cursor <- 0) in all or the given layers; the checkpoint is kept.

        Use on slot reuse and after prefill wrote a fresh checkpoint. Stale ring entries are never read: every load
        is masked by the cursor.
        """
        ids = self._slot_ids(slot_ids)
        if layers is None:  # one write per tensor for all layers ([layers, slots])
            self.cursor.index_fill_(1, ids, 0)
            self.arrive.index_fill_(1, ids, 0)
            return
        for i in layers:  # every index valid before any write
            self.layer(i)
        for i in layers:
            self.cursor[i].index_fill_(0, ids, 0)
            self.arrive[i].index_fill_(0, ids, 0)

    def load_prefill_state(self, layer_index: int, slot_ids: torch.Tensor | Sequence[int],
                           states: torch.Tensor) -> None:
        """Prefill hand-off: write ``states`` ([n, *state_shape]) as the checkpoints of ``slot_ids``, reset cursors."""
        layer, ids = self.layer(layer_index), self._slot_ids(slot_ids)
        if layer.state is None:
            raise ValueError("load_prefill_state: this cache holds no checkpoints (built with checkpoints=False)")
        expected = (ids.numel(), *self.state_shape)
        if tuple(states.shape) != expected:
            raise ValueError(f"states: expected shape {expected}, got {tuple(states.shape)}")
        if layer.storage is None:
            layer.state.index_copy_(0, ids, states.to(device=layer.state.device, dtype=layer.state.dtype))
        else:  # encoded like a flush's write (quantized, dual, stochastic rounding)
            layer.checkpoint().store_(ids, states.to(device=layer.state.device, dtype=torch.float32))
        self.reset_slots(ids, layers=[layer_index])

    def _slot_ids(self, slot_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """``slot_ids`` as int64 on the cache's device: integers (no bool or float) in [0, slots), each once (checked
        for ids on the CPU; on CUDA an id outside the pool fails in the index kernel)."""
        if isinstance(slot_ids, torch.Tensor):
            if slot_ids.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"slot_ids: expected an int32 or int64 tensor, got {slot_ids.dtype}")
        elif any(isinstance(i, bool) or not isinstance(i, int) for i in slot_ids):
            raise TypeError(f"slot_ids: expected ints, got {list(slot_ids)!r}")
        ids = torch.as_tensor(slot_ids, dtype=torch.long, device=self.cursor.device).reshape(-1)
        if not ids.is_cuda:
            check_slot_values("slot_ids", ids, self.slots)
        return ids


def _checkpoint(spec: StateSpec, slots: int, shape: tuple[int, int, int], device: torch.device | str,
                checkpoints: bool, seed: int) -> dict[str, torch.Tensor | Checkpoint | None]:
    """``state`` and ``storage`` of one layer: the plain pool alone, or the storage of a quantized / dual / stochastically
    rounded spec with its master data as ``state``. ``checkpoints=False`` leaves out the plain pool or the master's
    data (someone else's tensor, bound per call; a quantized master's scales stay in ``storage``)."""
    fmt = spec.checkpoint_format
    if not spec.stored:
        return {"state": torch.zeros(slots, *shape, dtype=fmt.storage_dtype, device=device) if checkpoints else None}
    storage = Checkpoint.allocate(spec, slots, shape, device, seed=seed, master_slots=slots if checkpoints else 0)
    return {"state": storage.master.data if checkpoints else None, "storage": storage}


def _storage_tensors(storage: Checkpoint) -> dict[str, torch.Tensor]:
    """The tensors of a layer's storage besides the master data (which is the layer's ``state``)."""
    out = {f"state_{name}": t for name, t in storage.master.tensors().items() if name != "data"}
    if storage.read is not None:
        out.update({f"read_{name}": t for name, t in storage.read.tensors().items()})
    if storage.flushes is not None:
        out["flushes"] = storage.flushes
    return out


def _cursors(num_layers: int, slots: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(num_layers, slots, dtype=torch.int32, device=device),
            torch.zeros(num_layers, slots, dtype=torch.int32, device=device))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
