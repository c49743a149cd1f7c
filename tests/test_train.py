"""Training of the byte-level accuracy models (trtllm_replayssm/lab/train.py) on the CPU with tiny presets: the
chunked scans equal the float64 recurrences, the differentiable forward equals the inference prefill, every parameter
gets a gradient, the loss falls on a repeated text, runs are seeded, the saved directory loads back, and the accuracy
presets' configs round-trip."""
from __future__ import annotations

import json

import pytest
import torch

from trtllm_replayssm.lab import train
from trtllm_replayssm.lab.layers import ops as fused
from trtllm_replayssm.lab.models.config import from_hf_config, from_preset, to_hf_config
from trtllm_replayssm.lab.models.decoder import HybridLM
from trtllm_replayssm.lab.models.mixers import gdn_chunk_scan, l2norm, mamba2_chunk_scan
from trtllm_replayssm.lab.models.weights import from_pretrained

TEXT = torch.tensor(list(("In the beginning God created the heaven and the earth. And the earth was without form, "
                          "and void. " * 30).encode()))
SETTINGS = train.TrainSettings(steps=12, batch=4, seq_len=32, lr=3e-3, warmup=2, eval_tokens=256, log_every=4,
                               chunk=16)


def _mamba2_float64(x, delta, A, B, C, D):
    """The Mamba-2 recurrence token by token in float64: y [b,T,H,P], final state [b,H,P,N]."""
    rep = x.shape[2] // B.shape[2]
    Bh, Ch = B.double().repeat_interleave(rep, 2), C.double().repeat_interleave(rep, 2)
    state = torch.zeros(*x.shape[:1], x.shape[2], x.shape[3], B.shape[-1], dtype=torch.float64)
    ys = []
    for t in range(x.shape[1]):
        dt = delta[:, t].double()
        state = state * torch.exp(A.double() * dt)[..., None, None] + \
            (dt[..., None] * x[:, t].double())[..., None] * Bh[:, t, :, None, :]
        ys.append((state * Ch[:, t, :, None, :]).sum(-1) + D.double()[:, None] * x[:, t].double())
    return torch.stack(ys, 1), state


def _gdn_float64(q, k, v, g, beta, scale):
    """The gated delta rule token by token in float64: o [b,T,HV,V], final state [b,HV,V,K]."""
    rep = v.shape[2] // q.shape[2]
    qh, kh = q.double().repeat_interleave(rep, 2), k.double().repeat_interleave(rep, 2)
    state = torch.zeros(v.shape[0], v.shape[2], v.shape[3], q.shape[-1], dtype=torch.float64)
    outs = []
    for t in range(v.shape[1]):
        state = state * torch.exp(g[:, t].double())[..., None, None]
        u = beta[:, t].double()[..., None] * (v[:, t].double() - (state * kh[:, t, :, None, :]).sum(-1))
        state = state + u[..., None] * kh[:, t, :, None, :]
        outs.append((state * (qh[:, t] * scale)[:, :, None, :]).sum(-1))
    return torch.stack(outs, 1), state


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_chunked_scans_equal_the_float64_recurrence(chunk):
    """37 tokens (a partial last chunk), grouped heads, decays from none to strong."""
    gen = torch.Generator().manual_seed(chunk)
    b, t = 2, 37
    x, A = torch.randn(b, t, 4, 8, generator=gen), -torch.rand(4, generator=gen) * 4
    delta = torch.rand(b, t, 4, generator=gen) * 0.5
    B, C = (torch.randn(b, t, 2, 16, generator=gen) * 0.3 for _ in range(2))
    D = torch.randn(4, generator=gen)
    y, state = mamba2_chunk_scan(x, delta, A, B, C, D, chunk)
    y64, state64 = _mamba2_float64(x, delta, A, B, C, D)
    assert _rel(y, y64) < 1e-6 and _rel(state, state64) < 1e-6
    q, k = (l2norm(torch.randn(b, t, 1, 16, generator=gen)) for _ in range(2))
    v, g = torch.randn(b, t, 2, 8, generator=gen), -torch.rand(b, t, 2, generator=gen) * 2
    beta = torch.rand(b, t, 2, generator=gen)
    o, state = gdn_chunk_scan(q, k, v, g, beta, 0.25, chunk)
    o64, state64 = _gdn_float64(q, k, v, g, beta, 0.25)
    assert _rel(o, o64) < 1e-5 and _rel(state, state64) < 1e-5


@pytest.mark.parametrize("preset", ["tiny-nemotron", "tiny-qwen"])
@pytest.mark.parametrize("chunk", [None, 8])
def test_logits_equal_the_prefill_and_reach_every_parameter(preset, chunk):
    cfg = from_preset(preset)
    model = HybridLM.build(cfg, torch.float32, "cpu", seed=3)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    logits = model.logits(tokens, chunk)
    last = model.prefill(tokens, model.allocate(2, 24))
    assert torch.allclose(logits[:, -1], last, atol=1e-4, rtol=1e-4)
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_fused_ops_refuse_an_in_place_residual_under_autograd():
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(ValueError, match=r"^residual: the in-place residual add is inference-only"):
        fused.rms_norm(x, torch.ones(8), 1e-5, residual=torch.zeros(2, 8))


@pytest.mark.parametrize("preset", ["tiny-nemotron", "tiny-qwen"])
def test_training_lowers_the_loss_and_is_seeded(preset, tmp_path):
    cfg = from_preset(preset)
    model, record = train.train_model(cfg, TEXT, {"held": TEXT[:400]}, SETTINGS, "cpu", log=lambda _: None)
    losses = [c["loss"] for c in record["curve"]]
    assert losses[-1] < 0.5 * losses[0], losses
    assert record["heldout_loss"]["held"] < losses[0]
    _, again = train.train_model(cfg, TEXT, {"held": TEXT[:400]}, SETTINGS, "cpu", log=lambda _: None)
    assert [c["loss"] for c in again["curve"]] == losses
    assert again["weights_sha256"] == record["weights_sha256"] == train.weights_digest(model)
    kept = model.lm_head.weight.data[0, 0].item()
    model.lm_head.weight.data[0, 0] = kept + 1e-3
    assert train.weights_digest(model) != record["weights_sha256"]
    model.lm_head.weight.data[0, 0] = kept
    assert not torch.are_deterministic_algorithms_enabled()  # torch's settings restored
    out = train.save_trained(model, record, tmp_path / preset, dtype=torch.float32, shard_bytes=1 << 20)
    assert json.loads((out / "train.json").read_text())["heldout_loss"] == record["heldout_loss"]
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    loaded = from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(loaded.logits(TEXT[None, :40]), model.logits(TEXT[None, :40]))
    bf16 = from_pretrained(train.save_trained(model, record, tmp_path / "bf16"), dtype=torch.bfloat16)
    assert torch.equal(dict(bf16.named_parameters())["lm_head.weight"],
                       model.lm_head.weight.detach().to(torch.bfloat16))
    with pytest.raises(FileExistsError):
        train.save_trained(model, record, tmp_path / preset)


@pytest.mark.parametrize("preset", ["byte-nemotron", "byte-qwen", "tiny-nemotron", "tiny-qwen"])
def test_hf_config_round_trip(preset):
    cfg = from_preset(preset)
    assert from_hf_config(to_hf_config(cfg), name=cfg.name) == cfg


def test_settings_and_inputs_are_checked():
    with pytest.raises(ValueError, match=r"^warmup: expected 0..steps=4"):
        train.TrainSettings(steps=4, warmup=5)
    with pytest.raises(ValueError, match=r"^train_tokens: expected more than seq_len \+ 1 = 33 tokens"):
        train.train_model(from_preset("tiny-qwen"), TEXT[:20], {}, SETTINGS, "cpu")
    assert train.learning_rate(0, SETTINGS) == pytest.approx(SETTINGS.lr / 2)
    assert train.learning_rate(SETTINGS.steps - 1, SETTINGS) == pytest.approx(0.1 * SETTINGS.lr, rel=0.05)
