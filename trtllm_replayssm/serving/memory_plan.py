"""Memory plan of ReplaySSM decode for a ModelSpec on one GPU target, and its predicted step bytes.

Per SSM layer and sequence (TP-local): the checkpoint in the state dtype, rings of L records, the per-slot int32
cursor and arrival counter, and upstream's conv state; bytes per decode step from core/byte_model.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from trtllm_replayssm.core import byte_model
from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.formats import DTYPE_NAMES, get_dtype, get_state_format
from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.core.targets import GPU_MEMORY_GIB, resolve_gpu
from trtllm_replayssm.serving.presets import ModelSpec

GIB = 1 << 30
CURSOR_BYTES_PER_SLOT = 8  # int32 cursor + int32 arrival counter
UPSTREAM_FREE_FRACTION = 0.9  # TensorRT-LLM's default kv_cache_config.free_gpu_memory_fraction
MIN_FREE_SHARE = 0.5  # assumed share of GPU memory still free when TensorRT-LLM sizes its caches


def check_tp(spec: ModelSpec, tp_size: int) -> None:
    """ValueError unless ``tp_size`` is a positive integer dividing every head/group count of ``spec``."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size: expected a positive integer, got {tp_size!r}")
    # KV heads may also be replicated when TP exceeds them (TP a multiple of the KV-head count).
    bad = {k: v for k, v in spec.tp_divisors().items()
           if v % tp_size and not (k == "num_key_value_heads" and tp_size % v == 0)}
    if bad:
        detail = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise ValueError(f"tp_size: {tp_size} does not divide {detail} of {spec.name}")


@dataclass(frozen=True)
class LayerBytes:
    """Memory of one SSM layer for one sequence slot on one rank (core/byte_model.py), and the local head counts."""

    local_heads: dict[str, int]
    checkpoint: int
    ring: int
    record: int
    cursors: int
    conv: int

    @property
    def replay_total(self) -> int:
        return self.checkpoint + self.ring + self.cursors + self.conv

    @property
    def upstream_total(self) -> int:
        return self.checkpoint + self.conv


def layer_bytes(spec: ModelSpec, tp_size: int, buffer_len: int, state_dtype: str, act_dtype: str = "bf16"
                ) -> LayerBytes:
    """Per-slot bytes of one SSM layer of ``spec`` on one TP rank."""
    dims = local_dims(spec, tp_size)
    L = check_buffer_len(buffer_len)
    record = byte_model.record_bytes(dims, act_dtype)
    conv = (dims.conv_kernel - 1) * dims.conv_dim * get_dtype(act_dtype, "act_dtype").bytes
    return LayerBytes({name: getattr(dims, name) for name in dims.head_fields},
                      int(byte_model.state_bytes(dims, state_dtype)), record * L, record, CURSOR_BYTES_PER_SLOT, conv)


def local_dims(spec: ModelSpec, tp_size: int) -> SSMDims:
    """One TP rank's SSM dims of ``spec`` (check_tp first)."""
    check_tp(spec, tp_size)
    return spec.ssm_dims.local(tp_size)


@dataclass(frozen=True)
class MemoryPlan:
    """Memory plan of a model on one GPU: per-sequence bytes, capacity vs upstream, YAML memory fraction."""

    model: str
    gpu: str
    tp_size: int
    buffer_len: int
    state_dtype: str
    act_dtype: str
    num_ssm_layers: int
    layer: LayerBytes
    per_seq_replay: int
    per_seq_upstream: int
    max_batch_size: int
    ring_bytes_per_gpu: int
    gpu_memory_bytes: int
    max_seqs_replay: int
    max_seqs_upstream: int
    free_gpu_memory_fraction: float
    step: byte_model.StepBytes

    def to_dict(self) -> dict:
        out = asdict(self)
        out["step"]["speedup"] = self.step.speedup
        return out


def plan(spec: ModelSpec, gpu: str, *, tp_size: int = 1, buffer_len: int = 16, state_dtype: str | None = None,
         act_dtype: str = "bf16", max_batch_size: int = 256, gpu_memory_gib: float | None = None) -> MemoryPlan:
    """Memory plan of ``spec`` on ``gpu`` (a GPU name or an SM arch, see targets.resolve_gpu).

    ``max_seqs_*`` is how many sequences' recurrent state (and, for replay, rings) fit in the whole GPU memory
    budget: an upper bound that excludes weights, KV cache and activations, comparable between replay and upstream.
    ``free_gpu_memory_fraction`` lowers TensorRT-LLM's default 0.9 so that the rings of ``max_batch_size + 1``
    slots (the +1 is the CUDA-graph padding dummy slot) stay free, assuming at least MIN_FREE_SHARE of the GPU is
    free when TensorRT-LLM sizes its caches.
    """
    key, _arch = resolve_gpu(gpu)
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size: expected a positive integer, got {max_batch_size!r}")
    mem_gib = GPU_MEMORY_GIB[key] if gpu_memory_gib is None else gpu_memory_gib
    if isinstance(mem_gib, bool) or not isinstance(mem_gib, (int, float)) or not mem_gib > 0:
        raise ValueError(f"gpu_memory_gib: expected a positive number, got {gpu_memory_gib!r}")
    fmt = get_state_format(state_dtype or spec.ssm_state_dtype)
    if not fmt.implemented:
        raise ValueError(f"state_dtype: {fmt.name} state is planned, not implemented; expected one of "
                         f"{', '.join(DTYPE_NAMES)}")
    state_dtype, act_dtype = fmt.name, get_dtype(act_dtype, "act_dtype").name
    lb = layer_bytes(spec, tp_size, buffer_len, state_dtype, act_dtype)
    n = len(spec.ssm_layers)
    per_replay, per_up = n * lb.replay_total, n * lb.upstream_total
    mem = int(mem_gib * GIB)
    ring_gpu = n * (lb.ring + lb.cursors) * (max_batch_size + 1)
    fraction = UPSTREAM_FREE_FRACTION - ring_gpu / (MIN_FREE_SHARE * mem)
    if fraction < 0.05:
        raise ValueError(f"max_batch_size: rings of {max_batch_size} sequences need {ring_gpu / GIB:.1f} GiB, "
                         f"too much of {mem_gib:.1f} GiB; lower max_batch_size or buffer_len")
    return MemoryPlan(
        model=spec.name, gpu=key, tp_size=tp_size, buffer_len=buffer_len, state_dtype=state_dtype,
        act_dtype=act_dtype, num_ssm_layers=n, layer=lb, per_seq_replay=per_replay, per_seq_upstream=per_up,
        max_batch_size=max_batch_size, ring_bytes_per_gpu=ring_gpu, gpu_memory_bytes=mem,
        max_seqs_replay=mem // per_replay, max_seqs_upstream=mem // per_up,
        free_gpu_memory_fraction=round(fraction, 3),
        step=byte_model.step_bytes(local_dims(spec, tp_size), state_dtype, act_dtype, buffer_len),
    )
