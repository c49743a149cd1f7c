"""Memory plan of ReplaySSM decode for a ModelSpec on one GPU target, and its predicted step bytes.

Per SSM layer and sequence (TP-local): the checkpoint storage of the layer's StateSpec, rings of L records, the
per-slot int32 cursor and arrival counter, and upstream's conv state; bytes per decode step from core/byte_model.py.
With speculative decoding (N draft tokens, windows of T = N + 1) each ring has L + N + 1 positions
(serving/speculative.py derives the size from the verify's fold rule).

Served by TensorRT-LLM, the SSM state pool is upstream's, allocated in ``mamba_ssm_cache_dtype`` (fp32/fp16/bf16):
it holds our plain checkpoint, the master of a dual-mode layer (fp32/fp16/bf16 master), or the codes of an FP8/NVFP4
checkpoint or FP8 master in a bf16 pool (the smallest upstream allocates; the codes fill the first half or quarter of
each slot's bytes). Scales and a dual read copy live in our cache.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from trtllm_replayssm.core import byte_model
from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.formats import STATE_FORMATS, StateSpec, get_dtype, state_spec
from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.core.targets import GPU_MEMORY_GIB, resolve_gpu
from trtllm_replayssm.serving.presets import ModelSpec
from trtllm_replayssm.serving.speculative import check_spec_tokens, ring_len

GIB = 1 << 30
CURSOR_BYTES_PER_SLOT = 8  # int32 cursor + int32 arrival counter
FLUSH_COUNTER_BYTES = 4  # stochastic rounding: an int32 flush count per slot keys the random stream (checkpoint.py)
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


CODES_POOL_DTYPE = "bf16"  # TensorRT-LLM's pool under FP8/NVFP4 codes: the smallest it allocates, bf16's range


def pool_holds(state: StateSpec) -> str:
    """What TensorRT-LLM's SSM state pool holds of ``state``: ``checkpoint`` (plain), ``master`` (dual with an
    fp32/fp16/bf16 master) or ``codes`` (of an FP8/NVFP4 checkpoint or an FP8 master, whose scales are ours)."""
    if not state.quantized:
        return "checkpoint"
    return "codes" if state.checkpoint_format.quantized else "master"


def pool_dtype(state: StateSpec) -> str:
    """TensorRT-LLM's ``mamba_ssm_cache_dtype`` under ``state``: the format of the checkpoint or master it holds,
    bf16 under codes."""
    return CODES_POOL_DTYPE if pool_holds(state) == "codes" else state.checkpoint_format.name


def trtllm_note(state: StateSpec) -> str | None:
    """How TensorRT-LLM's pool holds ``state`` when it holds codes, or None."""
    if pool_holds(state) != "codes":
        return None
    fmt = state.checkpoint_format
    share = fmt.elem_bits / STATE_FORMATS[CODES_POOL_DTYPE].elem_bits
    return (f"TensorRT-LLM's SSM pool ({CODES_POOL_DTYPE}, the smallest it allocates) holds the {fmt.name} codes in "
            f"the first {share:.0%} of each slot's bytes, our cache their scales"
            + (f" and the {state.format} read copy" if state.dual else "")
            + "; around upstream's prefills the module writes the slots' values there and encodes what upstream "
              "wrote")


@dataclass(frozen=True)
class LayerBytes:
    """Memory of one SSM layer for one sequence slot on one rank (core/byte_model.py), and the local head counts.

    ``checkpoint``: our checkpoint storage (master plus read copy in dual mode, the flush count with stochastic
    rounding). Served by TensorRT-LLM:
    ``upstream_state`` is its pool entry (``mamba_ssm_cache_dtype``) and ``our_state`` the state in our cache.
    """

    local_heads: dict[str, int]
    checkpoint: int
    upstream_state: int
    our_state: int
    ring: int
    record: int
    cursors: int
    conv: int

    @property
    def ours(self) -> int:
        """Bytes per slot in our cache: rings, cursors and our state."""
        return self.ring + self.cursors + self.our_state

    @property
    def replay_total(self) -> int:
        return self.upstream_state + self.ours + self.conv

    @property
    def upstream_total(self) -> int:
        return self.upstream_state + self.conv


def layer_bytes(spec: ModelSpec, tp_size: int, buffer_len: int, state: byte_model.StateLike | None = None,
                act_dtype: str = "bf16", spec_tokens: int | None = None) -> LayerBytes:
    """Per-slot bytes of one SSM layer of ``spec`` on one TP rank; ``state``: a StateSpec or a format name (default:
    the model's plain state dtype); ``spec_tokens``: draft tokens per verify step (rings of L + N + 1 records)."""
    dims = local_dims(spec, tp_size)
    L = check_buffer_len(buffer_len)
    st = state_spec(spec.ssm_state_dtype if state is None else state)
    record = byte_model.record_bytes(dims, act_dtype)
    conv = (dims.conv_kernel - 1) * dims.conv_dim * get_dtype(act_dtype, "act_dtype").bytes
    checkpoint = byte_model.state_bytes(dims, st) + (FLUSH_COUNTER_BYTES if st.stochastic_rounding else 0)
    upstream = byte_model.format_bytes(dims, STATE_FORMATS[pool_dtype(st)])
    ours = checkpoint - (byte_model.codes_bytes(dims, st.checkpoint_format) if pool_holds(st) == "codes" else upstream)
    return LayerBytes({name: getattr(dims, name) for name in dims.head_fields}, checkpoint, upstream, ours,
                      record * ring_len(L, spec_tokens), record, CURSOR_BYTES_PER_SLOT, conv)


def local_dims(spec: ModelSpec, tp_size: int) -> SSMDims:
    """One TP rank's SSM dims of ``spec`` (check_tp first)."""
    check_tp(spec, tp_size)
    return spec.ssm_dims.local(tp_size)


@dataclass(frozen=True)
class MemoryPlan:
    """Memory plan of a model on one GPU: per-sequence bytes, capacity vs upstream, YAML memory fraction.

    ``spec_tokens``: draft tokens per verify step (None: no speculative decoding); ``ring_len``: ring positions per
    slot (L + N + 1). ``ring_bytes_per_gpu``: rings and cursors of ``max_batch_size + 1`` slots;
    ``reserve_bytes_per_gpu``: all of our cache for them (plus our state). ``pool_dtype`` / ``pool_holds``:
    TensorRT-LLM's SSM state pool (see :func:`pool_holds`); ``trtllm_note``: how the pool holds codes, when it does.
    """

    model: str
    gpu: str
    tp_size: int
    buffer_len: int
    spec_tokens: int | None
    ring_len: int
    state: StateSpec
    pool_dtype: str
    pool_holds: str
    trtllm_note: str | None
    act_dtype: str
    num_ssm_layers: int
    layer: LayerBytes
    per_seq_replay: int
    per_seq_upstream: int
    max_batch_size: int
    ring_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    gpu_memory_bytes: int
    max_seqs_replay: int
    max_seqs_upstream: int
    free_gpu_memory_fraction: float
    step: byte_model.StepBytes

    def to_dict(self) -> dict:
        out = asdict(self)
        out["step"]["speedup"] = self.step.speedup
        return out


def plan(spec: ModelSpec, gpu: str, *, tp_size: int = 1, buffer_len: int = 16,
         state: byte_model.StateLike | None = None, act_dtype: str = "bf16", max_batch_size: int = 256,
         gpu_memory_gib: float | None = None, spec_tokens: int | None = None) -> MemoryPlan:
    """Memory plan of ``spec`` on ``gpu`` (a GPU name or an SM arch, see targets.resolve_gpu) with ``state`` (a
    StateSpec or a format name; default: the model's plain state dtype).

    ``max_seqs_*`` is how many sequences' recurrent state (and, for replay, our cache) fit in the whole GPU memory
    budget: an upper bound that excludes weights, KV cache and activations, comparable between replay and upstream
    (TensorRT-LLM with the same pool dtype and its own kernels). ``free_gpu_memory_fraction`` lowers TensorRT-LLM's
    default 0.9 so that our cache for ``max_batch_size + 1`` slots (the +1 is the CUDA-graph padding dummy slot)
    stays free, assuming at least MIN_FREE_SHARE of the GPU is free when TensorRT-LLM sizes its caches.
    ``spec_tokens`` (N, 1..7): rings for verify windows of N + 1 tokens; the step prediction stays standard decode's.
    """
    key, _arch = resolve_gpu(gpu)
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size: expected a positive integer, got {max_batch_size!r}")
    mem_gib = GPU_MEMORY_GIB[key] if gpu_memory_gib is None else gpu_memory_gib
    if isinstance(mem_gib, bool) or not isinstance(mem_gib, (int, float)) or not mem_gib > 0:
        raise ValueError(f"gpu_memory_gib: expected a positive number, got {gpu_memory_gib!r}")
    st = state_spec(spec.ssm_state_dtype if state is None else state)
    act_dtype = get_dtype(act_dtype, "act_dtype").name
    spec_tokens = check_spec_tokens(spec_tokens)
    lb = layer_bytes(spec, tp_size, buffer_len, st, act_dtype, spec_tokens)
    n = len(spec.ssm_layers)
    per_replay, per_up = n * lb.replay_total, n * lb.upstream_total
    mem = int(mem_gib * GIB)
    slots = max_batch_size + 1
    reserve = n * lb.ours * slots
    fraction = UPSTREAM_FREE_FRACTION - reserve / (MIN_FREE_SHARE * mem)
    if fraction < 0.05:
        raise ValueError(f"max_batch_size: our cache (rings{', state' if lb.our_state else ''}) of {max_batch_size} "
                         f"sequences needs {reserve / GIB:.1f} GiB, too much of {mem_gib:.1f} GiB; lower "
                         f"max_batch_size or buffer_len")
    return MemoryPlan(
        model=spec.name, gpu=key, tp_size=tp_size, buffer_len=buffer_len, spec_tokens=spec_tokens,
        ring_len=ring_len(buffer_len, spec_tokens), state=st,
        pool_dtype=pool_dtype(st), pool_holds=pool_holds(st), trtllm_note=trtllm_note(st), act_dtype=act_dtype,
        num_ssm_layers=n, layer=lb,
        per_seq_replay=per_replay, per_seq_upstream=per_up, max_batch_size=max_batch_size,
        ring_bytes_per_gpu=n * (lb.ring + lb.cursors) * slots, reserve_bytes_per_gpu=reserve,
        gpu_memory_bytes=mem, max_seqs_replay=mem // per_replay, max_seqs_upstream=mem // per_up,
        free_gpu_memory_fraction=round(fraction, 3),
        step=byte_model.step_bytes(local_dims(spec, tp_size), st, act_dtype, buffer_len),
    )
