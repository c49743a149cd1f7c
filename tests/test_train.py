"""Training of the byte-level accuracy models (trtllm_replayssm/lab/train.py) on the CPU with tiny presets: the
differentiable forward equals the inference prefill, every parameter gets a gradient, the loss falls on a repeated
text, runs are seeded, the saved directory loads back, and the accuracy presets' configs round-trip."""
from __future__ import annotations

import json

import pytest
import torch

from trtllm_replayssm.lab import train
from trtllm_replayssm.lab.layers import ops as fused
from trtllm_replayssm.lab.models.config import from_hf_config, from_preset, to_hf_config
from trtllm_replayssm.lab.models.decoder import HybridLM
from trtllm_replayssm.lab.models.weights import from_pretrained

TEXT = torch.tensor(list(("In the beginning God created the heaven and the earth. And the earth was without form, "
                          "and void. " * 30).encode()))
SETTINGS = train.TrainSettings(steps=12, batch=4, seq_len=32, lr=3e-3, warmup=2, eval_tokens=256, log_every=4)


@pytest.mark.parametrize("preset", ["tiny-nemotron", "tiny-qwen"])
def test_logits_equal_the_prefill_and_reach_every_parameter(preset):
    cfg = from_preset(preset)
    model = HybridLM.build(cfg, torch.float32, "cpu", seed=3)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    logits = model.logits(tokens)
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
    out = train.save_trained(model, record, tmp_path / preset)
    assert json.loads((out / "train.json").read_text())["heldout_loss"] == record["heldout_loss"]
    loaded = from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(loaded.logits(TEXT[None, :40]), model.logits(TEXT[None, :40]))
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
