"""``torch.library.opcheck`` over every ``replayssm::`` op (schema and mutation annotations, fake impls for
torch.compile, autograd registration, AOT dispatch), on CPU through the reference impls with random sample inputs
and on CUDA when a GPU is present."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import FAMILIES
from trtllm_replayssm.core.formats import state_spec
from trtllm_replayssm.core.layouts import delta_verify_rec_floats, verify_coef_floats
from trtllm_replayssm.core.ops import delta, mamba2_spec
from trtllm_replayssm.core.samples import fill_rings_, random_state, slot_indices
from trtllm_replayssm.lab.layers import ops as layer_ops  # noqa: F401  (registers the fused layer ops)

pytestmark = pytest.mark.kernels
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DIMS = {"mamba2": Mamba2Dims(nheads=4, head_dim=64, d_state=128, n_groups=2),
        "gdn": GDNDims(num_k_heads=1, num_v_heads=2, head_k_dim=128, head_v_dim=128),
        "kda": KDADims(num_heads=2, head_dim=128)}
SSM_OPS = [f"{family}_{op}" for family in DIMS for op in ("replay_decode", "state_update")]
STORED_OPS = [f"{name}_stored" for name in SSM_OPS]  # quantized / dual / SR checkpoints
# speculative ops: verify from checkpoint + ring, the per-draft-state baseline, every family's commit (a cursor move)
SPEC_OPS = [f"{family}_{op}" for family in DIMS for op in ("verify_decode", "per_draft_verify")]
SPEC_OPS += ["mamba2_per_draft_commit", "delta_per_draft_commit", "spec_commit"]
LAYER_OPS = ["rms_norm", "add_rms_norm", "gated_rms_norm", "conv1d_update", "conv1d_verify", "conv1d_commit",
             "mlp_act", "rope", "attention_decode", "attention_verify"]


def _ssm_sample(name: str, gen: torch.Generator) -> tuple:
    """Positional arguments of ``torch.ops.replayssm.<name>`` (what the public wrapper passes)."""
    family, _, op = name.partition("_")
    if op.endswith("_stored"):
        return _stored_sample(family, op.removesuffix("_stored"), gen)
    dims, fam, batch = DIMS[family], FAMILIES[family], 3
    step = fam.random_step(dims, batch, gen, DEV, torch.bfloat16)
    args, kwargs = step.op_args()
    idx = slot_indices(batch, gen, DEV)
    out = torch.empty(batch, dims.heads, dims.rows, dtype=torch.bfloat16, device=DEV)
    if family == "mamba2":
        tail = (kwargs["D"], None, kwargs["dt_bias"], True)
    elif family == "gdn":
        tail = (dims.cols ** -0.5,)
    else:
        tail = (None, dims.cols ** -0.5)
    if op == "state_update":
        state = random_state(batch + 1, dims, "fp32", gen, DEV)
        plan = fam.state_update_plan(state, batch, torch.bfloat16)
        return (state, *args, *tail, idx, -1, plan.words, out)
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=4, device=DEV).layer(0)
    layer.state.copy_(random_state(batch + 1, dims, "fp32", gen, DEV))
    fill_rings_(layer, gen)
    layer.cursor[idx.long()] = torch.arange(batch, dtype=torch.int32, device=DEV)
    plan = fam.replay_plan(layer, batch, "replay")
    rings = ((layer.x_ring, layer.dt_ring, layer.B_ring) if family == "mamba2"
             else (layer.u_ring, layer.k_ring, layer.g_ring))
    return (layer.state, *rings, layer.cursor, layer.arrive, layer.coef, layer.step, *args, *tail, idx, -1,
            plan.words, out)


def _stored_sample(family: str, op: str, gen: torch.Generator) -> tuple:
    """A stored-checkpoint op's arguments: the plain op's, with the master data, Checkpoint.op_tensors(), the spec's
    fields and the seed in front of the rest (dual NVFP4 read copy, fp16 master; stochastic rounding in the replay)."""
    dims, fam, batch = DIMS[family], FAMILIES[family], 3
    spec = state_spec("nvfp4", "dual", "fp16", stochastic_rounding=op == "replay_decode")
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=4, state_dtype=spec, device=DEV).layer(0)
    ckpt = layer.checkpoint()
    ckpt.store_(torch.arange(batch + 1, device=DEV), random_state(batch + 1, dims, "fp32", gen, DEV))
    head = (*ckpt.op_tensors(), spec.format, spec.mode, spec.master, spec.stochastic_rounding, 7)
    plain = _ssm_sample(f"{family}_{op}", gen)
    if op == "state_update":
        return (*head, *plain[1:-2], fam.state_update_plan(ckpt, batch, torch.bfloat16).words, plain[-1])
    fill_rings_(layer, gen)
    idx = plain[-4]
    layer.cursor[idx.long()] = torch.arange(batch, dtype=torch.int32, device=DEV)
    rings = ((layer.x_ring, layer.dt_ring, layer.B_ring) if family == "mamba2"
             else (layer.u_ring, layer.k_ring, layer.g_ring))
    plan = fam.replay_plan(layer, batch, "replay")
    return (*head, *rings, layer.cursor, layer.arrive, layer.coef, layer.step, *plain[8:-2], plan.words, plain[-1])


def _window_step(family: str, batch: int, T: int, gen: torch.Generator):
    """Random inputs of a window of T tokens per row: the per-token fields [batch, T, ...]."""
    step = FAMILIES[family].random_step(DIMS[family], batch * T, gen, DEV, torch.bfloat16)
    return replace(step, **{f.name: getattr(step, f.name).unflatten(0, (batch, T)) for f in fields(step)
                            if f.name not in step.per_head_fields})


def _spec_sample(name: str, gen: torch.Generator) -> tuple:
    """A speculative op's arguments: a window of T = 2 tokens for 3 rows whose cursor words hold 0, 1, 2 committed
    records from ring position 3 of rings of L = 4 (the last two fold first, the last wraps)."""
    family, _, op = name.partition("_")
    family = {"delta": "gdn", "spec": "gdn"}.get(family, family)
    dims, fam, batch, T = DIMS[family], FAMILIES[family], 3, 2
    idx = slot_indices(batch, gen, DEV)
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=4, device=DEV).layer(0)
    layer.state.copy_(random_state(batch + 1, dims, "fp32", gen, DEV))
    fill_rings_(layer, gen)
    layer.cursor[idx.long()] = torch.tensor([spec_cursor.pack(3, c) for c in range(batch)], dtype=torch.int32,
                                            device=DEV)
    accepted = torch.tensor([1, 2, 2], dtype=torch.int32, device=DEV)
    if name == "spec_commit":
        return layer.cursor.unsqueeze(0), accepted, idx, -1, T, layer.buffer_len
    tile = (mamba2_spec.rows_per_cta(layer.state, batch) if family == "mamba2"
            else delta.window_tile(layer.state, batch))
    inter = torch.randn(batch, T, *layer.state.shape[1:], generator=gen).to(DEV)
    if op == "per_draft_commit":
        return layer.state, inter, accepted, idx, -1, tile
    args, kwargs = _window_step(family, batch, T, gen).op_args()
    tail = (*kwargs.values(), *{"mamba2": (), "gdn": (dims.cols ** -0.5,), "kda": (None, dims.cols ** -0.5)}[family])
    out = torch.empty(batch, T, dims.heads, dims.rows, dtype=torch.bfloat16, device=DEV)
    if op == "per_draft_verify":
        head = (layer.state, inter)
    elif family == "mamba2":
        coef = torch.empty(batch, dims.heads, verify_coef_floats(layer.buffer_len), device=DEV)
        head = (layer.state, *layer.rings, layer.cursor, layer.arrive, coef, layer.step)
        tile = mamba2_spec.verify_plan(layer, batch, T).words
    else:
        coef = torch.empty(batch, dims.heads, delta_verify_rec_floats(layer.buffer_len, dims.cols, T), device=DEV)
        head = (layer.state, *layer.rings, layer.cursor, layer.arrive, coef, layer.step)
        tile = delta.verify_plan(layer, batch, T).words
    return (*head, *args, *tail, idx, -1, tile, out)


def _layer_sample(name: str, gen: torch.Generator) -> tuple:
    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(device=DEV, dtype=dtype)

    rows, dim = 3, 256
    if name == "rms_norm":
        return rnd(rows, dim), rnd(dim), 1e-5, False, rnd(rows, dim)
    if name == "add_rms_norm":
        return rnd(rows, dim), rnd(rows, dim), rnd(dim), 1e-5, True, rnd(rows, dim)
    if name == "gated_rms_norm":
        return rnd(rows, dim), rnd(rows, dim), rnd(dim), 64, 1e-5, False, rnd(rows, dim)
    if name == "conv1d_update":
        slots = torch.tensor([4, -1, 0], dtype=torch.int32, device=DEV)
        return rnd(rows, dim), rnd(6, dim, 3), rnd(dim, 4), rnd(dim), True, rnd(rows, dim), slots, -1, True
    if name == "conv1d_verify":
        return rnd(rows, 4, dim), rnd(rows, dim, 3), rnd(dim, 4), rnd(dim), True, rnd(rows, 4, dim)
    if name == "conv1d_commit":
        return rnd(rows, dim, 3), rnd(rows, 4, dim), torch.tensor([1, 4, 2], device=DEV)
    if name == "mlp_act":
        return rnd(rows, dim), rnd(rows, dim), "swiglu", rnd(rows, dim)
    if name == "rope":
        return rnd(rows, 4, 64), torch.arange(rows, device=DEV), 32, 10000.0, rnd(rows, 4, 64)
    heads, kv_heads, head_dim, max_len = 4, 2, 64, 8  # attention_decode, attention_verify
    if name == "attention_verify":
        return (rnd(rows, 2, heads, head_dim), rnd(rows, 2, kv_heads, head_dim), rnd(rows, 2, kv_heads, head_dim),
                None, rnd(rows, kv_heads, max_len, head_dim), rnd(rows, kv_heads, max_len, head_dim),
                torch.tensor([2, 5, 6], device=DEV), head_dim ** -0.5, 0, rnd(rows, 2, heads * head_dim))
    return (rnd(rows, heads, head_dim), rnd(rows, kv_heads, head_dim), rnd(rows, kv_heads, head_dim), None,
            rnd(rows, kv_heads, max_len, head_dim), rnd(rows, kv_heads, max_len, head_dim),
            torch.tensor([2, 5, 7], device=DEV), head_dim ** -0.5, 0, rnd(rows, heads * head_dim))


def test_every_replayssm_op_is_covered():
    registered = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("replayssm::")}
    assert registered == set(SSM_OPS) | set(STORED_OPS) | set(SPEC_OPS) | set(LAYER_OPS)


@pytest.mark.parametrize("name", SSM_OPS + STORED_OPS + SPEC_OPS + LAYER_OPS)
def test_opcheck(name):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    if name in SPEC_OPS:
        args = _spec_sample(name, gen)
    else:
        args = _ssm_sample(name, gen) if name in SSM_OPS + STORED_OPS else _layer_sample(name, gen)
    torch.library.opcheck(getattr(torch.ops.replayssm, name).default, args)
