"""Drift study: how far each checkpoint spec's state and outputs wander from a float64 recurrence over a long decode.

One recurrent layer of a model preset decodes ``steps`` tokens for ``batch`` sequences through the family's
``replay_decode`` (``mode='replay'``) once per spec, all specs fed the same tokens, beside the float64 sequential
recurrence of the same bf16 inputs. Every row starts from a zero state with cursor 0, so all rows flush on the same
steps and the checkpoint right after a flush is the state itself. Inputs follow the published configs' ranges:

* Mamba-2: A = -exp(U(0, log 16)) per head, Δ = softplus(dt + dt_bias) with dt_bias the inverse softplus of a
  log-uniform [1e-3, 1e-1] per head and dt ~ N(0, 0.5²) per token, x, B and C normal with log-normal per-channel
  scales (σ = 1; B and C over sqrt(N)), D = 0 so that an output is the state's read-out alone.
* GDN / KDA: q, k, v normal with log-normal per-channel scales (q and k are l2-normalised by the recurrence), the
  log-gate ``-softplus(a + dt_bias)`` (A_log = 0) with dt_bias the inverse softplus of a rate log-uniform in
  [1e-4, 0.105] (decay e^g from 0.9 to 0.9999) per head (GDN) or per head and key channel (KDA), a ~ N(0, 0.3²) and
  the beta logit ~ N(0, 1) per token.

Measured per spec: the relative error ``||S - S_ref|| / ||S_ref||`` of the master checkpoint (decoded to float32)
every ``state_every`` steps (a multiple of L, right after a flush), and the relative error of each step's outputs
``||y - y_ref|| / ||y_ref||`` (the outputs are bf16: about 2^-9 of error is their own rounding), summarised per
window of ``state_every`` steps (median and max). On CUDA the steps run as CUDA-graph replays (inputs drawn on the
device; quantized and stochastically rounded specs need the Mamba-2 kernels); on the CPU eagerly through the
references (every family and spec, slowly).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import StateSpec, parse_state_label
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step
from trtllm_replayssm.serving.presets import get_preset

DEFAULT_SPECS = ("fp32", "bf16", "fp16", "fp16+sr", "fp8", "fp8+sr", "fp8/dual/fp32", "nvfp4", "nvfp4/dual/fp32",
                 "nvfp4/dual/fp16", "nvfp4/dual/fp16+sr", "nvfp4/dual/fp8")
F64 = torch.float64
BF16 = torch.bfloat16


@dataclass(frozen=True)
class DriftConfig:
    """What to run: ``model`` (a preset), ``specs`` (state labels, ``StateSpec.label``), ``steps`` tokens for
    ``batch`` sequences with ring length ``buffer_len``; the state error every ``state_every`` steps."""

    model: str = "nemotron-3-nano-4b"
    specs: tuple[str, ...] = DEFAULT_SPECS
    steps: int = 131072
    batch: int = 4
    buffer_len: int = 16
    state_every: int = 1024
    seed: int = 0
    parsed: tuple[StateSpec, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        get_preset(self.model)  # ValueError naming the presets
        if not self.specs:
            raise ValueError("specs: expected at least one state spec")
        object.__setattr__(self, "parsed", tuple(parse_state_label(s, arg="specs") for s in self.specs))
        for name in ("steps", "batch", "buffer_len", "state_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.state_every % self.buffer_len or self.steps % self.state_every:
            raise ValueError(f"state_every: expected a multiple of buffer_len ({self.buffer_len}) dividing steps "
                             f"({self.steps}), got {self.state_every}")

    @property
    def family(self) -> str:
        return get_preset(self.model).family


def _log_normal(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.exp(torch.randn(*shape, generator=gen))


def _log_uniform(gen: torch.Generator, lo: float, hi: float, *shape: int) -> torch.Tensor:
    return torch.exp(torch.empty(*shape).uniform_(math.log(lo), math.log(hi), generator=gen))


class _Mamba2Stream:
    """A Mamba-2 layer's constants and per-token steps (``Mamba2Step``), drawn on ``device`` from the default
    generator there."""

    def __init__(self, dims, batch: int, gen: torch.Generator, device: torch.device):
        H, P, N, G = dims.nheads, dims.head_dim, dims.d_state, dims.n_groups
        self.shape, self.device = (batch, H, P, N, G), device
        self.A = (-torch.exp(torch.empty(H).uniform_(0.0, math.log(16.0), generator=gen))).to(device)
        self.dt_bias = torch.log(torch.expm1(_log_uniform(gen, 1e-3, 1e-1, H))).to(device)  # inverse softplus
        self.D = torch.zeros(H, device=device)  # outputs are S·C: the read-out the checkpoint's error reaches
        self.x_scale = _log_normal(gen, 1, H, P).to(device)
        self.B_scale = (_log_normal(gen, 1, G, N) / math.sqrt(N)).to(device)
        self.C_scale = (_log_normal(gen, 1, G, N) / math.sqrt(N)).to(device)

    def token(self) -> Mamba2Step:
        b, H, P, N, G = self.shape
        dev = self.device
        return Mamba2Step(x=(torch.randn(b, H, P, device=dev) * self.x_scale).to(BF16),
                          dt=0.5 * torch.randn(b, H, device=dev), A=self.A,
                          B=(torch.randn(b, G, N, device=dev) * self.B_scale).to(BF16),
                          C=(torch.randn(b, G, N, device=dev) * self.C_scale).to(BF16), D=self.D,
                          dt_bias=self.dt_bias)


class _DeltaStream:
    """A GDN or KDA layer's constants and per-token steps (``DeltaStep``), drawn on ``device`` from the default
    generator there."""

    def __init__(self, dims, batch: int, gen: torch.Generator, device: torch.device):
        self.kda = dims.per_channel_gate
        H, HV, K, V = dims.key_heads, dims.heads, dims.cols, dims.rows
        self.shape, self.device = (batch, H, HV, K, V), device
        gate_shape = (HV, K) if self.kda else (HV,)
        self.dt_bias = torch.log(torch.expm1(_log_uniform(gen, 1e-4, -math.log(0.9), *gate_shape))).to(device)
        self.A_log = torch.zeros(HV, device=device)
        self.q_scale, self.k_scale = _log_normal(gen, 1, H, K).to(device), _log_normal(gen, 1, H, K).to(device)
        self.v_scale = _log_normal(gen, 1, HV, V).to(device)

    def token(self) -> DeltaStep:
        b, H, HV, K, V = self.shape
        dev = self.device
        gate_shape = (b, HV, K) if self.kda else (b, HV)
        return DeltaStep(q=(torch.randn(b, H, K, device=dev) * self.q_scale).to(BF16),
                         k=(torch.randn(b, H, K, device=dev) * self.k_scale).to(BF16),
                         v=(torch.randn(b, HV, V, device=dev) * self.v_scale).to(BF16),
                         a=0.3 * torch.randn(*gate_shape, device=dev), b=torch.randn(b, HV, device=dev),
                         A_log=self.A_log, dt_bias=self.dt_bias)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (a.to(F64) - ref).norm() / ref.norm().clamp_min(torch.finfo(F64).tiny)


class DriftRun:
    """The caches, the float64 state and the error buffers of one study; ``step()`` decodes one token for every
    spec, ``measure_state()`` records the checkpoints' errors."""

    def __init__(self, config: DriftConfig, device: torch.device):
        self.config = config
        dims = get_preset(config.model).ssm_dims
        gen = torch.Generator().manual_seed(config.seed)
        self.stream = (_Mamba2Stream if config.family == "mamba2" else _DeltaStream)(dims, config.batch, gen, device)
        shape = (config.batch, dims.heads, dims.rows)
        self.idx = torch.arange(config.batch, dtype=torch.int32, device=device)
        self.fam = fam = family_of(dims)
        self.layers = []
        for spec in config.parsed:
            layer = fam.new_cache(dims, 1, config.batch, buffer_len=config.buffer_len, state_dtype=spec,
                                  device=device).layer(0)
            plan = fam.replay_plan(layer, config.batch, "replay") if device.type == "cuda" else None
            self.layers.append((layer, plan, torch.empty(shape, dtype=BF16, device=device)))
        self.ref_state = torch.zeros(*shape, dims.cols, dtype=F64, device=device)
        n = len(self.layers)
        self.out_err = torch.zeros(n, config.steps, dtype=F64, device=device)
        self.state_err = torch.zeros(n, config.steps // config.state_every, dtype=F64, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)          # the step being decoded
        self.k = torch.zeros(1, dtype=torch.long, device=device)          # the next state measurement

    def step(self) -> None:
        step = self.stream.token()
        y_ref, new = self.fam.reference_step(self.ref_state, step)
        self.ref_state.copy_(new)
        args, kwargs = step.op_args()
        errs = []
        for layer, plan, out in self.layers:
            self.fam.replay_decode(layer, *args, **kwargs, state_batch_indices=self.idx, out=out, plan=plan)
            errs.append(_rel(out, y_ref))
        self.out_err.index_copy_(1, self.t, torch.stack(errs)[:, None])
        self.t += 1

    def measure_state(self) -> None:
        errs = [_rel(layer.checkpoint().fold_values(self.idx.long()), self.ref_state) for layer, _, _ in self.layers]
        self.state_err.index_copy_(1, self.k, torch.stack(errs)[:, None])
        self.k += 1


def run_drift(config: DriftConfig, device: torch.device | str, progress=None) -> dict:
    """Run the study; returns the results document (``records`` of ``kind: "drift"``). ``progress(done, total)`` is
    called after each state measurement."""
    device = torch.device(device)
    if device.type == "cuda":  # every spec's kernels at once, on all CPUs (a first call would compile one by one)
        from trtllm_replayssm.core.jit.compiler import compile_all
        from trtllm_replayssm.core.jit.loader import device_arch
        from trtllm_replayssm.serving.catalog import spec_configs

        torch.cuda.manual_seed(config.seed)
        compile_all([c for spec in config.parsed for c in spec_configs(get_preset(config.model), spec, BF16)],
                    device_arch(device))
    else:
        torch.manual_seed(config.seed)
    run = DriftRun(config, device)
    every = config.state_every
    step, measure = run.step, run.measure_state
    if device.type == "cuda":
        run.step()  # the first step, eager: it loads the kernels
        torch.cuda.synchronize(device)
        step_graph, state_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(step_graph):
            run.step()
        with torch.cuda.graph(state_graph):
            run.measure_state()
        step, measure = step_graph.replay, state_graph.replay
    for i in range(config.steps):
        if i or device.type != "cuda":
            step()
        if (i + 1) % every == 0:
            measure()
            if progress is not None:
                progress(i + 1, config.steps)
    out_err = run.out_err.cpu()
    state_err = run.state_err.cpu()
    records = []
    for n, spec in enumerate(config.parsed):
        windows = out_err[n].view(-1, every)
        records.append({
            "kind": "drift", "model": config.model, "family": config.family, **spec.to_dict(), "label": spec.label,
            "steps": config.steps, "batch": config.batch, "L": config.buffer_len, "state_every": every,
            "state_steps": [every * (k + 1) for k in range(state_err.shape[1])],
            "state_rel_err": state_err[n].tolist(),
            "output_rel_err_median": windows.median(dim=1).values.tolist(),
            "output_rel_err_max": windows.amax(dim=1).tolist(),
        })
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__}
    return {"description": __doc__.split("\n\n")[0], "config": {k: getattr(config, k) for k in
            ("model", "specs", "steps", "batch", "buffer_len", "state_every", "seed")}, "environment": env,
            "records": records}


def plot_drift(doc: dict, path) -> None:
    """PNG of the state error and the per-window median output error against the step, one line per spec."""
    from trtllm_replayssm.lab.plotting import pyplot, save_figure

    plt = pyplot()
    fig, (ax_s, ax_o) = plt.subplots(1, 2, figsize=(12, 4.5))
    for rec in doc["records"]:
        ax_s.plot(rec["state_steps"], rec["state_rel_err"], label=rec["label"])
        ax_o.plot(rec["state_steps"], rec["output_rel_err_median"], label=rec["label"])
    for ax, title in ((ax_s, "master checkpoint vs float64 (after a flush)"),
                      (ax_o, f"outputs vs float64, median per {doc['config']['state_every']} steps")):
        ax.set_yscale("log")
        ax.set_xlabel("decode step")
        ax.set_ylabel("relative error")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    ax_o.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{doc['config']['model']}: drift over {doc['config']['steps']} steps", fontsize=11)
    save_figure(fig, path)
