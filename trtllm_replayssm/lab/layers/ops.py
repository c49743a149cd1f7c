"""Fused decoder layers of the reference hybrid decoders as custom ops (``torch.ops.replayssm.*``): RMSNorm (with
the residual add), gated RMSNorm, the causal conv1d's speculative window (verify, commit; its decode step:
:mod:`trtllm_replayssm.core.ops.conv`), the MLP activations, RoPE and attention of one token or a speculative window
over a static KV cache. One CUDA launch each (plugins/decoder_layers.cu) instead of PyTorch's chains of elementwise kernels; the CPU path is the PyTorch reference
(:mod:`trtllm_replayssm.lab.layers.reference`). Shared by the baseline and the replay decoders alike."""
from __future__ import annotations

from typing import Optional

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.formats import DTYPES, get_dtype
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.jit.loader import get_kernel, launch
from trtllm_replayssm.core.layouts import ParamLayout
from trtllm_replayssm.core.limits import MAX_WINDOW
from trtllm_replayssm.core.ops.conv import MAX_CONV_WIDTH, VEC_CONV_WIDTH
from trtllm_replayssm.core.ops.launch import define_op, ptr, vector_elems, vectorizable
from trtllm_replayssm.lab.layers import reference as ref


# The parameter structs of plugins/decoder_layers.cu (the kernels include the C++ generated from these).
RMSNORM_PARAMS = ParamLayout("RmsNormParams", """
  const act_t* x;       // [outer, inner, dim]
  act_t* residual;      // nullable, [rows, dim] contiguous: residual += x in place, then the norm of the sum
  const act_t* weight;  // [dim]
  act_t* out;           // [outer, inner, dim]
  long long s_x_outer, s_x_inner, s_out_outer, s_out_inner;
  int inner, dim;
  float eps;
  int unit_offset;      // scale by (1 + weight)
  int vec, pad0;        // vec: dim, strides and pointers allow 16-byte vectors and dim <= kMaxRowVecs vectors/thread""")
GATED_NORM_PARAMS = ParamLayout("GatedNormParams", """
  const act_t* x;       // [rows, groups * group_size] (row stride s_x)
  const act_t* z;       // [rows, groups * group_size] (row stride s_z)
  const act_t* weight;  // [weight_len], repeated along the row (weight_len: a multiple of group_size dividing it)
  act_t* out;           // [rows, groups * group_size] (row stride s_out)
  long long s_x, s_z, s_out;
  int group_size, groups, weight_len;
  float eps;
  int norm_before_gate;  // 0: norm(x * silu(z)) * w (Mamba-2); 1: norm(x) * w * silu(z) (Qwen3.5 GDN)
  int vec;               // vec: as in RmsNormParams, for group_size
  int warp_groups;       // > 0 (vec only): a warp per group, warp_groups groups per CTA; 0: a CTA per group
  int pad0;""")
CONV_WINDOW_PARAMS = ParamLayout("ConvWindowParams", """
  const act_t* x;                // [batch, window, channels] (strides s_x_b, s_x_t; channels dense): the inputs
  act_t* conv_state;             // [batch, channels, width - 1] contiguous: the committed inputs, oldest first
  const act_t* weight;           // [channels, width] contiguous
  const act_t* bias;             // nullable, [channels]
  act_t* out;                    // verify: [batch, window, channels] contiguous; null for a commit
  const long long* accepted;     // commit: [batch] accepted counts (1 .. window); null for a verify
  long long s_x_b, s_x_t;
  int channels, width, window, silu;
  int vec, pad0;                 // vec: width 4 and 16-byte vectors of kVec channels (as ConvParams.vec)""")
ACT_PARAMS = ParamLayout("ActParams", """
  const act_t* a;  // [rows, cols] (row stride s_a): the activation's input (SwiGLU: the gate projection)
  const act_t* b;  // [rows, cols] (row stride s_b): SwiGLU's up projection (kind 1), else null
  act_t* out;      // [rows, cols] contiguous
  long long s_a, s_b;
  int rows, cols;  // vec: cols counts 16-byte vectors and the strides are in vectors
  int kind;        // 0: relu(a)^2; 1: silu(a) * b
  int vec;""")
ROPE_PARAMS = ParamLayout("RopeParams", """
  const act_t* x;          // [rows, heads, head_dim] (strides s_x_row, s_x_head; channels dense)
  const long long* pos;    // [rows] positions
  act_t* out;              // [rows, heads, head_dim] contiguous
  long long s_x_row, s_x_head;
  int heads, head_dim, rotary_dim;
  float theta;""")
ATTN_PARAMS = ParamLayout("AttnParams", """
  const act_t* q;        // [batch, tokens, heads, head_dim] (strides s_q_b, s_q_t, s_q_h)
  const act_t* k_new;    // [batch, tokens, kv_heads, head_dim] (strides s_k_b, s_k_t, s_k_h): the tokens' keys
  const act_t* v_new;    // [batch, tokens, kv_heads, head_dim] (strides s_v_b, s_v_t, s_v_h): the tokens' values
  const act_t* gate;     // nullable, as q (strides s_g_b, s_g_t, s_g_h): output gate, o * sigmoid(gate)
  act_t* k_cache;        // [batch, kv_heads, max_len, head_dim] contiguous
  act_t* v_cache;        // [batch, kv_heads, max_len, head_dim] contiguous
  const long long* pos;  // [batch]: cached tokens before the first one (token t goes to position pos + t)
  act_t* out;            // [batch, tokens, heads * head_dim] contiguous
  long long s_q_b, s_q_t, s_q_h, s_k_b, s_k_t, s_k_h, s_v_b, s_v_t, s_v_h, s_g_b, s_g_t, s_g_h;
  int heads, kv_heads, head_dim, max_len;
  float scale;
  int window;            // 0: positions 0..pos + t; W: the last W positions of a ring (position u in slot u % max_len)
  int tokens, pad0;      // 1: a decode step; T: a speculative window, token t attending up to position pos + t""")
LAYOUTS = (RMSNORM_PARAMS, GATED_NORM_PARAMS, CONV_WINDOW_PARAMS, ACT_PARAMS, ATTN_PARAMS,
           ROPE_PARAMS)


def layers_config(act_dtype: torch.dtype) -> KernelConfig:
    """The fused decoder-layer kernels of the reference decoders (RMSNorm, gated RMSNorm, conv1d speculative
    window, MLP activations, RoPE, attention of one token or a window) for one activation dtype."""
    return KernelConfig(
        family="layers",
        source="decoder_layers.cu",
        kernels=("rmsnorm_kernel", "gated_rmsnorm_kernel", "conv1d_window_kernel",
                 "mlp_act_kernel", "rope_kernel", "attention_decode_kernel"),
        params=(("act_t", get_dtype(act_dtype).cuda),),
        layouts=LAYOUTS,
    )


def layers_configs() -> list[KernelConfig]:
    """The module for every activation dtype (compiled on first use; the CI kernel gate compiles them all)."""
    return [layers_config(d.torch) for d in DTYPES]


# plugins/decoder_layers.cu: kBlock, kMaxRowVecs
MAX_THREADS = 256
WARPS_PER_CTA = MAX_THREADS // 32
MAX_ROW_VECS = 4
MLP_ACTS = ("relu2", "swiglu")
ATTN_MAX_SHARED = 48 * 1024  # the attention kernel's dynamic shared memory limit (no opt-in above the default)


def _kernel(name: str, t: torch.Tensor):
    return get_kernel(layers_config(t.dtype), name, t.device)


def _row_plan(cols: int, elems: int, vec: bool) -> tuple[int, bool]:
    """(threads per row, vector path) of a norm over ``cols`` channels: a vector (else about 4 channels) per
    thread, a multiple of a warp, at most MAX_THREADS; vectors only where a row fits MAX_ROW_VECS per thread."""
    if vec and cols % elems == 0:
        threads = max(32, min(MAX_THREADS, (cols // elems + 31) // 32 * 32))
        if cols // elems <= threads * MAX_ROW_VECS:
            return threads, True
    return max(32, min(MAX_THREADS, ((cols + 3) // 4 + 31) // 32 * 32)), False


def _rows3(t: torch.Tensor) -> torch.Tensor:
    """``t [..., D]`` (last dim dense) as ``[outer, inner, D]`` without a copy where its strides allow."""
    if t.dim() == 1:
        return t.view(1, 1, -1)
    if t.dim() == 2:
        return t.unsqueeze(1)
    return t if t.dim() == 3 else t.reshape(-1, t.shape[-2], t.shape[-1])


def _rows2(t: torch.Tensor) -> torch.Tensor:
    """``t [..., D]`` as ``[rows, D]`` (a copy only where no row stride exists)."""
    return t.reshape(-1, t.shape[-1])


# ---------------------------------------------------------------------------------------------------- custom ops
def _rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool, out: torch.Tensor) -> None:
    out.copy_(ref.rms_norm(x, weight, eps, unit_offset))


def _add_rms_norm_cpu(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool,
                     out: torch.Tensor) -> None:
    out.copy_(ref.add_rms_norm_(x, residual, weight, eps, unit_offset))


def _rms_norm_launch(x, residual, weight, eps, unit_offset, out) -> None:
    x3, o3 = _rows3(x), _rows3(out)
    rows, dim = x3.shape[0] * x3.shape[1], x3.shape[2]
    if rows == 0:
        return
    elems = vector_elems(x)
    strides = [x3.stride(0), x3.stride(1), o3.stride(0), o3.stride(1), dim]
    threads, vec = _row_plan(dim, elems, vectorizable(elems, [x3, residual, weight, o3], strides))
    params = RMSNORM_PARAMS.pack(x=ptr(x3), residual=ptr(residual), weight=ptr(weight), out=ptr(o3),
                                 s_x_outer=x3.stride(0), s_x_inner=x3.stride(1), s_out_outer=o3.stride(0),
                                 s_out_inner=o3.stride(1), inner=x3.shape[1], dim=dim, eps=float(eps),
                                 unit_offset=int(unit_offset), vec=int(vec), pad0=0)
    launch(_kernel("rmsnorm_kernel", x), (rows, 1, 1), (threads, 1, 1), params)


def _rms_norm_cuda(x, weight, eps, unit_offset, out) -> None:
    _rms_norm_launch(x, None, weight, eps, unit_offset, out)


def _add_rms_norm_cuda(x, residual, weight, eps, unit_offset, out) -> None:
    _rms_norm_launch(x, residual, weight, eps, unit_offset, out)


def _gated_rms_norm_cpu(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                       norm_before_gate: bool, out: torch.Tensor) -> None:
    out.copy_(ref.gated_rms_norm(x, z, weight, group_size, eps, norm_before_gate))


def _gated_rms_norm_cuda(x, z, weight, group_size, eps, norm_before_gate, out) -> None:
    x2, z2, o2 = _rows2(x), _rows2(z), _rows2(out)
    if x2.shape[0] == 0:
        return
    elems = vector_elems(x)
    strides = [x2.stride(0), z2.stride(0), o2.stride(0), group_size]
    threads, vec = _row_plan(group_size, elems, vectorizable(elems, [x2, z2, weight, o2], strides))
    groups = x2.shape[1] // group_size
    # a warp per group where a warp holds the group in registers (more loads in flight than a CTA per group)
    warp_groups = min(WARPS_PER_CTA, groups) if vec and group_size // elems <= 32 * MAX_ROW_VECS else 0
    if warp_groups:
        threads, grid_y = 32 * warp_groups, (groups + warp_groups - 1) // warp_groups
    else:
        grid_y = groups
    params = GATED_NORM_PARAMS.pack(x=ptr(x2), z=ptr(z2), weight=ptr(weight), out=ptr(o2), s_x=x2.stride(0),
                                    s_z=z2.stride(0), s_out=o2.stride(0), group_size=group_size, groups=groups,
                                    weight_len=weight.shape[0], eps=float(eps), norm_before_gate=int(norm_before_gate),
                                    vec=int(vec), warp_groups=warp_groups, pad0=0)
    launch(_kernel("gated_rmsnorm_kernel", x), (x2.shape[0], grid_y, 1), (threads, 1, 1), params)


def _conv1d_verify_cpu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      silu: bool, out: torch.Tensor) -> None:
    out.copy_(ref.conv1d_verify(x, conv_state, weight, bias, silu))


def _conv1d_commit_cpu(conv_state: torch.Tensor, x: torch.Tensor, accepted: torch.Tensor) -> None:
    ref.conv1d_commit_(conv_state, x, accepted)


def _conv1d_window_launch(x, conv_state, weight, bias, silu, out, accepted) -> None:
    batch, window, channels = x.shape
    if batch == 0:
        return
    width, elems = conv_state.shape[-1] + 1, vector_elems(x)
    vec = width == VEC_CONV_WIDTH and vectorizable(elems, [x, conv_state, weight, bias, out],
                                                   [x.stride(0), x.stride(1), channels])
    threads = channels // elems if vec else channels
    params = CONV_WINDOW_PARAMS.pack(x=ptr(x), conv_state=ptr(conv_state), weight=ptr(weight), bias=ptr(bias),
                                     out=ptr(out), accepted=ptr(accepted), s_x_b=x.stride(0), s_x_t=x.stride(1),
                                     channels=channels, width=width, window=window, silu=int(silu), vec=int(vec),
                                     pad0=0)
    block = MAX_THREADS // 2  # the vector path's registers: 3 such CTAs per SM, where 256 threads would fit once
    launch(_kernel("conv1d_window_kernel", x), ((threads + block - 1) // block, batch, 1), (block, 1, 1), params)


def _conv1d_verify_cuda(x, conv_state, weight, bias, silu, out) -> None:
    _conv1d_window_launch(x, conv_state, weight, bias, silu, out, None)


def _conv1d_commit_cuda(conv_state, x, accepted) -> None:
    _conv1d_window_launch(x, conv_state, None, None, False, None, accepted)


def _mlp_act_cpu(a: torch.Tensor, b: Optional[torch.Tensor], kind: str, out: torch.Tensor) -> None:
    out.copy_(ref.mlp_act(a, b, kind))


def _mlp_act_cuda(a, b, kind, out) -> None:
    a2, b2 = _rows2(a), None if b is None else _rows2(b)
    rows, cols = a2.shape
    if rows * cols == 0:
        return
    elems = vector_elems(a)
    s_a, s_b = a2.stride(0), 0 if b2 is None else b2.stride(0)
    vec = vectorizable(elems, [a2, b2, out], [s_a, s_b, cols])
    step = elems if vec else 1
    params = ACT_PARAMS.pack(a=ptr(a2), b=ptr(b2), out=ptr(out), s_a=s_a // step, s_b=s_b // step, rows=rows,
                             cols=cols // step, kind=MLP_ACTS.index(kind), vec=int(vec))
    blocks = min((rows * cols // step + MAX_THREADS - 1) // MAX_THREADS, 16 * 1024)
    launch(_kernel("mlp_act_kernel", a), (blocks, 1, 1), (MAX_THREADS, 1, 1), params)


def _rope_cpu(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, theta: float, out: torch.Tensor) -> None:
    out.copy_(ref.rope(x, pos, rotary_dim, theta))


def _rope_cuda(x, pos, rotary_dim, theta, out) -> None:
    x3 = x.reshape(-1, x.shape[-2], x.shape[-1])
    rows, heads, head_dim = x3.shape
    if rows == 0:
        return
    pos_rows = pos.expand(x.shape[:-2]).reshape(-1).contiguous()
    params = ROPE_PARAMS.pack(x=ptr(x3), pos=ptr(pos_rows), out=ptr(out), s_x_row=x3.stride(0),
                              s_x_head=x3.stride(1), heads=heads, head_dim=head_dim, rotary_dim=rotary_dim,
                              theta=float(theta))
    launch(_kernel("rope_kernel", x), (rows * heads, 1, 1), ((head_dim + 31) // 32 * 32, 1, 1), params)


def _attention_decode_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: Optional[torch.Tensor],
                         k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, scale: float, window: int,
                         out: torch.Tensor) -> None:
    out.copy_(ref.attention_decode_(q, k, v, gate, k_cache, v_cache, pos, scale, window))


def attention_shared_bytes(heads: int, kv_heads: int, head_dim: int, max_len: int, tokens: int = 1) -> int:
    """Dynamic shared memory of the attention kernel: a group's queries and scores of every token in fp32."""
    return 4 * tokens * (heads // kv_heads) * (head_dim + max_len)


def _attention_launchable(q: torch.Tensor, k_cache: torch.Tensor, tokens: int) -> bool:
    """Whether the attention kernel takes this shape: head_dim a multiple of 32 up to 256, a group's queries and
    scores of every token within ATTN_MAX_SHARED."""
    heads, hd = q.shape[-2:]
    kv_heads, max_len = k_cache.shape[1:3]
    shared = attention_shared_bytes(heads, kv_heads, hd, max_len, tokens)
    return hd % 32 == 0 and hd <= 256 and shared <= ATTN_MAX_SHARED


def _attention_launch(q, k, v, gate, k_cache, v_cache, pos, scale, window, out) -> None:
    """The attention kernel on ``q [b, T, heads, hd]`` and the tokens' ``k, v [b, T, kv_heads, hd]``."""
    b, T, heads, head_dim = q.shape
    _, kv_heads, max_len, _ = k_cache.shape
    g = [gate.stride(i) for i in range(3)] if gate is not None else [0, 0, 0]
    params = ATTN_PARAMS.pack(q=ptr(q), k_new=ptr(k), v_new=ptr(v), gate=ptr(gate), k_cache=ptr(k_cache),
                              v_cache=ptr(v_cache), pos=ptr(pos), out=ptr(out), s_q_b=q.stride(0), s_q_t=q.stride(1),
                              s_q_h=q.stride(2), s_k_b=k.stride(0), s_k_t=k.stride(1), s_k_h=k.stride(2),
                              s_v_b=v.stride(0), s_v_t=v.stride(1), s_v_h=v.stride(2), s_g_b=g[0], s_g_t=g[1],
                              s_g_h=g[2], heads=heads, kv_heads=kv_heads, head_dim=head_dim, max_len=max_len,
                              scale=float(scale), window=window, tokens=T, pad0=0)
    launch(_kernel("attention_decode_kernel", q), (kv_heads, b, 1), (128, 1, 1), params,
           shared_bytes=attention_shared_bytes(heads, kv_heads, head_dim, max_len, T))


def _attention_decode_cuda(q, k, v, gate, k_cache, v_cache, pos, scale, window, out) -> None:
    if q.shape[0] == 0:
        return
    if not _attention_launchable(q, k_cache, 1):  # what the kernel does not take
        out.copy_(ref.attention_decode_(q, k, v, gate, k_cache, v_cache, pos, scale, window))
        return
    _attention_launch(q[:, None], k[:, None], v[:, None], None if gate is None else gate[:, None], k_cache, v_cache,
                      pos, scale, window, out)


def _attention_verify_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: Optional[torch.Tensor],
                          k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, scale: float, window: int,
                          out: torch.Tensor) -> None:
    for t in range(q.shape[1]):
        out[:, t].copy_(ref.attention_decode_(q[:, t], k[:, t], v[:, t], None if gate is None else gate[:, t],
                                              k_cache, v_cache, pos + t, scale, window))


def _attention_verify_cuda(q, k, v, gate, k_cache, v_cache, pos, scale, window, out) -> None:
    if q.shape[0] == 0:
        return
    if _attention_launchable(q, k_cache, q.shape[1]):
        _attention_launch(q, k, v, gate, k_cache, v_cache, pos, scale, window, out)
        return
    token_out = torch.empty_like(out[:, 0])
    for t in range(q.shape[1]):  # the window's scores do not fit: a decode step per token
        _attention_decode_cuda(q[:, t], k[:, t], v[:, t], None if gate is None else gate[:, t], k_cache, v_cache,
                               pos + t, scale, window, token_out)
        out[:, t].copy_(token_out)


define_op("rms_norm", ("out",), _rms_norm_cpu, _rms_norm_cuda)
define_op("add_rms_norm", ("residual", "out"), _add_rms_norm_cpu, _add_rms_norm_cuda)
define_op("gated_rms_norm", ("out",), _gated_rms_norm_cpu, _gated_rms_norm_cuda)
define_op("conv1d_verify", ("out",), _conv1d_verify_cpu, _conv1d_verify_cuda)
define_op("conv1d_commit", ("conv_state",), _conv1d_commit_cpu, _conv1d_commit_cuda)
define_op("mlp_act", ("out",), _mlp_act_cpu, _mlp_act_cuda)
define_op("rope", ("out",), _rope_cpu, _rope_cuda)
define_op("attention_decode", ("k_cache", "v_cache", "out"), _attention_decode_cpu, _attention_decode_cuda)
define_op("attention_verify", ("k_cache", "v_cache", "out"), _attention_verify_cpu, _attention_verify_cuda)


# ---------------------------------------------------------------------------------------------------- public API
# The ops are inference-only: under autograd (grad mode on and an input that requires grad) the norms, activations and
# RoPE run their PyTorch reference (differentiable), which training uses (trtllm_replayssm/lab/train.py).
def _autograd(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x [..., D]`` (last dim dense) scaled by ``weight [D]`` (``1 + weight`` with ``unit_offset``).
    With ``residual`` (``x``'s shape, contiguous): ``residual += x`` in place first and the sum is normalised."""
    chk.check_tensor("x", x, (None,) * max(x.dim(), 1), chk.FLOAT_DTYPES)
    chk.check_tensor("weight", weight, (x.shape[-1],), (x.dtype,), x.device)
    if _autograd(x, weight, residual):
        if residual is not None:
            raise ValueError("residual: the in-place residual add is inference-only; add it out of place under "
                             "autograd")
        return ref.rms_norm(x, weight, eps, unit_offset)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        torch.ops.replayssm.rms_norm(x, weight, float(eps), bool(unit_offset), out)
        return out
    chk.check_tensor("residual", residual, tuple(x.shape), (x.dtype,), x.device, inner_contiguous=x.dim())
    torch.ops.replayssm.add_rms_norm(x, residual, weight, float(eps), bool(unit_offset), out)
    return out


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                   norm_before_gate: bool) -> torch.Tensor:
    """Gated RMSNorm over groups of ``group_size`` channels of ``x [..., D]`` with gate ``z`` (same shape; last dims
    dense): ``norm(x * silu(z)) * w`` or, ``norm_before_gate``, ``norm(x) * w * silu(z)``. ``weight [W]`` repeats
    along the row (``W`` a multiple of ``group_size`` dividing ``D``: ``D`` for per-channel weights, ``group_size``
    for one weight shared by all groups)."""
    chk.check_tensor("x", x, (None,) * max(x.dim(), 1), chk.FLOAT_DTYPES)
    chk.check_tensor("z", z, tuple(x.shape), (x.dtype,), x.device)
    D = x.shape[-1]
    if group_size < 1 or D % group_size:
        raise ValueError(f"group_size: expected a divisor of the last dim {D}, got {group_size}")
    chk.check_tensor("weight", weight, (None,), (x.dtype,), x.device)
    if weight.shape[0] % group_size or D % weight.shape[0]:
        raise ValueError(f"weight: expected a length that is a multiple of group_size={group_size} and divides {D}, "
                         f"got {weight.shape[0]}")
    if _autograd(x, z, weight):
        return ref.gated_rms_norm(x, z, weight, group_size, eps, norm_before_gate)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.replayssm.gated_rms_norm(x, z, weight, int(group_size), float(eps), bool(norm_before_gate), out)
    return out


def _check_conv_window(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor | None) -> None:
    chk.check_tensor("x", x, (None, None, None), chk.FLOAT_DTYPES, inner_contiguous=1)
    batch, window, channels = x.shape
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"x: expected a window of 1 to {MAX_WINDOW} tokens (dim 1), got {window}")
    width = conv_state.shape[-1] + 1 if conv_state.dim() == 3 else 0
    if not 2 <= width <= MAX_CONV_WIDTH:
        raise ValueError(f"conv_state: expected [batch, channels, width - 1] with a conv width in "
                         f"[2, {MAX_CONV_WIDTH}], got shape {list(conv_state.shape)}")
    chk.check_tensor("conv_state", conv_state, (batch, channels, width - 1), (x.dtype,), x.device, inner_contiguous=3)
    if weight is not None:
        chk.check_tensor("weight", weight, (channels, 1, width) if weight.dim() == 3 else (channels, width), (x.dtype,),
                         x.device, inner_contiguous=weight.dim())


def conv1d_verify(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  silu: bool = True) -> torch.Tensor:
    """A speculative window of a causal depthwise conv1d: ``x [b, T, C]`` (channels dense), ``conv_state
    [b, C, W-1]`` (contiguous, not written), ``weight [C, 1, W]`` or ``[C, W]`` (contiguous), ``bias [C]``; returns
    ``[b, T, C]``: token t's conv over the committed inputs and the window up to t, as :func:`~trtllm_replayssm.core.ops.conv.conv1d_update` would
    give it (+ bias, rounded to ``x.dtype``, then SiLU if ``silu``)."""
    _check_conv_window(x, conv_state, weight)
    chk.check_optional("bias", bias, (x.shape[2],), (x.dtype,), x.device)
    if _autograd(x, weight):
        return ref.conv1d_verify(x, conv_state, weight, bias, silu)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.replayssm.conv1d_verify(x, conv_state, weight, bias, bool(silu), out)
    return out


def conv1d_commit_(conv_state: torch.Tensor, x: torch.Tensor, accepted: torch.Tensor) -> None:
    """After :func:`conv1d_verify` of ``x [b, T, C]``: each row's ``conv_state [b, C, W-1]`` becomes its last W-1
    inputs up to its accepted count (``accepted [b]``, 1 .. T), in place. The counts are checked outside CUDA graph
    capture (the check reads them on the host); on CUDA a row with another count keeps its state."""
    _check_conv_window(x, conv_state, None)
    chk.check_tensor("accepted", accepted, (x.shape[0],), (torch.int64,), x.device)
    if not chk.capturing() and ((accepted < 1) | (accepted > x.shape[1])).any():
        raise ValueError(f"accepted: expected 1..{x.shape[1]} per row, got {accepted.tolist()}")
    torch.ops.replayssm.conv1d_commit(conv_state, x, accepted)


def mlp_act(a: torch.Tensor, b: torch.Tensor | None, kind: str) -> torch.Tensor:
    """MLP activation of ``a [..., I]`` (last dim dense): ``relu2`` (``relu(a)^2``, ``b`` None) or ``swiglu``
    (``silu(a) * b``, ``b`` of ``a``'s shape, e.g. the two halves of one packed gate/up projection)."""
    if kind not in MLP_ACTS:
        raise ValueError(f"kind: expected one of {MLP_ACTS}, got {kind!r}")
    chk.check_tensor("a", a, (None,) * max(a.dim(), 1), chk.FLOAT_DTYPES)
    if (kind == "swiglu") != (b is not None):
        raise ValueError(f"b: expected {'a tensor' if kind == 'swiglu' else 'None'} for kind={kind!r}")
    chk.check_optional("b", b, tuple(a.shape), (a.dtype,), a.device)
    if _autograd(a, b):
        return ref.mlp_act(a, b, kind)
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    torch.ops.replayssm.mlp_act(a, b, kind, out)
    return out


def rope(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on the first ``rotary_dim`` channels of ``x [..., heads, head_dim]`` (last dim dense) at
    positions ``pos`` (int64, broadcast to ``x.shape[:-2]``); the other channels are copied. Returns a new tensor."""
    chk.check_tensor("x", x, (None,) * max(x.dim(), 2), chk.FLOAT_DTYPES)
    head_dim = x.shape[-1]
    if rotary_dim % 2 or not 0 <= rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim: expected an even number in [0, {head_dim}], got {rotary_dim}")
    if head_dim > MAX_THREADS:
        raise ValueError(f"x: head_dim (last dim) must be at most {MAX_THREADS}, got {head_dim}")
    if not isinstance(pos, torch.Tensor) or pos.dtype != torch.int64 or pos.device != x.device:
        raise TypeError(f"pos: expected an int64 tensor on {x.device}")
    try:
        torch.broadcast_shapes(pos.shape, x.shape[:-2])
    except RuntimeError:
        raise ValueError(f"pos: shape {list(pos.shape)} does not broadcast to {list(x.shape[:-2])}") from None
    if _autograd(x):
        return ref.rope(x, pos, rotary_dim, theta)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.replayssm.rope(x, pos, int(rotary_dim), float(theta), out)
    return out


def _check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, window: int,
                     tokens: tuple[int, ...]) -> None:
    """The checks of attention_decode (``tokens`` = ()) and attention_verify (``tokens`` = (T,)) on everything but
    ``q [b, *tokens, heads, hd]``'s own rank and window length."""
    b, heads, hd = q.shape[0], q.shape[-2], q.shape[-1]
    chk.check_tensor("k_cache", k_cache, (b, None, None, hd), (q.dtype,), q.device, inner_contiguous=4)
    kv_heads = k_cache.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k_cache: kv_heads (dim 1) must divide the {heads} query heads, got {kv_heads}")
    chk.check_tensor("v_cache", v_cache, tuple(k_cache.shape), (q.dtype,), q.device, inner_contiguous=4)
    chk.check_tensor("k", k, (b, *tokens, kv_heads, hd), (q.dtype,), q.device)
    chk.check_tensor("v", v, (b, *tokens, kv_heads, hd), (q.dtype,), q.device)
    chk.check_optional("gate", gate, (b, *tokens, heads, hd), (q.dtype,), q.device)
    chk.check_tensor("pos", pos, (b,), (torch.int64,), q.device)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= k_cache.shape[2]:
        raise ValueError(f"window: expected 0 (full attention) or a window of at most the cache's "
                         f"{k_cache.shape[2]} slots, got {window!r}")


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pos: torch.Tensor, scale: float, gate: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """One decode step of GQA attention over a static KV cache: appends ``k, v [b, kv_heads, hd]`` at ``pos [b]``
    (int64) of ``k_cache, v_cache [b, kv_heads, max_len, hd]`` (contiguous), attends ``q [b, heads, hd]`` over
    positions ``0..pos``, multiplies by ``sigmoid(gate)`` (``q``'s shape) if given. Last dims dense. Returns
    ``[b, heads * hd]``; ``pos`` is not advanced. A row whose ``pos`` is outside the cache: the CUDA kernel writes
    nothing to the cache and NaN outputs, the PyTorch path raises an index error. On CUDA one kernel (head_dim a
    multiple of 32 up to 256, a group's queries and scores within 48 KiB of shared memory); other shapes and the CPU
    run the PyTorch reference. ``window`` > 0: sliding-window attention over positions ``pos - window + 1 .. pos``,
    the cache a ring (position p in slot ``p % max_len``, ``max_len >= window``)."""
    chk.check_tensor("q", q, (None, None, None), chk.FLOAT_DTYPES)
    b, heads, hd = q.shape
    _check_attention(q, k, v, gate, k_cache, v_cache, pos, window, ())
    out = torch.empty((b, heads * hd), dtype=q.dtype, device=q.device)
    torch.ops.replayssm.attention_decode(q, k, v, gate, k_cache, v_cache, pos, float(scale), window, out)
    return out


def attention_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pos: torch.Tensor, scale: float, gate: torch.Tensor | None = None,
                     window: int = 0) -> torch.Tensor:
    """A speculative window of GQA attention over a static KV cache: appends the T tokens' ``k, v [b, T, kv_heads,
    hd]`` at positions ``pos .. pos + T - 1`` (``pos [b]``, int64) and attends ``q [b, T, heads, hd]``: token t over
    positions up to ``pos + t``, as T calls of :func:`attention_decode` at ``pos + t`` would (``gate`` as ``q``).
    Returns ``[b, T, heads * hd]``; ``pos`` is not advanced. On CUDA one launch for the window where the kernel takes
    the shape (as :func:`attention_decode`, the scores of T tokens within 48 KiB), else a decode step per token; a ring
    (``window`` > 0) must hold the window and the T tokens (``max_len >= window + T - 1`` once positions wrap), or the
    kernel writes nothing and NaN outputs for that row."""
    chk.check_tensor("q", q, (None, None, None, None), chk.FLOAT_DTYPES)
    b, T, heads, hd = q.shape
    if not 1 <= T <= MAX_WINDOW:
        raise ValueError(f"q: expected a window of 1 to {MAX_WINDOW} tokens (dim 1), got {T}")
    _check_attention(q, k, v, gate, k_cache, v_cache, pos, window, (T,))
    out = torch.empty((b, T, heads * hd), dtype=q.dtype, device=q.device)
    torch.ops.replayssm.attention_verify(q, k, v, gate, k_cache, v_cache, pos, float(scale), window, out)
    return out
