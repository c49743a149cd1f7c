"""Memory plan and byte model of ReplaySSM decode for a ModelSpec on one GPU target.

Per SSM layer and sequence (TP-local): checkpoint in the state dtype, rings of L records (values and keys in the
activation dtype, gates fp32), and the per-slot int32 cursor and arrival counter. The byte model per decode step
(algorithm.md 4.6/5.4, peers.md 1.1): baseline reads and writes the state, ``2|S| + io``; replay reads the checkpoint
every step, writes it once per L steps, reads on average (L-1)/2 ring records and appends (L-1)/L records:
``|S|(1 + 1/L) + ring_read + append + io``. With L = 1 both are equal.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from trtllm_replayssm.core.jit.configs import dtype_from_name
from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.serving.presets import GDNDims, KDADims, Mamba2Dims, ModelSpec
from trtllm_replayssm.core.reference.gdn import key_ring_dtype
from trtllm_replayssm.core.targets import GPU_MEMORY_GIB, resolve_gpu

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
GIB = 1 << 30
CURSOR_BYTES_PER_SLOT = 8  # int32 cursor + int32 arrival counter
UPSTREAM_FREE_FRACTION = 0.9  # TensorRT-LLM's default kv_cache_config.free_gpu_memory_fraction
MIN_FREE_SHARE = 0.5  # assumed share of GPU memory still free when TensorRT-LLM sizes its caches


def dtype_bytes(name: str, arg: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"{arg}: expected one of {sorted(DTYPE_BYTES)}, got {name!r}") from None


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
    """Bytes of one SSM layer for one sequence slot on one rank, and the local head counts they come from."""

    local_heads: dict[str, int]
    checkpoint: int
    ring: int
    record: int
    cursors: int
    conv: int
    io_per_step: int

    @property
    def replay_total(self) -> int:
        return self.checkpoint + self.ring + self.cursors + self.conv

    @property
    def upstream_total(self) -> int:
        return self.checkpoint + self.conv


def layer_bytes(spec: ModelSpec, tp_size: int, buffer_len: int, state_dtype: str, act_dtype: str = "bf16"
                ) -> LayerBytes:
    """Per-slot bytes of one SSM layer of ``spec`` on one TP rank."""
    check_tp(spec, tp_size)
    check_buffer_len(buffer_len)
    sb, ab, L = dtype_bytes(state_dtype, "state_dtype"), dtype_bytes(act_dtype, "act_dtype"), buffer_len
    d = spec.ssm_dims
    if isinstance(d, Mamba2Dims):
        h, g = d.nheads // tp_size, d.n_groups // tp_size
        heads = {"nheads": h, "n_groups": g}
        ckpt = h * d.head_dim * d.d_state * sb
        record = h * d.head_dim * ab + g * d.d_state * ab + h * 4
        # x, z, out [H,P]; B, C [G,N]; dt [H]
        io = 3 * h * d.head_dim * ab + 2 * g * d.d_state * ab + h * ab
    elif isinstance(d, GDNDims):
        hk, hv = d.num_k_heads // tp_size, d.num_v_heads // tp_size
        heads = {"num_k_heads": hk, "num_v_heads": hv}
        ckpt = hv * d.head_v_dim * d.head_k_dim * sb
        record = hv * d.head_v_dim * ab + hk * d.head_k_dim * ab + hv * 4
        # q, k [H,K]; v, out [HV,V]; a, b [HV]
        io = 2 * hk * d.head_k_dim * ab + 2 * hv * d.head_v_dim * ab + 2 * hv * ab
    elif isinstance(d, KDADims):
        h = d.num_heads // tp_size
        heads = {"num_heads": h}
        ckpt = h * d.head_dim * d.head_dim * sb
        kb = key_ring_dtype(dtype_from_name(act_dtype, "act_dtype"), predecayed_keys=True).itemsize
        record = h * d.head_dim * ab + h * d.head_dim * kb + h * d.head_dim * 4
        # q, k, v, out, per-channel gate [H,K]; beta [H]
        io = 5 * h * d.head_dim * ab + h * ab
    else:  # pragma: no cover - ModelSpec guarantees one of the three
        raise TypeError(f"spec.ssm_dims: unexpected {type(d).__name__}")
    conv = (d.conv_kernel - 1) * (d.conv_dim // tp_size) * ab
    return LayerBytes(heads, ckpt, record * L, record, CURSOR_BYTES_PER_SLOT, conv, io)


@dataclass(frozen=True)
class BytePrediction:
    """Amortized HBM bytes per decode step of one SSM layer and one sequence."""

    baseline: float
    replay: float

    @property
    def speedup(self) -> float:
        return self.baseline / self.replay


def predict_step_bytes(lb: LayerBytes, buffer_len: int) -> BytePrediction:
    """Byte model: baseline ``2|S| + io``; replay ``|S|(1+1/L) + (L-1)/2 records read + (L-1)/L appended + io``."""
    check_buffer_len(buffer_len)
    L, s = buffer_len, lb.checkpoint
    ring_read = (L - 1) / 2 * lb.record
    append = (L - 1) / L * lb.record
    return BytePrediction(baseline=2 * s + lb.io_per_step, replay=s * (1 + 1 / L) + ring_read + append + lb.io_per_step)


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
    step: BytePrediction

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
    state_dtype = state_dtype or spec.ssm_state_dtype
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
        free_gpu_memory_fraction=round(fraction, 3), step=predict_step_bytes(lb, buffer_len),
    )
