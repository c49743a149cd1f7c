"""Quantized, dual-copy and stochastically rounded checkpoints (CPU): the StateSpec rules, the storage codecs, the
cache's storage and prefill hand-off, and every family's float32 replay reference against a float64 model that
quantizes at the same points.

The float64 model keeps, per slot, the state a non-flush step reads (decoded read copy, stepped token by token) and
the difference master - read copy, decayed by each token's gate: the master track is read track + that difference
(every token adds the same update to both, and a delta-rule non-flush step computes its corrected value from the read
copy, as the reference does). A flush steps the master track, stores the new state through a Checkpoint of the same
spec and seed (so stochastic rounding draws the same numbers) and restarts both tracks from the decoded copies.
"""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core import quant
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.checkpoint import Checkpoint, StoredState
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.formats import StateSpec, state_spec
from trtllm_replayssm.core.reference import gdn as ref_gdn, kda as ref_kda, mamba2 as ref_mamba2
from trtllm_replayssm.core.samples import step_rows

F64 = torch.float64
DIMS = {"mamba2": Mamba2Dims(nheads=4, head_dim=16, d_state=32, n_groups=2),
        "gdn": GDNDims(num_k_heads=1, num_v_heads=2, head_k_dim=64, head_v_dim=16),
        "kda": KDADims(num_heads=2, head_dim=64)}
SPECS = {"fp8-shared": state_spec("fp8"), "nvfp4-shared": state_spec("nvfp4"),
         "fp8-dual-fp32": state_spec("fp8", "dual"), "nvfp4-dual-fp16": state_spec("nvfp4", "dual", "fp16"),
         "nvfp4-dual-fp8-sr": state_spec("nvfp4", "dual", "fp8", True),
         "fp8-shared-sr": state_spec("fp8", stochastic_rounding=True),
         "bf16-sr": state_spec("bf16", stochastic_rounding=True)}
SLOTS, L = 5, 4


# ------------------------------------------------------------------------------------------------- spec rules
def test_spec_defaults_and_labels():
    assert state_spec("fp32") == StateSpec("fp32", "plain")
    assert state_spec("bf16", "shared") == StateSpec("bf16", "plain")
    assert state_spec(torch.float16) == StateSpec("fp16", "plain")
    assert state_spec("fp8") == StateSpec("fp8", "shared")
    assert state_spec("nvfp4", "dual") == StateSpec("nvfp4", "dual", "fp32")
    assert state_spec("nvfp4", "dual", "fp16", True).label == "nvfp4/dual/fp16+sr"
    spec = state_spec("fp8", "dual", "bf16")
    assert state_spec(spec) is spec
    assert (spec.read_format.name, spec.checkpoint_format.name) == ("fp8", "bf16")


@pytest.mark.parametrize("args,match", [
    (("fp32", "dual"), "state_format"), (("fp8", "dual", "fp8"), "master_format"),
    (("nvfp4", "dual", "nvfp4"), "master_format"), (("fp8", "shared", "fp32"), "master_format"),
    (("fp32", None, None, True), "stochastic_rounding"), (("fp9",), "state_format"), (("fp8", "quad"), "state_mode"),
    (("nvfp4", "plain"), "state_mode"),
])
def test_spec_errors_name_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        state_spec(*args)


def test_row_bytes_count_the_scales():
    assert state_spec("fp32").row_bytes(128) == 512
    assert state_spec("fp8").row_bytes(128) == 128 + 4
    assert state_spec("nvfp4").row_bytes(128) == 64 + 8 + 4
    assert state_spec("nvfp4", "dual", "fp16").row_bytes(128) == 256 + 64 + 8 + 4
    with pytest.raises(ValueError, match="multiple of 16"):
        state_spec("nvfp4").row_bytes(24)


# ------------------------------------------------------------------------------------------------- storage
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8", "nvfp4"])
def test_stored_state_matches_the_codecs(fmt):
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(3, 2, 4, 32, generator=gen) * torch.logspace(-3, 2, 32)
    store = StoredState.allocate(fmt, 5, (2, 4, 32), "cpu")
    assert store.shape == (5, 2, 4, 32)
    slots = torch.tensor([4, 0, 2])
    assert store.decode(slots).abs().max() == 0  # zero storage decodes to zeros
    store.encode_(slots, values)
    if fmt == "fp8":
        expected = quant.dequantize_fp8_rows(*quant.quantize_fp8_rows(values))
    elif fmt == "nvfp4":
        g = quant.nvfp4_global_scale(values, (-1,))
        expected = quant.dequantize_nvfp4(*quant.quantize_nvfp4(values, g), g)
    else:
        expected = values.to(store.data.dtype).float()
    assert torch.equal(store.decode(slots), expected)
    assert store.decode(torch.tensor([1, 3])).abs().max() == 0  # other slots untouched


def test_nvfp4_second_level_scale_is_per_row():
    values = torch.randn(1, 1, 3, 32) * torch.tensor([1e-3, 1.0, 1e3])[:, None]
    store = StoredState.allocate("nvfp4", 1, (1, 3, 32), "cpu")
    store.encode_(torch.tensor([0]), values)
    rows_amax = values.abs().amax(-1)[0, 0]
    assert torch.equal(store.scale[0, 0], quant.pow2_scale(rows_amax, 6 * 448))
    assert ((rows_amax / store.scale[0, 0] > 1344) & (rows_amax / store.scale[0, 0] <= 2688)).all()
    rel = ((store.decode(torch.tensor([0])) - values).norm(dim=-1) / values.norm(dim=-1))[0, 0]
    assert rel.max() < 0.2  # a small row keeps its own precision next to a large one


# ------------------------------------------------------------------------------------------------- cache
@pytest.mark.parametrize("name", list(SPECS))
def test_cache_storage_layout_and_bytes(name):
    spec, dims = SPECS[name], DIMS["gdn"]
    cache = get_family("gdn").new_cache(dims, 2, SLOTS, buffer_len=L, state_dtype=spec, act_dtype=torch.float32,
                                        device="cpu")
    layer = cache.layer(1)
    assert layer.spec == spec and cache.spec == spec
    ckpt = layer.checkpoint()
    assert ckpt.shape == (SLOTS, dims.heads, dims.rows, dims.cols)
    assert ckpt.seed == 1 and (ckpt.read is not None) == spec.dual
    assert layer.state.dtype == spec.checkpoint_format.storage_dtype
    storage_names = {n for n in layer.tensors() if n.startswith(("state", "read", "flushes"))}
    per_slot = sum(layer.tensors()[n][0].numel() * layer.tensors()[n].element_size() for n in storage_names)
    expected = dims.heads * dims.rows * spec.row_bytes(dims.cols) + (4 if spec.stochastic_rounding else 0)
    assert per_slot == expected


def test_plain_spec_keeps_a_plain_pool():
    layer = get_family("mamba2").new_cache(DIMS["mamba2"], 1, SLOTS, state_dtype="bf16", device="cpu").layer(0)
    assert layer.storage is None and layer.state.dtype == torch.bfloat16 and layer.spec == state_spec("bf16")


@pytest.mark.parametrize("label", ["nvfp4", "fp8", "nvfp4/dual/fp8"])
def test_quantized_codes_bound_from_a_pool_decode_like_a_dense_cache(label):
    """A cache without checkpoints keeps a quantized master's scales and binds its codes: the first bytes of each
    slot of a strided bf16 pool (``codes_in_pool``), heads dense, writes inside the slot's bytes only."""
    from trtllm_replayssm.core.checkpoint import codes_in_pool
    from trtllm_replayssm.core.checks import check_stored_for_kernels

    from trtllm_replayssm.core.formats import parse_state_label

    spec, fam, dims = parse_state_label(label), get_family("kda"), DIMS["kda"]
    dense = fam.new_cache(dims, 1, SLOTS, state_dtype=spec, device="cpu").layer(0)
    values = torch.randn(SLOTS, dims.heads, dims.rows, dims.cols, generator=torch.Generator().manual_seed(2))
    dense.checkpoint().store_(torch.arange(SLOTS), values)
    served = fam.new_cache(dims, 1, SLOTS, state_dtype=spec, device="cpu", checkpoints=False)
    assert served.layer(0).state is None and served.layer(0).storage.master.data.shape[0] == 0
    slot_elems = dims.heads * dims.rows * dims.cols
    pool = torch.full((SLOTS, slot_elems + 64), 7.0, dtype=torch.bfloat16)  # + another layer's bytes
    view = pool[:, :slot_elems].view(SLOTS, dims.heads, dims.rows, dims.cols)
    codes = codes_in_pool(view, spec.checkpoint_format)
    assert codes.stride(0) == view.stride(0) * 2 and codes[:1].is_contiguous() and codes.dtype == dense.state.dtype
    layer = served.with_checkpoint(0, codes)
    for name, t in dense.tensors().items():
        if name != "state":
            layer.tensors()[name].copy_(t)
    layer.checkpoint().store_(torch.arange(SLOTS), values)
    assert torch.equal(layer.checkpoint().read_values(torch.arange(SLOTS)),
                       dense.checkpoint().read_values(torch.arange(SLOTS)))
    assert torch.equal(codes, dense.state) and (pool[:, slot_elems:] == 7).all()
    check_stored_for_kernels(layer.checkpoint())  # a slot stride is what the kernels take
    with pytest.raises(ValueError, match=rf"^state: expected shape \({SLOTS}, 2, 64, \d+\), got \({SLOTS}, 1,"):
        served.with_checkpoint(0, codes[:, :1])


def test_codes_in_pool_checks_the_pool():
    from trtllm_replayssm.core.checkpoint import codes_in_pool
    from trtllm_replayssm.core.formats import get_state_format

    nvfp4 = get_state_format("nvfp4")
    with pytest.raises(ValueError, match="^state: expected an fp32/fp16/bf16 pool"):
        codes_in_pool(torch.zeros(2, 2, 4, 64, dtype=torch.uint8), nvfp4)
    with pytest.raises(ValueError, match="^state: the pool's heads, rows and cols must be dense within a slot"):
        codes_in_pool(torch.zeros(2, 4, 2, 64).transpose(1, 2), nvfp4)


def test_dual_cache_binds_an_upstream_master():
    fam, dims = get_family("gdn"), DIMS["gdn"]
    spec = state_spec("nvfp4", "dual", "bf16")
    cache = fam.new_cache(dims, 1, SLOTS, state_dtype=spec, device="cpu", checkpoints=False)
    assert cache.layer(0).state is None and cache.layer(0).storage.read is not None
    pool = torch.zeros(SLOTS, dims.heads, dims.rows, dims.cols, dtype=torch.bfloat16)
    layer = cache.with_checkpoint(0, pool)
    assert layer.checkpoint().master.data is pool


@pytest.mark.parametrize("name", ["nvfp4-dual-fp16", "fp8-shared-sr"])
def test_prefill_hand_off_encodes_like_a_flush(name):
    spec, dims = SPECS[name], DIMS["mamba2"]
    cache = get_family("mamba2").new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=spec, device="cpu")
    states = torch.randn(2, dims.heads, dims.rows, dims.cols, generator=torch.Generator().manual_seed(5))
    cache.layer(0).cursor.fill_(2)
    cache.load_prefill_state(0, [3, 1], states)
    twin = Checkpoint.allocate(spec, SLOTS, (dims.heads, dims.rows, dims.cols), "cpu")
    ids = torch.tensor([3, 1])
    twin.store_(ids, states)
    ckpt = cache.layer(0).checkpoint()
    assert torch.equal(ckpt.read_values(ids), twin.read_values(ids))
    assert torch.equal(ckpt.fold_values(ids), twin.fold_values(ids))
    assert cache.layer(0).cursor.tolist() == [2, 0, 2, 0, 2]
    if spec.stochastic_rounding:
        assert ckpt.flushes.tolist() == [0, 1, 0, 1, 0]


def test_stochastic_rounding_is_keyed_by_slot_and_flush_count():
    spec, shape = SPECS["fp8-shared-sr"], (2, 4, 32)
    values = torch.randn(1, *shape, generator=torch.Generator().manual_seed(2))
    a, b = Checkpoint.allocate(spec, 4, shape, "cpu"), Checkpoint.allocate(spec, 4, shape, "cpu")
    a.store_(torch.tensor([2]), values)
    b.store_(torch.tensor([0, 2]), torch.cat([values, values]))  # another batch around the same slot
    assert torch.equal(a.fold_values(torch.tensor([2])), b.fold_values(torch.tensor([2])))
    b.store_(torch.tensor([2]), values)  # the next flush draws other numbers
    assert not torch.equal(a.fold_values(torch.tensor([2])), b.fold_values(torch.tensor([2])))
    c = Checkpoint.allocate(spec, 4, shape, "cpu", seed=7)  # another layer
    c.store_(torch.tensor([2]), values)
    assert not torch.equal(a.fold_values(torch.tensor([2])), c.fold_values(torch.tensor([2])))


# ------------------------------------------------------------------------------------------------- replay vs model
def _decay(family: str, step) -> torch.Tensor:
    """Each row's float64 state decay of one token, broadcastable against [b, heads, rows, cols]."""
    if family == "mamba2":
        delta = ref_mamba2.softplus_thr20(step.dt.to(F64) + step.dt_bias.to(F64))
        return torch.exp(ref_mamba2.decay_exponent(step.A.to(F64), delta))[..., None, None]
    if family == "gdn":
        return torch.exp(ref_gdn.log_gate(step.a.to(F64), step.A_log.to(F64), step.dt_bias.to(F64)))[..., None, None]
    return torch.exp(ref_kda.log_gate(step.a.to(F64), step.A_log.to(F64), step.dt_bias.to(F64)))[:, :, None, :]


class _Model:
    """The float64 model of the module docstring for the slots of one layer."""

    def __init__(self, family: str, spec: StateSpec, states: torch.Tensor, slots: torch.Tensor) -> None:
        self.fam, self.family, self.spec = get_family(family), family, spec
        self.flushes = torch.zeros(SLOTS, dtype=torch.long)
        self.read = torch.zeros(SLOTS, *states.shape[1:], dtype=F64)
        self.diff = torch.zeros_like(self.read)
        self.exact = torch.zeros_like(self.read)
        self.exact[slots] = states.to(F64)
        self._store(slots, states.to(F64))

    def _store(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """A flush's write, spelled out: the master and (dual) the read copy encoded from the same values with the
        uniforms of (slot, flush count, seed 0, stream 0 / 1)."""
        rows = torch.arange(len(slots))
        copies = []
        for fmt, stream in ((self.spec.checkpoint_format, 0), (self.spec.read_format, 1))[:1 + self.spec.dual]:
            u = (quant.sr_uniforms(values.shape, slots, self.flushes[slots], 0, stream)
                 if self.spec.stochastic_rounding else None)
            store = StoredState.allocate(fmt, len(slots), tuple(values.shape[1:]), "cpu")
            store.encode_(rows, values.float(), u)
            copies.append(store.decode(rows).to(F64))
        self.flushes[slots] += 1
        self.read[slots] = copies[-1]
        self.diff[slots] = copies[0] - copies[-1]

    def step(self, step, slots: torch.Tensor, flush: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(model output, unquantized float64 output) of every row."""
        out = torch.zeros(len(slots), *self.read.shape[1:3], dtype=F64)
        exact_out, self.exact[slots] = self.fam.reference_step(self.exact[slots], step)
        for rows, is_flush in ((flush.nonzero().flatten(), True), ((~flush).nonzero().flatten(), False)):
            if rows.numel() == 0:
                continue
            s, sub = slots[rows], step_rows(step, rows)
            if is_flush:
                out[rows], new = self.fam.reference_step(self.read[s] + self.diff[s], sub)
                self._store(s, new)
            else:
                out[rows], self.read[s] = self.fam.reference_step(self.read[s], sub)
                self.diff[s] = self.diff[s] * _decay(self.family, sub)
        return out, exact_out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.to(F64) - b.to(F64)).norm() / b.to(F64).norm())


@pytest.mark.parametrize("family", list(DIMS))
@pytest.mark.parametrize("name", list(SPECS))
def test_replay_reference_matches_the_quantized_model(family, name):
    """Staggered cursors over three cycles, a pad row, fp32 activations (exact rings): the float32 reference follows
    the float64 model far closer than the quantization moves either from the unquantized recurrence."""
    spec, dims, fam = SPECS[name], DIMS[family], get_family(family)
    gen = torch.Generator().manual_seed(11)
    cache = fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=spec, act_dtype=torch.float32, device="cpu")
    slots = torch.tensor([3, 0, 4, 1], dtype=torch.int32)
    states = torch.randn(len(slots), dims.heads, dims.rows, dims.cols, generator=gen) * 0.3
    cache.load_prefill_state(0, slots, states)
    cache.layer(0).cursor[slots.long()] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)  # empty rings, staggered
    model = _Model(family, spec, states, slots.long())
    model_err = ref_err = 0.0
    constants = fam.random_step(dims, len(slots), gen, "cpu", torch.float32)
    ids = torch.cat([slots, torch.tensor([-1], dtype=torch.int32)])  # a pad row last
    for _ in range(3 * L):
        step = fam.random_step(dims, len(ids), gen, "cpu", torch.float32)
        step = type(step)(**{**step.__dict__, **{f: getattr(constants, f) for f in step.per_head_fields}})
        cursor = cache.layer(0).cursor[slots.long()].clone()
        args, kwargs = step.op_args()
        out = fam.replay_decode(cache.layer(0), *args, **kwargs, state_batch_indices=ids)
        assert out[-1].abs().max() == 0
        live = step_rows(step, list(range(len(slots))))
        y_model, y_exact = model.step(live, slots.long(), cursor == L - 1)
        model_err = max(model_err, _rel(y_model, y_exact))
        ref_err = max(ref_err, _rel(out[:-1], y_model))
    assert cache.layer(0).cursor[2] == 0  # slot 2 never used: untouched
    assert model_err > 1e-4  # the format rounds
    assert ref_err < 0.1 * model_err + 2e-5, (ref_err, model_err)


def test_mamba2_dual_fp32_master_is_the_plain_fp32_replay():
    """Dual mode with an fp32 master folds exactly what plain fp32 replay folds: the masters are bit-equal after
    every step, flush outputs are bit-equal, and the read copy is the format's encoding of the master."""
    fam, dims = get_family("mamba2"), DIMS["mamba2"]
    gen = torch.Generator().manual_seed(4)
    plain = fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype="fp32", device="cpu")
    dual = fam.new_cache(dims, 1, SLOTS, buffer_len=L, state_dtype=state_spec("nvfp4", "dual"), device="cpu")
    slots = torch.tensor([0, 2, 3], dtype=torch.int32)
    states = torch.randn(3, dims.heads, dims.rows, dims.cols, generator=gen)
    for cache in (plain, dual):
        cache.load_prefill_state(0, slots, states)
        cache.layer(0).cursor[slots.long()] = torch.tensor([0, 1, 3], dtype=torch.int32)
    constants = fam.random_step(dims, 3, gen, "cpu")
    for _ in range(2 * L + 1):
        step = fam.random_step(dims, 3, gen, "cpu")
        step = type(step)(**{**step.__dict__, **{f: getattr(constants, f) for f in step.per_head_fields}})
        flush = plain.layer(0).cursor[slots.long()] == L - 1
        args, kwargs = step.op_args()
        y_plain = fam.replay_decode(plain.layer(0), *args, **kwargs, state_batch_indices=slots)
        y_dual = fam.replay_decode(dual.layer(0), *args, **kwargs, state_batch_indices=slots)
        assert torch.equal(plain.layer(0).state, dual.layer(0).state)
        assert torch.equal(y_plain[flush], y_dual[flush])
    ckpt = dual.layer(0).checkpoint()
    g = quant.nvfp4_global_scale(plain.layer(0).state[slots.long()], (-1,))
    packed, _ = quant.quantize_nvfp4(plain.layer(0).state[slots.long()], g)
    assert torch.equal(ckpt.read.data[slots.long()], packed)


@pytest.mark.parametrize("family", list(DIMS))
def test_baseline_reference_steps_a_quantized_checkpoint(family):
    """The baseline reference on an FP8 checkpoint decodes, steps and re-encodes every token."""
    fam, dims = get_family(family), DIMS[family]
    gen = torch.Generator().manual_seed(8)
    shape = (dims.heads, dims.rows, dims.cols)
    ckpt = Checkpoint.allocate(state_spec("fp8"), SLOTS, shape, "cpu")
    slots = torch.tensor([1, 4], dtype=torch.int32)
    ckpt.store_(slots.long(), torch.randn(2, *shape, generator=gen))
    step = fam.random_step(dims, 2, gen, "cpu", torch.float32)
    expected_out, expected_state = fam.reference_step(ckpt.fold_values(slots.long()), step)
    out = torch.empty_like(expected_out, dtype=torch.float32)
    args, kwargs = step.op_args()
    if family == "mamba2":
        ref_mamba2.state_update_(ckpt, *args, kwargs["D"], None, kwargs["dt_bias"], True, slots, -1, out)
    elif family == "gdn":
        ref_gdn.state_update_(ckpt, *args, None, slots, -1, out)
    else:
        ref_kda.state_update_(ckpt, *args, None, None, slots, -1, out)
    assert _rel(out, expected_out) < 1e-5
    twin = Checkpoint.allocate(state_spec("fp8"), SLOTS, shape, "cpu")
    twin.store_(slots.long(), expected_state)
    assert _rel(ckpt.fold_values(slots.long()), twin.fold_values(slots.long())) < 1e-2


def test_quantized_layers_refuse_launch_plans():
    fam, dims = get_family("gdn"), DIMS["gdn"]
    cache = fam.new_cache(dims, 1, SLOTS, state_dtype=state_spec("fp8"), device="cpu")
    step = fam.random_step(dims, 1, torch.Generator().manual_seed(0), "cpu")
    args, kwargs = step.op_args()
    ids = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="plan"):
        fam.replay_decode(cache.layer(0), *args, **kwargs, state_batch_indices=ids,
                          plan=fam.replay_plan(fam.new_cache(dims, 1, SLOTS, device="cpu").layer(0), 1))
    with pytest.raises(ValueError, match="mode"):
        fam.replay_decode(cache.layer(0), *args, **kwargs, state_batch_indices=ids, mode="fast")
