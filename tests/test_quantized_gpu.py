"""Mamba-2, GDN and KDA kernels on quantized, dual-copy and stochastically rounded checkpoints (GPU), against the
float32 reference on a CPU twin of the same cache (tests/test_quantized_state.py holds the reference to a float64
model that quantizes at the same points).

* Bit-exact codes: with x = 0 and A = 0 (Mamba-2), or A_log = -inf and beta = 0 (GDN, KDA: no decay, u = 0), a flush
  rewrites the checkpoint it read (S = S0 exactly, in the kernels' fp32 and the reference's), so the stored codes,
  block scales, row scales and flush counters must equal the torch codecs' bit for bit, stochastic rounding included
  (Philox keyed by slot and flush count).
* General steps: three staggered L-cycles with a pad row and poisoned outputs, replay and flush modes; outputs and the
  decoded checkpoints follow the reference to within a few code flips (the fp32 folds round in another order).
* CUDA-graph replay draws fresh stochastic rounding per replay (the counters advance on the device).
"""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.formats import state_spec
from trtllm_replayssm.core.samples import mamba2_step, random_state

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DIMS_OF = {"mamba2": Mamba2Dims(nheads=8, head_dim=64, d_state=128, n_groups=2),
           "gdn": GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=64),
           "kda": KDADims(num_heads=4, head_dim=128),
           "gdn-v128": GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=128)}  # whole-head tiles
FAMILIES = ["mamba2", "gdn", "kda"]
FAM = get_family("mamba2")
DIMS = DIMS_OF["mamba2"]
SPECS = {"fp8": state_spec("fp8"), "nvfp4": state_spec("nvfp4"), "fp8-dual-fp32": state_spec("fp8", "dual"),
         "nvfp4-dual-fp16": state_spec("nvfp4", "dual", "fp16"), "nvfp4-dual-bf16": state_spec("nvfp4", "dual", "bf16"),
         "nvfp4-dual-fp8-sr": state_spec("nvfp4", "dual", "fp8", True), "fp8-sr": state_spec("fp8", stochastic_rounding=True),
         "nvfp4-dual-fp32-sr": state_spec("nvfp4", "dual", "fp32", True), "bf16-sr": state_spec("bf16", stochastic_rounding=True)}
# Bit-exact rewrites: not shared NVFP4, whose decoded zeros (±0) may come back with the other sign (-0 + 0 = +0).
EXACT = ["fp8", "fp8-dual-fp32", "nvfp4-dual-fp16", "nvfp4-dual-fp32-sr", "nvfp4-dual-fp8-sr", "fp8-sr", "bf16-sr"]
SLOTS, L = 9, 4
SLOT_IDS = [3, -1, 0, 5, 7, 8]  # a pad row; slots 1, 2, 4, 6 are never touched


def _family_of(key: str):
    """The family of a DIMS_OF key (``gdn-v128``: GDN)."""
    return get_family(key.split("-")[0])


def _twins(spec, gen: torch.Generator, family: str = "mamba2"):
    """A GPU layer and a CPU layer with the same stored checkpoints, rings and staggered cursors."""
    fam, dims = _family_of(family), DIMS_OF[family]
    layers = [fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=spec, device=d).layer(0) for d in ("cpu", "cuda")]
    cpu, gpu = layers
    cpu.checkpoint().store_(torch.arange(SLOTS), random_state(SLOTS, dims, "fp32", gen, "cpu"))
    cpu.cursor.copy_(torch.arange(SLOTS, dtype=torch.int32) % L)
    for name, t in cpu.tensors().items():
        gpu.tensors()[name].copy_(t)
    return cpu, gpu


def _step(gen: torch.Generator, batch: int, identity: bool = False, family: str = "mamba2"):
    """Random step inputs; ``identity``: ones under which a flush rewrites the checkpoint it read."""
    step = _family_of(family).random_step(DIMS_OF[family], batch, gen, "cpu")
    if identity and family == "mamba2":
        step.x.zero_()
        step.A.zero_()
    elif identity:
        step.A_log.fill_(float("-inf"))
        step.b.fill_(float("-inf"))
    return step


def _family(layer) -> str:
    return type(layer).__name__.removesuffix("LayerCache").lower()


def _run(layer, step, ids: torch.Tensor, mode: str, plan=None) -> torch.Tensor:
    dev = layer.cursor.device
    args, kwargs = step.op_args()
    args = tuple(a.to(dev) for a in args)
    kwargs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = torch.full_like(args[2] if _family(layer) != "mamba2" else args[0], float("nan"))  # every row is written
    how = {"plan": plan} if plan is not None else {"mode": mode}
    return get_family(_family(layer)).replay_decode(layer, *args, **kwargs, state_batch_indices=ids.to(dev), out=out,
                                                    **how)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _storage(layer) -> dict[str, torch.Tensor]:
    return {n: (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).cpu()
            for n, t in layer.tensors().items() if n.startswith(("state", "read", "flushes"))}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["replay", "fused", "flush"])
@pytest.mark.parametrize("name", EXACT)
def test_rewritten_checkpoints_are_bit_exact(name, mode, family):
    gen = torch.Generator().manual_seed(11)
    cpu, gpu = _twins(SPECS[name], gen, family)
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32)
    for _ in range(L):  # every slot flushes once in replay mode, every step in flush mode
        step = _step(gen, len(SLOT_IDS), identity=True, family=family)
        _run(cpu, step, ids, mode)
        _run(gpu, step, ids, mode)
    torch.cuda.synchronize()
    for n, t in _storage(cpu).items():
        got = _storage(gpu)[n]
        assert torch.equal(got, t), f"{n}: {int((got != t).sum())} of {t.numel()} elements differ"


def _check_steps(spec, gen: torch.Generator, mode: str | list[str], plan_of=None, family: str = "mamba2") -> None:
    """Three staggered cycles with a pad row and poisoned outputs on twin caches: the GPU's outputs, cursors,
    checkpoints and flush counts follow the reference's, and slots outside the batch keep every byte. ``mode``: one
    for every step, or one per step; ``plan_of``: the GPU layer's launch plan from the layer (default: the op's
    planner in ``mode``)."""
    cpu, gpu = _twins(spec, gen, family)
    untouched = {n: t.clone() for n, t in _storage(gpu).items()}
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32)
    live = [i for i, s in enumerate(SLOT_IDS) if s >= 0]
    plan = plan_of(gpu) if plan_of else None
    tol = 0.03 if spec.read_format.name == "nvfp4" else 5e-3  # a few code flips where the fp32 folds round differently
    modes = [mode] * (3 * L) if isinstance(mode, str) else mode
    for k, m in enumerate(modes):
        step = _step(gen, len(SLOT_IDS), family=family)
        want = _run(cpu, step, ids, m)
        got = _run(gpu, step, ids, m, plan).cpu()
        assert got[1].abs().max() == 0, "the pad row's outputs are zeros"
        assert _rel(got[live], want[live]) < tol, (k, _rel(got[live], want[live]))
    assert torch.equal(gpu.cursor.cpu(), cpu.cursor)
    slots = torch.tensor([s for s in SLOT_IDS if s >= 0])
    g, c = gpu.checkpoint(), cpu.checkpoint()
    assert _rel(g.fold_values(slots.cuda()), c.fold_values(slots)) < tol
    assert _rel(g.read_values(slots.cuda()), c.read_values(slots)) < tol
    if spec.stochastic_rounding:
        assert torch.equal(g.flushes.cpu(), c.flushes)
    for n, t in _storage(gpu).items():  # slots outside the batch keep every byte
        assert torch.equal(t[[1, 2, 4, 6]], untouched[n][[1, 2, 4, 6]]), n


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["replay", "fused", "flush"])
@pytest.mark.parametrize("name", list(SPECS))
def test_steps_follow_the_reference(name, mode, family):
    _check_steps(SPECS[name], torch.Generator().manual_seed(5), mode, family=family)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("switch", [("replay", "flush"), ("flush", "replay"), ("fused", "flush")])
@pytest.mark.parametrize("name", ["fp8", "nvfp4", "nvfp4-dual-fp16", "fp8-dual-fp32", "nvfp4-dual-fp8-sr"])
def test_switching_modes_follows_the_reference(name, switch, family):
    """``auto`` switches kernels as the batch changes: after L + 1 steps of one mode the rings hold staggered records
    of random inputs, which the first steps of the other fold (the flush kernel's fold path, not its one-step path)."""
    first, then = switch
    _check_steps(SPECS[name], torch.Generator().manual_seed(9), [first] * (L + 1) + [then] * (2 * L - 1), family=family)


@pytest.mark.parametrize("name", ["fp8", "nvfp4", "nvfp4-dual-fp16", "fp8-dual-fp32", "nvfp4-dual-fp32-sr", "bf16-sr",
                                  "fp32", "bf16"])
def test_mamba2_two_head_tiles_follow_the_reference(name):
    """Persistent tiles of two adjacent heads (rows_per_cta = 2 x head_dim; the planner's choice for FP8/NVFP4 read
    copies at large batch) step like the reference."""
    from trtllm_replayssm.core.plans import Tuning

    def plan_of(layer):  # one CTA per SM: an fp32 stage of two heads (67 KB) fits more than once only so
        plan = FAM.replay_plan(layer, len(SLOT_IDS), "replay", Tuning(rows_per_cta=2 * DIMS.head_dim, ctas_per_sm=1))
        assert plan.rows_per_cta == 2 * DIMS.head_dim and plan.num_tiles == len(SLOT_IDS) * DIMS.nheads // 2
        return plan

    _check_steps(SPECS.get(name) or state_spec(name), torch.Generator().manual_seed(21), "replay", plan_of)


@pytest.mark.parametrize("tile", ["one head", "two heads"])
@pytest.mark.parametrize("name, apart", [("fp8", True), ("nvfp4", True), ("nvfp4-dual-fp16", True),
                                         ("nvfp4-dual-fp8-sr", True), ("bf16-sr", True), ("fp32", False),
                                         ("fp32", True)])
def test_mamba2_flush_rows_apart_or_in_the_persistent_kernel_follow_the_reference(name, apart, tile):
    """Flush rows folded by the flush-rows kernel after the persistent kernel (always for stored checkpoints, whose
    main kernel never folds; a tuning's choice for plain ones) or inside it (plain checkpoints), with tiles of one head
    or two: both step like the reference."""
    from trtllm_replayssm.core.plans import Tuning

    rows = {"rows_per_cta": 2 * DIMS.head_dim} if tile == "two heads" else {}

    def plan_of(layer):
        plan = FAM.replay_plan(layer, len(SLOT_IDS), "replay", Tuning(flush_apart=apart, ctas_per_sm=1, **rows))
        assert bool(plan.flush_ctas) is apart and plan.mode == "replay"
        return plan

    _check_steps(SPECS.get(name) or state_spec(name), torch.Generator().manual_seed(23), "replay", plan_of)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("name, apart", [("nvfp4", True), ("nvfp4-dual-fp16", True), ("nvfp4-dual-fp8-sr", True),
                                         ("bf16-sr", True), ("fp32", False), ("fp32", True)])
def test_delta_flush_rows_apart_or_in_the_persistent_kernel_follow_the_reference(name, apart, family):
    """GDN and KDA flush rows folded by the flush-rows kernel (StepKind::kApart; stored checkpoints always) or inside
    the persistent kernel (plain checkpoints)."""
    from trtllm_replayssm.core.plans import Tuning

    def plan_of(layer):
        plan = get_family(family).replay_plan(layer, len(SLOT_IDS), "replay", Tuning(flush_apart=apart))
        assert bool(plan.flush_ctas) is apart and plan.mode == "replay"
        return plan

    _check_steps(SPECS.get(name) or state_spec(name), torch.Generator().manual_seed(29), "replay", plan_of, family)


@pytest.mark.parametrize("family", ["gdn-v128", "kda"])
@pytest.mark.parametrize("name", ["fp8", "nvfp4", "fp8-dual-fp32", "fp8-sr", "nvfp4-dual-fp16", "nvfp4-dual-fp8-sr"])
def test_delta_whole_head_tiles_follow_the_reference(name, family):
    """GDN/KDA persistent tiles of a whole 128-row head (the planner's choice for stored checkpoints at large batch on
    sm_90), flush rows in the flush-rows kernel."""
    from trtllm_replayssm.core.ops.delta import WHOLE_HEAD_ROWS
    from trtllm_replayssm.core.plans import Tuning

    def plan_of(layer):
        plan = _family_of(family).replay_plan(layer, len(SLOT_IDS), "replay", Tuning(rows_per_cta=WHOLE_HEAD_ROWS))
        assert plan.rows_per_cta == WHOLE_HEAD_ROWS and plan.flush_ctas > 0
        return plan

    _check_steps(SPECS[name], torch.Generator().manual_seed(31), "replay", plan_of, family)


@pytest.mark.parametrize("family", ["gdn-v128", "kda"])
@pytest.mark.parametrize("flush_rows", [32, 64])
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-dual-fp16", "fp8-dual-fp32"])
def test_delta_flush_rows_kernel_of_another_tile_follows_the_reference(name, flush_rows, family):
    """Whole-head persistent tiles with the flush rows folded by a smaller row tile's flush-rows kernel
    (Tuning.flush_rows_per_cta)."""
    from trtllm_replayssm.core.ops.delta import WHOLE_HEAD_ROWS
    from trtllm_replayssm.core.plans import Tuning

    def plan_of(layer):
        tuning = Tuning(rows_per_cta=WHOLE_HEAD_ROWS, flush_rows_per_cta=flush_rows)
        plan = _family_of(family).replay_plan(layer, len(SLOT_IDS), "replay", tuning)
        assert plan.rows_per_cta == WHOLE_HEAD_ROWS and plan.flush_rows_per_cta == flush_rows and plan.flush_ctas > 0
        return plan

    _check_steps(SPECS[name], torch.Generator().manual_seed(37), "replay", plan_of, family)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["fp8", "nvfp4-dual-fp16", "fp8-dual-fp32"])
def test_baseline_kernel_reads_and_writes_the_master(name, family):
    spec, fam = SPECS[name], get_family(family)
    gen = torch.Generator().manual_seed(9)
    cpu, gpu = _twins(spec, gen, family)
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32)
    for _ in range(4):
        step = _step(gen, len(SLOT_IDS), family=family)
        args, kwargs = step.op_args()
        want = fam.state_update(cpu.checkpoint(), *args, **kwargs, state_batch_indices=ids)
        gargs = tuple(a.cuda() for a in args)
        gkw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        got = fam.state_update(gpu.checkpoint(), *gargs, **gkw, state_batch_indices=ids.cuda())
        assert _rel(got.cpu(), want) < (0.03 if "nvfp4" in name else 5e-3)
    slots = torch.tensor([s for s in SLOT_IDS if s >= 0])
    assert _rel(gpu.checkpoint().fold_values(slots.cuda()), cpu.checkpoint().fold_values(slots)) < 0.03


@pytest.mark.parametrize("family", FAMILIES)
def test_baseline_kernel_refuses_stochastic_rounding(family):
    fam = get_family(family)
    layer = fam.new_cache(DIMS_OF[family], 1, SLOTS, buffer_len=L, state_dtype=SPECS["fp8-sr"], device="cuda").layer(0)
    args, kwargs = _step(torch.Generator().manual_seed(0), 2, family=family).op_args()
    with pytest.raises(ValueError, match="replay_decode"):
        fam.state_update(layer.checkpoint(), *(a.cuda() for a in args),
                         **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
                         state_batch_indices=torch.tensor([0, 1], dtype=torch.int32, device="cuda"))


def test_mamba2_nvfp4_needs_whole_blocks_per_lane():
    dims = Mamba2Dims(nheads=2, head_dim=8, d_state=32, n_groups=1)
    layer = FAM.new_cache(dims, 1, 2, buffer_len=L, state_dtype="nvfp4", device="cuda").layer(0)
    args, kwargs = mamba2_step(dims, 1, torch.Generator().manual_seed(0), "cuda").op_args()
    with pytest.raises(ValueError, match=r"rows \(last dim\)"):
        FAM.replay_decode(layer, *args, **kwargs, state_batch_indices=torch.zeros(1, dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_replays_draw_fresh_rounding(family):
    """A captured step replayed over two cycles equals the same steps run eagerly, bit for bit (outputs and
    storage), and its flush counters follow the reference's."""
    spec, fam = SPECS["nvfp4-dual-fp32-sr"], get_family(family)
    gen = torch.Generator().manual_seed(3)
    cpu, eager = _twins(spec, gen, family)
    graphed = fam.new_cache(DIMS_OF[family], 1, SLOTS, buffer_len=L, state_dtype=spec, device="cuda").layer(0)
    for name, t in eager.tensors().items():
        graphed.tensors()[name].copy_(t)
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32, device="cuda")
    steps = [_step(gen, len(SLOT_IDS), family=family) for _ in range(2 * L)]
    static_args, static_kw = steps[0].op_args()
    static_args = tuple(a.cuda() for a in static_args)
    static_kw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in static_kw.items()}
    out = torch.empty_like(static_args[2] if family != "mamba2" else static_args[0])
    plan = fam.replay_plan(graphed, len(SLOT_IDS), "replay")
    saved = {n: t.clone() for n, t in graphed.tensors().items()}
    fam.replay_decode(graphed, *static_args, **static_kw, state_batch_indices=ids, out=out, plan=plan)  # loads
    for n, t in saved.items():
        graphed.tensors()[n].copy_(t)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fam.replay_decode(graphed, *static_args, **static_kw, state_batch_indices=ids, out=out, plan=plan)
    for step in steps:
        args, kwargs = step.op_args()
        for dst, src in zip(static_args, args):
            dst.copy_(src)
        for name, t in kwargs.items():  # the layer constants passed by keyword
            if isinstance(t, torch.Tensor):
                static_kw[name].copy_(t)
        graph.replay()
        want = _run(eager, step, ids.cpu(), "replay")
        _run(cpu, step, ids.cpu(), "replay")
        assert torch.equal(out, want)
    for n, t in _storage(eager).items():
        assert torch.equal(_storage(graphed)[n], t), n
    assert torch.equal(graphed.checkpoint().flushes.cpu(), cpu.checkpoint().flushes)
    assert cpu.checkpoint().flushes.max() == 3  # the initial store and two flushes


@pytest.mark.parametrize("family", FAMILIES)
def test_sanitizer_smoke(family):
    """One replay cycle and a flush step on a small stored cache (compute-sanitizer runs it)."""
    gen = torch.Generator().manual_seed(1)
    cpu, gpu = _twins(SPECS["nvfp4-dual-fp8-sr"], gen, family)
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32)
    for k in range(L + 1):
        _run(gpu, _step(gen, len(SLOT_IDS), family=family), ids, "flush" if k == L else "replay")
    torch.cuda.synchronize()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["replay", "fused", "flush"])
@pytest.mark.parametrize("name", ["nvfp4-dual-fp16", "bf16-sr", "fp8", "nvfp4", "nvfp4-dual-fp8-sr"])
def test_a_strided_master_in_a_served_pool_steps_like_a_dense_one(name, mode, family):
    """Served by TensorRT-LLM the master is a strided view of its unified pool (each slot's SSM bytes followed by
    its conv bytes), or FP8/NVFP4 codes in the first bytes of a bf16 pool's slots (``codes_in_pool``), and our cache
    holds the rest: outputs, master, read copy and counters equal a dense cache's."""
    from trtllm_replayssm.core.checkpoint import codes_in_pool

    gen = torch.Generator().manual_seed(11)
    spec, fam, dims = SPECS[name], get_family(family), DIMS_OF[family]
    dense = fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=spec, device="cuda").layer(0)
    dense.checkpoint().store_(torch.arange(SLOTS, device="cuda"), random_state(SLOTS, dims, "fp32", gen, "cuda"))
    dense.cursor.copy_(torch.arange(SLOTS, dtype=torch.int32, device="cuda") % L)
    codes = spec.checkpoint_format.quantized
    pool_dtype, shape = torch.bfloat16 if codes else dense.state.dtype, dense.checkpoint().shape
    ssm_bytes = shape[1] * shape[2] * shape[3] * pool_dtype.itemsize
    pool = torch.zeros(SLOTS, ssm_bytes + 2 * 4 * 64 * 2, dtype=torch.uint8, device="cuda")
    view = pool[:, :ssm_bytes].view(pool_dtype).view(shape)
    master = codes_in_pool(view, spec.checkpoint_format) if codes else view
    assert not master.is_contiguous()
    served = fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=spec, device="cuda", checkpoints=False)
    layer = served.with_checkpoint(0, master)
    master.copy_(dense.state)
    for key, t in dense.tensors().items():
        if key != "state":
            layer.tensors()[key].copy_(t)
    ids = torch.tensor(SLOT_IDS, dtype=torch.int32)
    for _ in range(2 * L):
        step = _step(gen, len(SLOT_IDS), family=family)
        assert torch.equal(_run(layer, step, ids, mode), _run(dense, step, ids, mode))
    assert torch.equal(master, dense.state)
    for key, t in dense.tensors().items():
        if key != "state":
            assert torch.equal(layer.tensors()[key], t), key
