"""Speculative decoding in the reference hybrid decoders (``HybridLM.verify_step`` / ``commit``, ``SSMStates.verify`` /
``commit``) and ``compare --spec``: every accepted token's output equals sequential standard decode of exactly the
accepted tokens, and so does the state after each commit, with random per-row acceptance (only the bonus token, all
drafts, mixed) over many windows and flushes; the per-draft-state path equals the replay verify."""
from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
import torch
from click.testing import CliRunner

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step, step_rows, with_constants
from trtllm_replayssm.lab.models import (DecodeState, HybridLM, SSMStates, acceptance_pattern, from_preset,
                                         speculative_decode)

IMPLS = ("baseline", "replay")  # per-draft states / checkpoint + ring
SSM_DIMS = {"mamba2": Mamba2Dims(nheads=4, head_dim=8, d_state=32, n_groups=2),
            "gdn": GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=8),
            "kda": KDADims(num_heads=2, head_dim=64)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _accepted(batch: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """Random counts 1..T per row; row 0 accepts every draft, row 1 none (the bonus token only)."""
    accepted = torch.randint(1, T + 1, (batch,), generator=gen)
    accepted[0], accepted[1] = T, 1
    return accepted


# ------------------------------------------------------------------------------------------------ SSMStates
def _window(steps: list[Mamba2Step | DeltaStep]) -> Mamba2Step | DeltaStep:
    """One step object whose per-token fields stack ``steps`` (one per window token) along dim 1."""
    first = steps[0]
    return replace(first, **{f.name: torch.stack([getattr(s, f.name) for s in steps], 1) for f in fields(first)
                             if f.name not in first.per_head_fields})


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("T,L", [(2, 2), (4, 4), (3, 8), (4, 16)])  # L == T: rings of 2T, every verify folds
def test_ssm_window_equals_sequential_steps_of_the_accepted_tokens(family: str, T: int, L: int) -> None:
    fam, dims = get_family(family), SSM_DIMS[family]
    gen = torch.Generator().manual_seed(T * 100 + L + len(family))
    batch, f32 = 4, torch.float32
    ssm = {impl: SSMStates(impl, 1, batch, dims, f32, f32, L, torch.device("cpu"), spec_tokens=T) for impl in IMPLS}
    start = torch.randn(batch, dims.heads, dims.rows, dims.cols, generator=gen) * 0.3
    for s in ssm.values():
        s.load_prefill(0, start)
    seq = start.double()
    constants = fam.random_step(dims, batch, gen, "cpu", f32)
    flushes = 0
    for _ in range(12):
        steps = [with_constants(fam.random_step(dims, batch, gen, "cpu", f32), constants) for _ in range(T)]
        out = {impl: torch.full((batch, T, dims.heads, dims.rows), float("nan")) for impl in IMPLS}
        before = seq.clone()
        for impl in IMPLS:
            ssm[impl].verify(0, out[impl], _window(steps))
        assert _rel(out["replay"], out["baseline"]) < 1e-5  # every window token, rejected ones included
        layer = ssm["replay"].cache.layer(0)
        for b in range(batch):
            if spec_cursor.unpack(int(layer.cursor[b]))[1] == 0:  # the verify folded: the state before the window
                flushes += 1
                assert _rel(layer.checkpoint().fold_values(torch.tensor([b]))[0], before[b]) < 1e-4
        accepted = _accepted(batch, T, gen)
        for b in range(batch):
            for t in range(int(accepted[b])):
                y, new = fam.reference_step(seq[b:b + 1], step_rows(steps[t], [b]))
                seq[b] = new[0]
                assert _rel(out["replay"][b, t], y[0]) < 1e-4, (b, t)
        for s in ssm.values():
            s.commit(0, accepted)
        assert _rel(ssm["baseline"].states[0], seq) < 1e-4  # the per-draft path keeps the live state
        for b in range(batch):
            assert spec_cursor.valid(int(layer.cursor[b]), T, layer.buffer_len)  # the next window fits
    assert flushes >= (11 * batch if L == T else 3)


def test_ssm_window_checks() -> None:
    dims = SSM_DIMS["gdn"]
    with pytest.raises(ValueError, match=r"^spec_tokens: expected a window of 1 to buffer_len = 4 tokens"):
        SSMStates("replay", 1, 2, dims, torch.float32, torch.float32, 4, torch.device("cpu"), spec_tokens=5)
    ssm = SSMStates("replay", 1, 2, dims, torch.float32, torch.float32, 4, torch.device("cpu"), spec_tokens=3)
    with pytest.raises(ValueError, match=r"^layer: SSM layer 0 has no verified window to commit"):
        ssm.commit(0, torch.tensor([1, 1]))
    step = get_family("gdn").random_step(dims, 2, torch.Generator().manual_seed(0), "cpu", torch.float32)
    with pytest.raises(ValueError, match=r"^inputs: expected a window of spec_tokens = 3 tokens"):
        ssm.verify(0, torch.empty(2, dims.heads, dims.rows), step)  # one token, not a window


# ------------------------------------------------------------------------------------------------ decoders
def _sequential(model: HybridLM, prompt: torch.Tensor, max_len: int) -> list[DecodeState]:
    """One standard-decode state per row (baseline SSM op), prefilled with the row's prompt."""
    states = []
    for row in prompt:
        state = model.allocate(1, max_len, ssm_impl="baseline")
        model.prefill(row[None], state)
        states.append(state)
    return states


@pytest.mark.parametrize("preset,T,L", [("tiny-nemotron", 4, 4), ("tiny-nemotron", 3, 8), ("tiny-qwen", 4, 4),
                                        ("tiny-qwen", 2, 6)])
def test_speculative_decode_equals_sequential_decode_of_the_accepted_tokens(preset: str, T: int, L: int) -> None:
    """Logits of every accepted token (the replay checkpoints' folds: test_ssm_window_equals_sequential_steps_of_the_
    accepted_tokens), the per-draft SSM states, the conv states and the KV lengths after each commit."""
    model = HybridLM.build(from_preset(preset), seed=3)
    gen = torch.Generator().manual_seed(T * 10 + L)
    batch, windows, vocab = 3, 10, model.cfg.vocab_size
    prompt = torch.randint(0, vocab, (batch, 3), generator=gen)
    max_len = 3 + windows * T + 1
    spec = {impl: model.allocate(batch, max_len, ssm_impl=impl, buffer_len=L, spec_tokens=T) for impl in IMPLS}
    tok = {impl: model.prefill(prompt, state).argmax(-1) for impl, state in spec.items()}
    seq = _sequential(model, prompt, max_len)
    for _ in range(windows):
        assert torch.equal(tok["baseline"], tok["replay"])
        drafts = torch.randint(0, vocab, (batch, T - 1), generator=gen)
        logits = {impl: model.verify_step(torch.cat([tok[impl][:, None], drafts], 1), state)
                  for impl, state in spec.items()}
        torch.testing.assert_close(logits["replay"], logits["baseline"], rtol=1e-4, atol=1e-4)
        window = torch.cat([tok["replay"][:, None], drafts], 1)
        accepted = _accepted(batch, T, gen)
        for impl, state in spec.items():
            model.commit(accepted, state)
            tok[impl] = logits[impl][torch.arange(batch), accepted - 1].argmax(-1)
        for b in range(batch):
            for t in range(int(accepted[b])):
                expect = model.decode_step(window[b, t:t + 1], seq[b])[0]
                torch.testing.assert_close(logits["replay"][b, t], expect, rtol=1e-4, atol=1e-4)
            _assert_same_committed_state(spec, seq[b], b, T)


@pytest.mark.parametrize("window", [6, 64])
@pytest.mark.parametrize("preset", ["tiny-nemotron", "tiny-qwen"])
def test_sliding_window_decode_equals_the_full_sequence_forward(preset: str, window: int) -> None:
    """Attention over the last 6 tokens, 40 tokens (the KV ring of 6 + MAX_WINDOW - 1 slots wraps), or over a window
    of 64, longer than the 44-slot cache: standard decode steps and speculative windows (T = 4, seeded accepted
    counts) give the logits of the whole-sequence forward with the banded causal mask."""
    model = HybridLM.build(replace(from_preset(preset), attn_window=window), seed=5)
    gen = torch.Generator().manual_seed(6)
    n, T = 40, 4
    toks = torch.randint(0, model.cfg.vocab_size, (1, n), generator=gen)
    with torch.no_grad():
        full = model.logits(toks, 16)[0]
        state = model.allocate(1, n + T, ssm_impl="baseline")
        steps = [model.prefill(toks[:, :3], state)[0]] + [model.decode_step(toks[0, i:i + 1], state)[0]
                                                          for i in range(3, n - 1)]
        torch.testing.assert_close(torch.stack(steps), full[2:n - 1], rtol=1e-4, atol=1e-4)
        spec = model.allocate(1, n + T, ssm_impl="replay", buffer_len=4, spec_tokens=T)
        model.prefill(toks[:, :3], spec)
        q = 3
        while q + T <= n:
            logits = model.verify_step(toks[:, q:q + T], spec)[0]
            a = int(torch.randint(1, T + 1, (1,), generator=gen))
            torch.testing.assert_close(logits[:a], full[q:q + a], rtol=1e-4, atol=1e-4)
            model.commit(torch.tensor([a], dtype=torch.int32), spec)
            q += a


def _assert_same_committed_state(spec: dict[str, DecodeState], seq: DecodeState, b: int, T: int) -> None:
    """Row ``b`` of the speculative states against its sequential state after a commit."""
    per_draft, replay = spec["baseline"], spec["replay"].ssm.cache
    for j, state in enumerate(seq.ssm.states):
        assert _rel(per_draft.ssm.states[j][b], state[0]) < 1e-4
        assert spec_cursor.valid(int(replay.layer(j).cursor[b]), T, replay.buffer_len)  # the next window fits
        for s in spec.values():
            torch.testing.assert_close(s.conv[j][b], seq.conv[j][0], rtol=1e-5, atol=1e-5)
    for i, kv in enumerate(seq.kv):
        assert all(int(s.kv[i].pos[b]) == int(kv.pos[0]) for s in spec.values())


@pytest.mark.parametrize("impl", IMPLS)
def test_a_reused_state_verifies_like_a_fresh_one(impl: str) -> None:
    """A second prompt on a state that ran speculative windows (slots reused) gives what a fresh state gives."""
    model = HybridLM.build(from_preset("tiny-qwen"), seed=5)
    gen = torch.Generator().manual_seed(6)
    batch, T, vocab = 2, 3, model.cfg.vocab_size

    def windows(state: DecodeState, prompt: torch.Tensor, n: int) -> list[torch.Tensor]:
        tok, out = model.prefill(prompt, state).argmax(-1), []
        for s in range(n):
            logits = model.verify_step(torch.cat([tok[:, None], drafts[s]], 1), state)
            model.commit(accepted[s], state)
            tok = logits[torch.arange(batch), accepted[s] - 1].argmax(-1)
            out.append(logits)
        return out

    drafts = torch.randint(0, vocab, (6, batch, T - 1), generator=gen)
    accepted = torch.randint(1, T + 1, (6, batch), generator=gen)
    used = model.allocate(batch, 40, ssm_impl=impl, buffer_len=5, spec_tokens=T)
    windows(used, torch.randint(0, vocab, (batch, 4), generator=gen), 6)
    prompt = torch.randint(0, vocab, (batch, 2), generator=gen)
    again = windows(used, prompt, 4)
    fresh = windows(model.allocate(batch, 40, ssm_impl=impl, buffer_len=5, spec_tokens=T), prompt, 4)
    for a, b in zip(again, fresh):
        assert torch.equal(a, b)


def test_speculative_decode_runs_both_paths_alike_and_checks_its_inputs() -> None:
    model = HybridLM.build(from_preset("tiny-nemotron"), seed=7)
    gen = torch.Generator().manual_seed(8)
    batch, T, windows = 3, 4, 8
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, 2), generator=gen)
    drafts = torch.randint(0, model.cfg.vocab_size, (windows, batch, T - 1), generator=gen)
    accepted = acceptance_pattern(T, 2.5, windows, batch, seed=1)
    runs = [speculative_decode(model, model.allocate(batch, 2 + windows * T + 1, ssm_impl=impl, buffer_len=6,
                                                     spec_tokens=T), prompt, drafts, accepted) for impl in IMPLS]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and len(runs[1].step_us) == windows
    assert (runs[0].logits - runs[1].logits).abs().max() < 1e-4
    state = model.allocate(batch, 2 + windows * T, ssm_impl="replay", buffer_len=6, spec_tokens=T)
    with pytest.raises(ValueError, match=r"^drafts: prompt \(2\) \+ windows \(8\) x 4 tokens must stay below"):
        speculative_decode(model, state, prompt, drafts, accepted)
    with pytest.raises(ValueError, match=r"^accepted: expected counts in 1..4"):
        speculative_decode(model, state, prompt, drafts[:2], torch.zeros(2, batch, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^tokens: expected shape \[3, 4\]"):
        model.verify_step(torch.zeros(batch, T - 1, dtype=torch.long), state)


@pytest.mark.parametrize("T,A", [(4, 3.0), (2, 1.5), (8, 2.2), (4, 1.0), (4, 4.0), (3, 1.7)])
def test_acceptance_pattern_has_the_mean_and_is_seeded(T: int, A: float) -> None:
    pattern = acceptance_pattern(T, A, 40, 7, seed=3)
    assert pattern.shape == (40, 7) and int(pattern.min()) >= 1 and int(pattern.max()) <= T
    assert abs(float(pattern.double().mean()) - A) <= 0.5 / pattern.numel()
    assert torch.equal(pattern, acceptance_pattern(T, A, 40, 7, seed=3))
    if 1 < A < T:  # a spread of lengths, not a constant
        assert not torch.equal(pattern, acceptance_pattern(T, A, 40, 7, seed=4))
        assert len(set(pattern.flatten().tolist())) >= 2
    with pytest.raises(ValueError, match=r"^mean_accept: expected 1 <= A <= T = 4"):
        acceptance_pattern(4, 4.5, 2, 2, seed=0)


# ------------------------------------------------------------------------------------------------ compare --spec
def test_compare_spec_writes_speculative_records(tmp_path) -> None:
    from trtllm_replayssm.cli import main

    out = tmp_path / "out"
    args = ["compare", "tiny-nemotron", "tiny-qwen", "--batch", "2", "--steps", "12", "-L", "4", "--spec", "3",
            "--mean-accept", "2", "--seed", "5", "--prompt-len", "2", "--device", "cpu", "-o", str(out)]
    result = CliRunner(env={"COLUMNS": "250"}).invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "speculative verify steps" in result.output and "replay verify tok/s" in result.output
    report = json.loads((out / "compare.json").read_text())
    assert report["settings"]["spec_tokens"] == 3 and report["settings"]["mean_accept"] == 2.0
    assert "replay_verify runs the verify and commit ops" in report["spec_note"]
    recs = report["records"]
    assert {(r["model"], r["impl"]) for r in recs} == {
        (m, i) for m in ("tiny-nemotron", "tiny-qwen") for i in ("baseline", "replay", "per_draft_verify",
                                                                  "replay_verify")}
    for r in recs:
        assert r["kind"] == "decode_step" and r["batch"] == 2 and r["median_step_us"] > 0 and r["ssm_median_us"] > 0
        speculative = r["impl"].endswith("_verify")
        assert r["spec_tokens"] == (3 if speculative else 1)
        assert r["mean_accept"] == pytest.approx(2.0 if speculative else 1.0, abs=1 / 48)
        assert r["accepted_tokens_per_s"] == pytest.approx(2 * r["mean_accept"] / (r["median_step_us"] * 1e-6))
    checks = report["checks"]
    assert sorted(c["spec_tokens"] for c in checks) == [1, 1, 3, 3]
    assert all(c["tokens_equal"] and c["max_abs_dlogits"] < 1e-4 for c in checks)


@pytest.mark.parametrize("args,message", [
    (["--spec", "9", "--mean-accept", "2"], "--spec: expected a window of 2 to 8 tokens"),
    (["--spec", "1", "--mean-accept", "1"], "--spec: expected a window of 2 to 8 tokens"),
    (["--spec", "4", "--mean-accept", "5"], "--mean-accept: expected 1 <= A <= T = 4"),
    (["--spec", "4", "--mean-accept", "0.5"], "--mean-accept: expected 1 <= A <= T = 4"),
    (["--spec", "4"], "--mean-accept: required for a speculative run"),
    (["--mean-accept", "2"], "--mean-accept: only for a speculative run"),
    (["--spec", "4", "--mean-accept", "2", "-L", "2", "--state-dtype", "bf16"],
     "--spec: a window of 4 tokens must fit the ring"),
])
def test_compare_spec_argument_errors(tmp_path, args: list[str], message: str) -> None:
    from trtllm_replayssm.cli import main

    result = CliRunner().invoke(main, ["compare", "tiny-nemotron", *args, "-o", str(tmp_path)])
    assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output
    assert len(result.output.strip().splitlines()) == 1
