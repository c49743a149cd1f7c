"""The ``build`` bundle: kernels/, trtllm_module/, trtllm-serve.yaml, manifest.json, README.md.

Everything is written into a temporary sibling directory and renamed into place at the end, so a failed build
leaves nothing behind. Works without a GPU: NVRTC compiles cubins for the target arch on the CPU.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Callable

from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.serving.memory_plan import MemoryPlan
from trtllm_replayssm.serving.presets import ModelSpec
from trtllm_replayssm.serving.speculative import SERVED_BY, VERIFY_NOTE, speculative_config, upstream_mtp_hazard
from trtllm_replayssm.serving.trtllm.core import SUPPORTED_TRTLLM_VERSIONS

MANIFEST = "manifest.json"
SERVE_YAML = "trtllm-serve.yaml"
MODULE_DIR = "trtllm_module"
KERNEL_DIR = "kernels"
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Families whose mixers the TensorRT-LLM module replaces (KDA where the TensorRT-LLM release has Kimi-Linear).
SERVED_FAMILIES = ("mamba2", "gdn", "kda")
TRTLLM_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # mamba_ssm_cache_dtype spellings


def toolkit_version() -> str:
    try:
        return metadata.version("trtllm-replayssm")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_refusal(state: StateSpec, spec_tokens: int | None) -> str | None:
    """Why a bundle cannot serve ``state`` with ``spec_tokens`` MTP draft tokens, or None. Every state spec is served
    for every family (TensorRT-LLM's pool holds the plain checkpoint, the master or the FP8/NVFP4 codes:
    ``memory_plan.pool_holds``); speculative verify reads plain checkpoints only."""
    if spec_tokens and state.stored:
        return (f"{state.label} state: speculative verify (--spec-tokens) reads plain fp32, fp16 or bf16 checkpoints "
                "rounded to nearest; build without --spec-tokens or with such a state")
    return None


def _state_dict(mp: MemoryPlan) -> dict:
    """The manifest's ``state``: the StateSpec, a summary and what TensorRT-LLM's SSM pool holds."""
    return {**mp.state.to_dict(), "label": mp.state.label, "summary": mp.state.summary,
            "trtllm_pool_dtype": mp.pool_dtype, "trtllm_pool_holds": mp.pool_holds, "trtllm_note": mp.trtllm_note}


def _speculative_dict(spec: ModelSpec, mp: MemoryPlan) -> dict | None:
    """The manifest's ``speculative``: the draft tokens, window, ring size and YAML config, who serves it and how
    and, where upstream's MTP replay is not safe for the model, the hazard; None without speculative decoding."""
    if mp.spec_tokens is None:
        return None
    return {"spec_tokens": mp.spec_tokens, "window_tokens": mp.spec_tokens + 1, "ring_len": mp.ring_len,
            "speculative_config": speculative_config(mp.spec_tokens), "served_by": SERVED_BY, "note": VERIFY_NOTE,
            "upstream_mtp_hazard": upstream_mtp_hazard(spec)}


def _byte_model_text(state: StateSpec) -> str:
    """The byte model's formulas (core/byte_model.py) for the manifest."""
    if state.dual:
        return ("baseline 2|M| + io; replay ((L-1)|R| + 2|M| + |R|)/L + ring read + append + io "
                "(M master, R read copy)")
    return "baseline 2|S| + io; replay |S|(1+1/L) + ring read + append + io"


def manifest_dict(spec: ModelSpec, mp: MemoryPlan, arch: str, kernels: list[dict], model_path: str | None) -> dict:
    """The manifest: toolkit version, target, model, per-layer plan, L, dtypes and state storage, memory plan,
    byte-model speed-up."""
    return {
        "toolkit_version": toolkit_version(),
        "target": {"gpu": mp.gpu, "arch": arch, "tp_size": mp.tp_size, "gpu_memory_bytes": mp.gpu_memory_bytes},
        "model": {"name": spec.name, "architecture": spec.architecture, "path": model_path, "source": spec.source},
        "buffer_len": mp.buffer_len,
        "spec_tokens": mp.spec_tokens,
        "speculative": _speculative_dict(spec, mp),
        "dtypes": {"state": mp.state.label, "activation": mp.act_dtype},
        "state": _state_dict(mp),
        "plan": {
            "family": spec.family,
            "ssm_dims": asdict(spec.ssm_dims),
            "local_heads": mp.layer.local_heads,
            "layers": [{"index": lp.index, "kind": lp.kind, "ffn": lp.ffn} for lp in spec.layers],
            "ssm_layers": spec.ssm_layers,
            "served_by_trtllm_module": spec.family in SERVED_FAMILIES,
        },
        "memory": {
            "ring_len": mp.ring_len,
            "per_layer_per_seq": {"checkpoint": mp.layer.checkpoint, "upstream_state": mp.layer.upstream_state,
                                  "our_state": mp.layer.our_state, "ring": mp.layer.ring,
                                  "cursors": mp.layer.cursors, "conv": mp.layer.conv},
            "per_seq_replay": mp.per_seq_replay,
            "per_seq_upstream": mp.per_seq_upstream,
            "ring_bytes_per_gpu": mp.ring_bytes_per_gpu,
            "reserve_bytes_per_gpu": mp.reserve_bytes_per_gpu,
            "max_batch_size": mp.max_batch_size,
            "max_concurrent_seqs_replay": mp.max_seqs_replay,
            "max_concurrent_seqs_upstream": mp.max_seqs_upstream,
            "free_gpu_memory_fraction": mp.free_gpu_memory_fraction,
        },
        "prediction": {"bytes_per_step_baseline": mp.step.baseline, "bytes_per_step_replay": mp.step.replay,
                       "ssm_layer_speedup": round(mp.step.speedup, 4),
                       "model": _byte_model_text(mp.state)},
        "kernels": kernels,
        "trtllm_versions": list(SUPPORTED_TRTLLM_VERSIONS),
    }


def _pool_comment(mp: MemoryPlan) -> str:
    """What the YAML's ``mamba_ssm_cache_dtype`` sets, for its comment."""
    if mp.pool_holds == "checkpoint":
        return "Checkpoint dtype"
    if mp.pool_holds == "master":
        return f"Dtype of the master checkpoint; the {mp.state.format} read copy is in our cache"
    rest = "their scales and the read copy are" if mp.state.dual else "their scales are"
    return f"Holds our {mp.state.checkpoint_format.name} codes (bf16: the smallest pool); {rest} in our cache"


def serve_yaml(spec: ModelSpec, mp: MemoryPlan) -> str:
    """The LLM-API options file (``trtllm-serve --extra_llm_api_options``) with comments."""
    sizes = [s for s in CUDA_GRAPH_BATCH_SIZES if s < mp.max_batch_size] + [mp.max_batch_size]
    gib = mp.reserve_bytes_per_gpu / (1 << 30)
    copies = " and our state" if mp.layer.our_state else ""
    return f"""# trtllm-serve --extra_llm_api_options file for {spec.name} with ReplaySSM decode (trtllm-replayssm {toolkit_version()}).
# Generated by `trtllm-replayssm build`; target {mp.gpu}, TP {mp.tp_size}, ring length L={mp.buffer_len}.
max_batch_size: {mp.max_batch_size}
tensor_parallel_size: {mp.tp_size}
cuda_graph_config:
  # Decode steps run as CUDA graphs; the replay kernels advance their ring cursors on the device.
  enable_padding: true
  batch_sizes: [{", ".join(str(s) for s in sizes)}]
kv_cache_config:
  # Required: with ReplaySSM the SSM state cache holds a checkpoint, not the live state, so prefix-cache
  # snapshots of it would be wrong.
  enable_block_reuse: false
  # Required: the V2 cache manager may move a live request to another slot, which the rings would not follow.
  use_kv_cache_manager_v2: false
  # {_pool_comment(mp)}; the rings hold activations ({mp.act_dtype}) and fp32 gates.
  mamba_ssm_cache_dtype: {TRTLLM_DTYPES[mp.pool_dtype]}
  # TensorRT-LLM does not count the rings{copies} ({gib:.2f} GiB for {mp.max_batch_size}+1 slots on each GPU) when
  # it sizes its caches, so this is lowered from 0.9 to keep that memory free.
  free_gpu_memory_fraction: {mp.free_gpu_memory_fraction}
{_speculative_yaml(mp)}"""


def _speculative_yaml(mp: MemoryPlan) -> str:
    """The YAML's ``speculative_config`` (MTP with ``mp.spec_tokens`` drafts), or a comment that none is set."""
    if mp.spec_tokens is None:
        return ("# Speculative decoding (speculative_config) needs a bundle built with --spec-tokens: set here, the "
                "module falls\n# back to upstream kernels for the whole model and logs a warning.\n")
    body = "".join(f"  {k}: {v}\n" for k, v in speculative_config(mp.spec_tokens).items())
    return (f"# MTP with {mp.spec_tokens} draft tokens (verify windows of {mp.spec_tokens + 1}). max_draft_len is the "
            f"draft count in\n# TensorRT-LLM's llm_args.py @00043967, where num_nextn_predict_layers is its deprecated "
            f"alias; older\n# releases read num_nextn_predict_layers. The module verifies these windows in every SSM "
            f"layer.\n"
            f"speculative_config:\n{body}")


MODULE_INIT = '''"""trtllm-serve --custom_module_dirs entry: registers the ReplaySSM model classes for this bundle."""
from pathlib import Path

import trtllm_replayssm.serving.trtllm

MANIFEST_PATH = Path(__file__).resolve().parent.parent / "manifest.json"
REGISTERED = trtllm_replayssm.serving.trtllm.register(MANIFEST_PATH)
'''


def readme(spec: ModelSpec, mp: MemoryPlan, out_dir: Path, model_path: str | None) -> str:
    model_arg = model_path or f"<local dir or HF id of {spec.name}>"
    d = out_dir.resolve()
    note = ("" if spec.family in SERVED_FAMILIES else
            f"\nNote: {spec.family} models get kernels and a plan; the TensorRT-LLM module does not replace their "
            f"mixers yet, so serving runs upstream kernels.\n")
    return f"""# ReplaySSM bundle: {spec.name} on {mp.gpu} (TP {mp.tp_size}, L={mp.buffer_len})

Built with:

    trtllm-replayssm build {spec.name if model_path is None else model_path} --gpu {mp.gpu} -o {out_dir}

The module in `{MODULE_DIR}/` imports `trtllm_replayssm`: install trtllm-replayssm {toolkit_version()} into the
Python environment that runs TensorRT-LLM ({" or ".join(SUPPORTED_TRTLLM_VERSIONS)}).

Serve:

    trtllm-replayssm serve {d} --model {model_arg}
    # the same, by hand:
    trtllm-serve {model_arg} --extra_llm_api_options {d / SERVE_YAML} --custom_module_dirs {d / MODULE_DIR}

Benchmark (baseline: the same command without `--custom_module_dirs`, or with TRTLLM_REPLAYSSM_DISABLE=1). First a
dataset of 512 requests of 1024 input and 1024 output tokens (the tokenizer comes from `-m`):

    trtllm-bench -m {model_arg} prepare-dataset --output data.jsonl token-norm-dist \\
        --num-requests 512 --input-mean 1024 --input-stdev 0 --output-mean 1024 --output-stdev 0
    trtllm-bench -m {model_arg} throughput --dataset data.jsonl --backend pytorch \\
        --extra_llm_api_options {d / SERVE_YAML} --custom_module_dirs {d / MODULE_DIR} \\
        --max_batch_size {mp.max_batch_size} --concurrency {mp.max_batch_size}

(`trtllm-bench latency` takes no `--custom_module_dirs`: measure batch 1 with `throughput --concurrency 1`.)

Predicted SSM-layer speed-up (byte model): {mp.step.speedup:.2f}x. Recurrent memory per sequence:
{mp.per_seq_replay / 2**20:.1f} MiB with rings vs {mp.per_seq_upstream / 2**20:.1f} MiB upstream.
See manifest.json for the plan.
{note}"""


Progress = Callable[[int, int, str], None]


def compile_kernels(spec: ModelSpec, arch: str, state: StateSpec | str, act_dtype: str, tp_size: int, dest: Path,
                    progress: Progress | None = None) -> list[dict]:
    """Compile the spec's kernel configs for ``arch`` and copy the cubins into ``dest``; return manifest entries."""
    from trtllm_replayssm.core.jit import compiler
    from trtllm_replayssm.serving.catalog import spec_configs

    cfgs = spec_configs(spec, state, act_dtype, tp_size)
    done = 0

    def advance(cfg) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, len(cfgs), cfg.name)

    compiled = compiler.compile_all(cfgs, arch, progress=advance)
    dest.mkdir(parents=True, exist_ok=True)
    entries = []
    for cfg, result in zip(cfgs, compiled):
        target = dest / f"{cfg.name}.cubin"
        shutil.copyfile(result.cubin_path, target)
        entries.append({"name": cfg.name, "file": f"{KERNEL_DIR}/{target.name}", "source": cfg.source,
                        "kernels": list(cfg.kernels), "defines": cfg.defines})
    return entries


def is_bundle(path: Path) -> bool:
    """True if ``path`` is a directory holding a manifest written by ``write_bundle``."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"toolkit_version", "plan", "kernels"} <= manifest.keys()


def _protected_reason(path: Path) -> str | None:
    """Why ``path`` (resolved) must never be replaced, or None."""
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if path == Path(path.anchor):
        return "it is the filesystem root"
    if path == cwd:
        return "it is the working directory"
    if path in cwd.parents:
        return "it contains the working directory"
    if path == home or path in home.parents or path.parent.name == "home":
        return "it is a home directory"
    return None


def check_output_dir(out_dir: Path, force: bool) -> None:
    """ValueError (naming ``output``) unless a bundle may be written to ``out_dir``: it must not exist, or, with
    ``force``, be an existing bundle (or an empty directory) that is not the root, a home directory or the working
    directory or one of its parents."""
    path = Path(out_dir)
    if not path.exists() and not path.is_symlink():
        return
    shown = str(out_dir)
    if not path.is_dir():
        raise ValueError(f"output: {shown!r} is a file, not a bundle directory")
    if not force:
        raise ValueError(f"output: {shown!r} exists; pass --force to replace the bundle there")
    reason = _protected_reason(path.resolve())
    if reason:
        raise ValueError(f"output: refusing to replace {shown!r}: {reason}")
    if not is_bundle(path) and any(path.iterdir()):
        raise ValueError(f"output: refusing to replace {shown!r}: it is not a trtllm-replayssm bundle (no "
                         f"{MANIFEST} of ours); --force replaces only bundles")


def _swap_into_place(new: Path, out_dir: Path) -> None:
    """Rename ``new`` to ``out_dir``; an existing ``out_dir`` is renamed aside first and removed only afterwards."""
    if not out_dir.exists():
        new.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    old.rmdir()
    out_dir.rename(old)
    try:
        new.rename(out_dir)
    except BaseException:
        old.rename(out_dir)
        raise
    shutil.rmtree(old)


def write_bundle(spec: ModelSpec, mp: MemoryPlan, arch: str, out_dir: Path, *, model_path: str | None = None,
                 force: bool = False, progress: Progress | None = None) -> Path:
    """Write the bundle to ``out_dir`` atomically: into a new directory beside it, then renamed into place; an
    existing bundle there is replaced only with ``force`` (see :func:`check_output_dir`). NotImplementedError, before
    anything is written, for a state the bundle cannot serve (:func:`build_refusal`)."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force)
    if reason := build_refusal(mp.state, mp.spec_tokens):
        raise NotImplementedError(reason)
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        kernels = compile_kernels(spec, arch, mp.state, mp.act_dtype, mp.tp_size, tmp / KERNEL_DIR, progress)
        (tmp / MODULE_DIR).mkdir()
        (tmp / MODULE_DIR / "__init__.py").write_text(MODULE_INIT)
        (tmp / SERVE_YAML).write_text(serve_yaml(spec, mp))
        (tmp / MANIFEST).write_text(json.dumps(manifest_dict(spec, mp, arch, kernels, model_path), indent=2) + "\n")
        (tmp / "README.md").write_text(readme(spec, mp, out_dir, model_path))
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700
        _swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
