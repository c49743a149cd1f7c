"""Property-based tests (hypothesis) of every family's replay op against the float64 recurrence: random ring
lengths, pools, batches with pads and gaps, slot reuse (prefill hand-off), cursor states and schedules that mix
replay and flush steps. CPU through the fallback; a bounded GPU variant (marker ``gpu``, build_scripts/gpu_check.sh).
"""
from __future__ import annotations

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from trtllm_replayssm.core.families import FAMILIES  # noqa: E402
from trtllm_replayssm.core.samples import random_state, step_rows, with_constants  # noqa: E402
from test_row_contract import DIMS  # noqa: E402

PAD = -1


@st.composite
def schedules(draw):
    """A family, ring length, pool size and a list of steps: (mode, batch slot ids with pads) or ("reuse", slot)."""
    name = draw(st.sampled_from(sorted(FAMILIES)))
    L = draw(st.integers(1, 6))
    slots = draw(st.integers(2, 6))
    events = []
    for _ in range(draw(st.integers(1, 3 * L + 2))):
        if draw(st.integers(0, 9)) == 0:
            events.append(("reuse", draw(st.integers(0, slots - 1))))
            continue
        active = draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=slots, unique=True))
        pads = draw(st.integers(0, min(2, slots - len(active))))  # batch <= slots: the replay scratch's rows
        ids = active + [PAD] * pads
        order = draw(st.permutations(range(len(ids))))
        events.append((draw(st.sampled_from(("replay", "replay", "flush"))), [ids[i] for i in order]))
    seed = draw(st.integers(0, 2**31 - 1))
    return name, L, slots, events, seed


def _check_schedule(name: str, L: int, slots: int, events: list, seed: int, device: str) -> None:
    fam, dims = FAMILIES[name], DIMS[name]
    gen = torch.Generator().manual_seed(seed)
    cache = fam.new_cache(dims, 1, slots, buffer_len=L, act_dtype=torch.float32, device=device)
    layer = cache.layer(0)
    layer.state.copy_(random_state(slots, dims, "fp32", gen, device))
    truth = layer.state.to(torch.float64).cpu().clone()  # float64 state of each slot after its last token
    constants = fam.random_step(dims, 1, gen, device, torch.float32)
    for mode, ids in events:
        if mode == "reuse":  # a finished sequence's slot goes to a new one: prefill hand-off of a fresh state
            fresh = random_state(1, dims, "fp32", gen, device)
            cache.load_prefill_state(0, [ids], fresh)
            truth[ids] = fresh[0].to(torch.float64).cpu()
            continue
        step = with_constants(fam.random_step(dims, len(ids), gen, device, torch.float32), constants)
        args, kwargs = step.op_args()
        idx = torch.tensor(ids, dtype=torch.int32, device=device)
        out = torch.full_like(args[0] if name == "mamba2" else args[2], float("nan"))
        w_before = cache.cursor[0].clone()
        fam.replay_decode(layer, *args, **kwargs, state_batch_indices=idx, out=out, mode=mode)
        live = [r for r, s in enumerate(ids) if s != PAD]
        pads = [r for r, s in enumerate(ids) if s == PAD]
        assert (out[pads] == 0).all()
        rows = step_rows(step, live)
        cpu_rows = type(rows)(**{k: v.cpu() for k, v in rows.__dict__.items()})
        ref_out, ref_state = fam.reference_step(truth[[ids[r] for r in live]], cpu_rows)
        got = out[live].to(torch.float64).cpu()
        err = float((got - ref_out).norm() / ref_out.norm().clamp_min(1e-30))
        assert err < 2e-4, (mode, ids, err)
        for r, s in zip(live, [ids[r] for r in live]):
            truth[s] = ref_state[live.index(r)]
            w = int(w_before[s])
            expected = 0 if (mode == "flush" or w == L - 1) else w + 1
            assert int(cache.cursor[0, s]) == expected, (mode, s, w)
    for s in range(slots):  # a slot with an empty ring holds its exact state as the checkpoint
        if int(cache.cursor[0, s]) == 0:
            ck = layer.state[s].to(torch.float64).cpu()
            assert float((ck - truth[s]).norm() / truth[s].norm()) < 2e-4, s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_replay_schedules_match_the_float64_recurrence(schedule):
    _check_schedule(*schedule, device="cpu")


@pytest.mark.gpu
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_replay_schedules_match_the_float64_recurrence_gpu(schedule):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _check_schedule(*schedule, device="cuda")
