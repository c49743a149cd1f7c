"""The custom ops' CUDA bodies on the CPU, up to the driver: each family's replay op (plain and stored, every mode),
state-update op and verify op packs its parameter struct and launches the kernels its plan names from the modules
the plan's row tiles select.
The loader's ``get_kernel`` / ``launch`` (and the shared-memory attributes) are replaced by a recorder, so these tests
check the Python between an op and the driver (``core/ops/launch.run_plan``), not the kernels
(tests/test_*_gpu.py run those)."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from trtllm_replayssm.core.families import FAMILIES
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.ops import delta, gdn, kda, launch, mamba2, mamba2_spec
from trtllm_replayssm.core.plans import Device, Launch, Tuning
from trtllm_replayssm.core.samples import fill_rings_, random_state, slot_indices
from trtllm_replayssm.serving.presets import get_preset

H200 = Device(132, 9)
OPS = (mamba2, gdn, kda)


class Recorder:
    """Stands in for the loader: kernels are (module, name) pairs that must exist; launches are kept with the struct
    fields the plan writes."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.shared: dict[str, int] = {}

    def get_kernel(self, config, name: str, device) -> tuple[str, str]:
        assert name in config.kernels, (config.name, name)
        return config.name, name

    def allow_dynamic_shared(self, function, shared: int) -> None:
        self.shared[function[1]] = shared

    def launch(self, function, grid, block, params, shared_bytes: int = 0, programmatic: bool = False) -> None:
        if shared_bytes:
            assert self.shared.get(function[1], 0) >= shared_bytes, (function, shared_bytes)
        self.launches.append(dict(kernel=function[1], grid=tuple(grid), block=tuple(block), shared=shared_bytes,
                                  programmatic=programmatic, stages=params.stages, l2_hints=params.l2_hints))


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    rec = Recorder()
    for name in ("get_kernel", "allow_dynamic_shared", "launch"):
        monkeypatch.setattr(launch, name, getattr(rec, name))
    monkeypatch.setattr(launch, "prefer_max_shared", lambda function: None)
    for ops in OPS:  # the ops' dispatch goes to their CUDA bodies
        monkeypatch.setattr(ops, "_replay_op", ops._replay_cuda)
        monkeypatch.setattr(ops, "_replay_stored_op", ops._replay_stored_cuda)
        monkeypatch.setattr(ops, "_state_update_op", ops._state_update_cuda)
        monkeypatch.setattr(ops, "_state_update_stored_op", ops._state_update_stored_cuda)
    for ops in (mamba2_spec, gdn, kda):
        monkeypatch.setattr(ops, "_verify_op", ops._verify_cuda)
    return rec


CASES = [("nemotron-3-super-120b", "fp32", "fused", Tuning(fused_heads_per_cta=4, stages=3)),
         ("nemotron-3-nano-4b", "fp32", "fused", Tuning(fused_heads_per_cta=2))]
CASES += [(model, state, mode, Tuning()) for model in ("nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b")
          for state in ("fp32", "nvfp4/dual/fp16") for mode in ("flush", "fused", "replay")]


@pytest.mark.parametrize("model,state,mode,tuning", CASES)
def test_replay_op_launches_what_its_plan_says(recorder, model, state, mode, tuning):
    dims = get_preset(model).ssm_dims
    fam = FAMILIES[type(dims).__name__.removesuffix("Dims").lower()]
    batch, gen = 8, torch.Generator().manual_seed(0)
    spec = parse_state_label(state)
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=16, state_dtype=spec, device="cpu").layer(0)
    if spec.mode == "plain":
        layer.state.copy_(random_state(batch + 1, dims, "fp32", gen, "cpu"))
    fill_rings_(layer, gen)
    idx = slot_indices(batch, gen, "cpu")
    plan = fam.replay_plan(layer, batch, mode, tuning, device=H200)
    args, kwargs = fam.random_step(dims, batch, gen, "cpu", torch.bfloat16).op_args()
    fam.replay_decode(layer, *args, **kwargs, state_batch_indices=idx, plan=plan)
    words = Launch.from_words(plan.words)
    names = mamba2.KERNELS if fam.name == "mamba2" else delta.KERNELS
    want = [dict(kernel=names[step.kernel], grid=step.grid, block=step.block, shared=step.shared,
                 programmatic=step.programmatic, stages=words.stages if mode != "flush" else 0,
                 l2_hints=int(words.l2_hints))
            for step in launch.plan_launches(words)]
    assert recorder.launches == want
    if tuning.fused_heads_per_cta:
        assert recorder.launches[0]["kernel"] == "mamba2_fused_stream_kernel" and recorder.launches[0]["stages"] > 1


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b"])
@pytest.mark.parametrize("state", ["fp32", "nvfp4"])
def test_state_update_op_launches_what_its_plan_says(recorder, model, state):
    """The baseline step on a plain pool and on a stored checkpoint: one state-kernel launch, as its plan says."""
    dims = get_preset(model).ssm_dims
    fam = FAMILIES[type(dims).__name__.removesuffix("Dims").lower()]
    batch, gen = 8, torch.Generator().manual_seed(2)
    spec = parse_state_label(state)
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=16, state_dtype=spec, device="cpu").layer(0)
    pool = layer.require_state() if spec.mode == "plain" else layer.checkpoint()
    plan = fam.state_update_plan(pool, batch, torch.bfloat16, device=H200)
    args, kwargs = fam.random_step(dims, batch, gen, "cpu", torch.bfloat16).op_args()
    fam.state_update(pool, *args, **kwargs, state_batch_indices=slot_indices(batch, gen, "cpu"), plan=plan)
    names = mamba2.KERNELS if fam.name == "mamba2" else delta.KERNELS
    (step,) = launch.plan_launches(Launch.from_words(plan.words))
    assert [(r["kernel"], r["grid"], r["programmatic"]) for r in recorder.launches] == \
        [(names["state"], step.grid, step.programmatic)]


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b"])
@pytest.mark.parametrize("batch", [1, 8, 256])
def test_verify_op_launches_what_its_plan_says(recorder, model, batch):
    """A window of T = 4 tokens: the verify op's launches are its plan's, from modules that hold them."""
    dims = get_preset(model).ssm_dims
    fam = FAMILIES[type(dims).__name__.removesuffix("Dims").lower()]
    T, gen = 4, torch.Generator().manual_seed(1)
    layer = fam.new_cache(dims, 1, batch + 1, buffer_len=20, device="cpu").layer(0)
    step = fam.random_step(dims, batch * T, gen, "cpu", torch.bfloat16)
    step = replace(step, **{f.name: getattr(step, f.name).unflatten(0, (batch, T)) for f in fields(step)
                            if f.name not in step.per_head_fields})
    args, kwargs = step.op_args()
    planner = mamba2_spec.verify_plan if fam.name == "mamba2" else delta.verify_plan
    plan = planner(layer, batch, T, device=H200)
    fam.verify_step(layer, *args, **kwargs, state_batch_indices=slot_indices(batch, gen, "cpu"), plan=plan)
    steps = launch.plan_launches(Launch.from_words(plan.words))
    assert [(r["grid"], r["block"], r["shared"], r["programmatic"]) for r in recorder.launches] == \
        [(s.grid, s.block, s.shared, s.programmatic) for s in steps]
