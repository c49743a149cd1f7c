"""Fused decoder layers of the reference hybrid decoders as custom ops (``torch.ops.replayssm.*``): RMSNorm (with
the residual add), gated RMSNorm, the causal conv1d state update and the MLP activations. One CUDA launch each
(plugins/decoder_layers.cu) instead of PyTorch's chains of elementwise kernels; the CPU path is the PyTorch
reference (:mod:`trtllm_replayssm.reference.layers`). Shared by the baseline and the replay decoders alike."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from trtllm_replayssm import checks as chk
from trtllm_replayssm.kernels.configs import decoder_layers_config
from trtllm_replayssm.kernels.loader import get_kernel, launch
from trtllm_replayssm.ops._launch import make_struct, ptr
from trtllm_replayssm.reference import layers as ref

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
# Mirror the parameter structs of plugins/decoder_layers.cu (same order; natural alignment).
_RmsNormParams = make_struct("RmsNormParams", [
    ("x", _P), ("residual", _P), ("weight", _P), ("out", _P), ("s_x_outer", _I64), ("s_x_inner", _I64),
    ("s_out_outer", _I64), ("s_out_inner", _I64), ("inner", _I32), ("dim", _I32), ("eps", _F32),
    ("unit_offset", _I32)])
_GatedNormParams = make_struct("GatedNormParams", [
    ("x", _P), ("z", _P), ("weight", _P), ("out", _P), ("s_x", _I64), ("s_z", _I64), ("s_out", _I64),
    ("group_size", _I32), ("eps", _F32), ("norm_before_gate", _I32), ("pad0", _I32)])
_ConvParams = make_struct("ConvParams", [
    ("x", _P), ("conv_state", _P), ("weight", _P), ("bias", _P), ("out", _P), ("s_x", _I64), ("s_out", _I64),
    ("channels", _I32), ("width", _I32), ("silu", _I32), ("pad0", _I32)])
_ActParams = make_struct("ActParams", [("a", _P), ("b", _P), ("out", _P), ("n", _I64), ("kind", _I32),
                                       ("pad0", _I32)])

NORM_THREADS = 256  # plugins/decoder_layers.cu kBlock (the most threads per CTA)
MAX_CONV_WIDTH = 8  # plugins/decoder_layers.cu kMaxConvWidth
MLP_ACTS = ("relu2", "swiglu")


def _kernel(name: str, t: torch.Tensor):
    return get_kernel(decoder_layers_config(t.dtype), name, t.device)


def _norm_threads(cols: int) -> int:
    """Threads per row: about 4 columns each, a multiple of a warp, at most NORM_THREADS."""
    return max(32, min(NORM_THREADS, ((cols + 3) // 4 + 31) // 32 * 32))


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
@torch.library.custom_op("replayssm::rms_norm", mutates_args=("out",))
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool, out: torch.Tensor) -> None:
    out.copy_(ref.rms_norm(x, weight, eps, unit_offset))


@torch.library.custom_op("replayssm::add_rms_norm", mutates_args=("residual", "out"))
def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool,
                     out: torch.Tensor) -> None:
    out.copy_(ref.add_rms_norm_(x, residual, weight, eps, unit_offset))


def _rms_norm_launch(x, residual, weight, eps, unit_offset, out) -> None:
    x3, o3 = _rows3(x), _rows3(out)
    rows = x3.shape[0] * x3.shape[1]
    if rows == 0:
        return
    params = _RmsNormParams(ptr(x3), ptr(residual), ptr(weight), ptr(o3), x3.stride(0), x3.stride(1), o3.stride(0),
                            o3.stride(1), x3.shape[1], x3.shape[2], float(eps), int(unit_offset))
    launch(_kernel("rmsnorm_kernel", x), (rows, 1, 1), (_norm_threads(x3.shape[2]), 1, 1), params)


@_rms_norm_op.register_kernel("cuda")
def _rms_norm_cuda(x, weight, eps, unit_offset, out) -> None:
    _rms_norm_launch(x, None, weight, eps, unit_offset, out)


@_add_rms_norm_op.register_kernel("cuda")
def _add_rms_norm_cuda(x, residual, weight, eps, unit_offset, out) -> None:
    _rms_norm_launch(x, residual, weight, eps, unit_offset, out)


@torch.library.custom_op("replayssm::gated_rms_norm", mutates_args=("out",))
def _gated_rms_norm_op(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                       norm_before_gate: bool, out: torch.Tensor) -> None:
    out.copy_(ref.gated_rms_norm(x, z, weight, group_size, eps, norm_before_gate))


@_gated_rms_norm_op.register_kernel("cuda")
def _gated_rms_norm_cuda(x, z, weight, group_size, eps, norm_before_gate, out) -> None:
    x2, z2, o2 = _rows2(x), _rows2(z), _rows2(out)
    if x2.shape[0] == 0:
        return
    params = _GatedNormParams(ptr(x2), ptr(z2), ptr(weight), ptr(o2), x2.stride(0), z2.stride(0), o2.stride(0),
                              group_size, float(eps), int(norm_before_gate), 0)
    launch(_kernel("gated_rmsnorm_kernel", x), (x2.shape[0], x2.shape[1] // group_size, 1),
           (_norm_threads(group_size), 1, 1), params)


@torch.library.custom_op("replayssm::conv1d_update", mutates_args=("conv_state", "out"))
def _conv1d_update_op(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      silu: bool, out: torch.Tensor) -> None:
    out.copy_(ref.conv1d_update_(x, conv_state, weight, bias, silu))


@_conv1d_update_op.register_kernel("cuda")
def _conv1d_update_cuda(x, conv_state, weight, bias, silu, out) -> None:
    batch, channels = x.shape
    if batch == 0:
        return
    params = _ConvParams(ptr(x), ptr(conv_state), ptr(weight), ptr(bias), ptr(out), x.stride(0), out.stride(0),
                         channels, weight.shape[-1], int(silu), 0)
    launch(_kernel("conv1d_update_kernel", x), ((channels + NORM_THREADS - 1) // NORM_THREADS, batch, 1),
           (NORM_THREADS, 1, 1), params)


@torch.library.custom_op("replayssm::mlp_act", mutates_args=("out",))
def _mlp_act_op(a: torch.Tensor, b: Optional[torch.Tensor], kind: str, out: torch.Tensor) -> None:
    out.copy_(ref.mlp_act(a, b, kind))


@_mlp_act_op.register_kernel("cuda")
def _mlp_act_cuda(a, b, kind, out) -> None:
    n = a.numel()
    if n == 0:
        return
    params = _ActParams(ptr(a), ptr(b), ptr(out), n, MLP_ACTS.index(kind), 0)
    blocks = min((n + NORM_THREADS - 1) // NORM_THREADS, 16 * 1024)
    launch(_kernel("mlp_act_kernel", a), (blocks, 1, 1), (NORM_THREADS, 1, 1), params)


for _op in (_rms_norm_op, _add_rms_norm_op, _gated_rms_norm_op, _conv1d_update_op, _mlp_act_op):
    _op.register_fake(lambda *args, **kwargs: None)


# ---------------------------------------------------------------------------------------------------- public API
def _check_weight(name: str, weight: torch.Tensor, dim: int, x: torch.Tensor) -> None:
    chk.check_tensor(name, weight, (dim,), (x.dtype,), x.device)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x [..., D]`` (last dim dense) scaled by ``weight [D]`` (``1 + weight`` with ``unit_offset``).
    With ``residual`` (``x``'s shape, contiguous): ``residual += x`` in place first and the sum is normalised."""
    chk.check_tensor("x", x, (None,) * max(x.dim(), 1), chk.ACT_DTYPES)
    _check_weight("weight", weight, x.shape[-1], x)
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
    dense), ``weight [D]``: ``norm(x * silu(z)) * w`` or, ``norm_before_gate``, ``norm(x) * w * silu(z)``."""
    chk.check_tensor("x", x, (None,) * max(x.dim(), 1), chk.ACT_DTYPES)
    chk.check_tensor("z", z, tuple(x.shape), (x.dtype,), x.device)
    if group_size < 1 or x.shape[-1] % group_size:
        raise ValueError(f"group_size: expected a divisor of the last dim {x.shape[-1]}, got {group_size}")
    _check_weight("weight", weight, x.shape[-1], x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.replayssm.gated_rms_norm(x, z, weight, int(group_size), float(eps), bool(norm_before_gate), out)
    return out


def conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  silu: bool = True) -> torch.Tensor:
    """One decode step of a causal depthwise conv1d: ``x [b, C]`` (last dim dense), ``conv_state [b, C, W-1]``
    (contiguous, shifted in place), ``weight [C, 1, W]`` or ``[C, W]`` (contiguous), ``bias [C]``; returns ``[b, C]``
    (the conv + bias rounded to ``x.dtype``, then SiLU if ``silu``)."""
    chk.check_tensor("x", x, (None, None), chk.ACT_DTYPES)
    batch, channels = x.shape
    width = weight.shape[-1]
    if not 2 <= width <= MAX_CONV_WIDTH:
        raise ValueError(f"weight: expected a conv width (last dim) in [2, {MAX_CONV_WIDTH}], got {width}")
    chk.check_tensor("weight", weight, (channels, 1, width) if weight.dim() == 3 else (channels, width), (x.dtype,),
                     x.device, inner_contiguous=weight.dim())
    chk.check_tensor("conv_state", conv_state, (batch, channels, width - 1), (x.dtype,), x.device, inner_contiguous=3)
    chk.check_optional("bias", bias, (channels,), (x.dtype,), x.device)
    out = torch.empty((batch, channels), dtype=x.dtype, device=x.device)
    torch.ops.replayssm.conv1d_update(x, conv_state, weight, bias, bool(silu), out)
    return out


def mlp_act(a: torch.Tensor, b: torch.Tensor | None, kind: str) -> torch.Tensor:
    """MLP activation: ``relu2`` (``relu(a)^2``, ``b`` None) or ``swiglu`` (``silu(a) * b``); contiguous inputs."""
    if kind not in MLP_ACTS:
        raise ValueError(f"kind: expected one of {MLP_ACTS}, got {kind!r}")
    chk.check_tensor("a", a, (None,) * max(a.dim(), 1), chk.ACT_DTYPES, inner_contiguous=a.dim())
    if (kind == "swiglu") != (b is not None):
        raise ValueError(f"b: expected {'a tensor' if kind == 'swiglu' else 'None'} for kind={kind!r}")
    chk.check_optional("b", b, tuple(a.shape), (a.dtype,), a.device, inner_contiguous=a.dim())
    out = torch.empty_like(a)
    torch.ops.replayssm.mlp_act(a, b, kind, out)
    return out
