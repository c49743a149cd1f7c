"""The causal depthwise conv1d decode step as a custom op (``torch.ops.replayssm.conv1d_update``), on a pool of conv
states indexed by slot: the reference decoders' conv and the one the TensorRT-LLM module runs right before its GDN and
KDA decode steps. Its kernel (plugins/conv1d_update.cu) lets the next kernel launch at once, so a state kernel
launched as its programmatic dependent reads its slot id and asks L2 for its state while the conv runs. The CPU path
is the PyTorch reference (:mod:`trtllm_replayssm.core.reference.conv`)."""
from __future__ import annotations

from typing import Optional

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.formats import DTYPES, get_dtype
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.jit.loader import get_kernel, launch
from trtllm_replayssm.core.layouts import ParamLayout
from trtllm_replayssm.core.ops.launch import define_op, ptr, vector_elems, vectorizable
from trtllm_replayssm.core.reference import conv as ref

CONV_PARAMS = ParamLayout("ConvParams", """
  const act_t* x;        // [batch, channels] (row stride s_x): this step's conv input
  act_t* conv_state;     // [slots, channels, width - 1] (slot stride s_state; channels and taps dense): the previous
                         // width - 1 inputs of each slot, oldest first
  const act_t* weight;   // [channels, width] contiguous
  const act_t* bias;     // nullable, [channels]
  act_t* out;            // [batch, channels] (row stride s_out)
  const int* slot_ids;   // nullable, [batch]: row b's slot (null: slot b); a row whose id is pad_slot_id or outside
                         // [0, slots) is skipped
  long long s_x, s_out, s_state;
  int channels, width, slots, pad_slot_id;
  int silu, vec;         // vec: width 4 and kVec-channel groups of x, state, weight, out are 16-byte vectors
  int round_once;        // 1: SiLU of the fp32 conv, rounded once (TensorRT-LLM's causal_conv1d_update); 0: the conv
                         // rounded to act_t before the SiLU (the reference decoders)
  int pad0;""")

# plugins/conv1d_update.cu kBlock; replayssm_common.cuh kMaxConvWidth, kVecConvWidth
THREADS = 256
MAX_CONV_WIDTH = 8
VEC_CONV_WIDTH = 4


def conv_config(act_dtype: torch.dtype) -> KernelConfig:
    """The conv1d decode-step module for one activation dtype (its weights and states in that dtype too)."""
    return KernelConfig(family="conv", source="conv1d_update.cu", kernels=("conv1d_update_kernel",),
                        params=(("act_t", get_dtype(act_dtype).cuda),), layouts=(CONV_PARAMS,))


def conv_configs() -> list[KernelConfig]:
    """The module for every activation dtype."""
    return [conv_config(d.torch) for d in DTYPES]


def _conv1d_update_cpu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       silu: bool, out: torch.Tensor, state_indices: Optional[torch.Tensor], pad_slot_id: int,
                       round_once: bool) -> None:
    y, rows = ref.conv1d_update_(x, conv_state, weight, bias, silu, state_indices, pad_slot_id, round_once)
    out[rows] = y


def _conv1d_update_cuda(x, conv_state, weight, bias, silu, out, state_indices, pad_slot_id, round_once) -> None:
    batch, channels = x.shape
    if batch == 0:
        return
    width, elems = weight.shape[-1], vector_elems(x)
    vec = width == VEC_CONV_WIDTH and vectorizable(elems, [x, conv_state, weight, bias, out],
                                                   [x.stride(0), out.stride(0), conv_state.stride(0), channels])
    threads = channels // elems if vec else channels
    params = CONV_PARAMS.pack(x=ptr(x), conv_state=ptr(conv_state), weight=ptr(weight), bias=ptr(bias), out=ptr(out),
                              slot_ids=ptr(state_indices), s_x=x.stride(0), s_out=out.stride(0),
                              s_state=conv_state.stride(0), channels=channels, width=width, slots=conv_state.shape[0],
                              pad_slot_id=pad_slot_id, silu=int(silu), vec=int(vec), round_once=int(round_once),
                              pad0=0)
    launch(get_kernel(conv_config(x.dtype), "conv1d_update_kernel", x.device),
           ((threads + THREADS - 1) // THREADS, batch, 1), (THREADS, 1, 1), params)


define_op("conv1d_update", ("conv_state", "out"), _conv1d_update_cpu, _conv1d_update_cuda)


def conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  silu: bool = True, state_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, round_once: bool = False, checked: bool = False) -> torch.Tensor:
    """One decode step of a causal depthwise conv1d: ``x [b, C]`` (last dim dense), ``conv_state [slots, C, W-1]``
    (channels and taps dense, any slot stride; shifted in place), ``weight [C, 1, W]`` or ``[C, W]`` (contiguous),
    ``bias [C]``. Row b's state is the slot ``state_indices[b]`` ([b] int32; None: slot b, ``slots`` >= b); a row
    whose id is ``pad_slot_id`` is skipped (its ``out`` row and every state left as they are), as on CUDA one whose id
    is outside the pool. Returns ``out`` ([b, C], last dim dense; allocated when None): the conv + bias, then SiLU if
    ``silu``, rounded to ``x.dtype`` before the SiLU, or only at the end with ``round_once`` (TensorRT-LLM's
    ``causal_conv1d_update``). The ids are checked on CPU as the state ops' (``checks.slot_indices``: a slot of the
    pool or the pad id, none twice); on CUDA rows that share a slot (TensorRT-LLM's CUDA-graph padding rows on its
    dummy slot) each compute against it and race on its state, as in upstream's conv. ``checked``: the caller ran
    :func:`check_args` on these arguments."""
    if not checked:
        check_args(x, conv_state, weight, bias, state_indices, pad_slot_id, out)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.replayssm.conv1d_update(x, conv_state, weight, bias, bool(silu), out, state_indices, pad_slot_id,
                                      bool(round_once))
    return out


def check_args(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               state_indices: torch.Tensor | None, pad_slot_id: int, out: torch.Tensor | None) -> None:
    """:func:`conv1d_update`'s checks: a ValueError or TypeError naming the argument and what it expects."""
    chk.check_tensor("x", x, (None, None), chk.FLOAT_DTYPES)
    batch, channels = x.shape
    width = weight.shape[-1] if isinstance(weight, torch.Tensor) and weight.dim() else 0
    if not 2 <= width <= MAX_CONV_WIDTH:
        raise ValueError(f"weight: expected a conv width (last dim) in [2, {MAX_CONV_WIDTH}], got {width}")
    chk.check_tensor("weight", weight, (channels, 1, width) if weight.dim() == 3 else (channels, width), (x.dtype,),
                     x.device, inner_contiguous=weight.dim(), dtype_of="x")
    chk.check_tensor("conv_state", conv_state, (batch if state_indices is None else None, channels, width - 1),
                     (x.dtype,), x.device, inner_contiguous=2, dtype_of="x")
    chk.check_optional("bias", bias, (channels,), (x.dtype,), x.device, dtype_of="x")
    chk.check_int("pad_slot_id", pad_slot_id)
    if state_indices is not None:
        chk.slot_indices("state_indices", state_indices, batch, conv_state.shape[0], pad_slot_id, x.device)
    chk.check_optional("out", out, (batch, channels), (x.dtype,), x.device, dtype_of="x")
