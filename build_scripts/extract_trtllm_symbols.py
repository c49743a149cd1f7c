#!/usr/bin/env python3
"""Extract the TensorRT-LLM names, signatures and call-site facts trtllm_replayssm.serving.trtllm relies on into
trtllm_symbols.json.

Source: a git directory and ref (``--git-dir DIR --ref v1.4.0rc1``) or a source tree (``--source-dir DIR``; a
``REVISIONS.json`` there, ``{path: {"commit": ..}}``, is recorded as the revision of each file). Each file is parsed
with ``ast``. For every wanted class: bases, methods with signatures (defaults included), the ``self.<attr>`` names
assigned anywhere in it, its annotated class fields, and per method the keyword names of its ``self.<callee>(...)``
calls and the keys of the dicts it builds (``name = {...}`` / ``name = dict(...)``); for a function: its signature.

``IMPORTED`` are the names the module imports and whose signatures ``register`` checks against the installed
TensorRT-LLM; ``RUNTIME`` are classes whose objects the module only reads at run time (metadata, cache managers) or
whose fields the bundle's YAML sets (llm_args): recorded for the static tests, never imported. Missing names are
reported and make the script exit 1.
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

IMPORTED: dict[str, list[str]] = {
    "tensorrt_llm._torch.models.modeling_utils": ["register_auto_model"],
    "tensorrt_llm._torch.models.modeling_nemotron_h": ["NemotronHForCausalLM"],
    "tensorrt_llm._torch.models.modeling_qwen3_next": ["Qwen3NextForCausalLM"],
    "tensorrt_llm._torch.models.modeling_qwen3_5": ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"],
    "tensorrt_llm._torch.models.modeling_kimi_linear": ["KimiLinearForCausalLM"],
    "tensorrt_llm._torch.modules.mamba.mamba2_mixer": ["Mamba2Mixer"],
    "tensorrt_llm._torch.modules.mamba.gdn_mixer": ["Qwen3NextGatedDeltaNet"],
    "tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer": ["KimiKDALinearAttention"],
    "tensorrt_llm._torch.modules.mamba.causal_conv1d": ["causal_conv1d_update"],
    "tensorrt_llm._torch.modules.mamba.causal_conv1d_triton": ["causal_conv1d_update"],
}
RUNTIME: dict[str, list[str]] = {
    "tensorrt_llm._torch.models.modeling_utils": ["DecoderModelForCausalLM"],
    "tensorrt_llm._torch.attention.backends.interface": ["AttentionMetadata"],
    "tensorrt_llm._torch.modules.mamba.mamba2_metadata": ["Mamba2Metadata"],
    "tensorrt_llm._torch.pyexecutor.mamba_cache_manager": [
        "PythonMambaCacheManager", "PythonMambaCacheManager.State", "MambaHybridCacheManager",
        "CppMambaHybridCacheManager"],
    "tensorrt_llm._torch.pyexecutor.resource_manager": ["KVCacheManager"],
    "tensorrt_llm.llmapi.llm_args": ["KvCacheConfig", "BaseCudaGraphConfig", "BaseLlmArgs", "TorchLlmArgs"],
}


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``(a, b=..., *, c=...)``-style signature text of a function definition (annotations and defaults kept)."""
    return "(" + ast.unparse(fn.args) + ")"


def _self_calls(fn: ast.AST) -> dict[str, list[str]]:
    calls: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
            calls.setdefault(node.func.attr, set()).update(k.arg for k in node.keywords if k.arg)
    return {name: sorted(kws) for name, kws in sorted(calls.items())}


def _dict_keys(fn: ast.AST) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value, keys = node.value, None
        if isinstance(value, ast.Dict):
            keys = {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
            keys = {k.arg for k in value.keywords if k.arg}
        if keys:
            out.setdefault(node.targets[0].id, set()).update(keys)
    return {name: sorted(keys) for name, keys in sorted(out.items())}


def describe(tree: ast.Module | ast.ClassDef, name: str) -> dict | None:
    """The record of top-level ``name`` in ``tree``; ``Outer.Inner`` for a class nested in a class."""
    outer, _, inner = name.partition(".")
    if inner:
        parent = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == outer), None)
        return None if parent is None else describe(parent, inner)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            fns = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            attrs = sorted({t.attr for n in ast.walk(node) for t in getattr(n, "targets", [getattr(n, "target", None)])
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"})
            fields = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
            info = {"kind": "class", "bases": [ast.unparse(b) for b in node.bases],
                    "methods": {f.name: signature(f) for f in fns}, "attributes": attrs, "fields": fields}
            calls = {f.name: c for f in fns if (c := _self_calls(f))}
            dicts = {f.name: d for f in fns if (d := _dict_keys(f))}
            if calls:
                info["calls"] = calls
            if dicts:
                info["dict_keys"] = dicts
            return info
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return {"kind": "function", "signature": signature(node)}
    return None


def read_source(rel: str, git_dir: str | None, ref: str | None, source_dir: str | None) -> str:
    if source_dir:
        return (Path(source_dir) / rel).read_text()
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:{rel}"], check=True, capture_output=True,
                          text=True).stdout


def extract(wanted: dict[str, list[str]], git_dir: str | None, ref: str | None, source_dir: str | None
            ) -> tuple[dict, list[str]]:
    modules, missing = {}, []
    for module, names in wanted.items():
        tree = ast.parse(read_source(module.replace(".", "/") + ".py", git_dir, ref, source_dir))
        modules[module] = {}
        for name in names:
            info = describe(tree, name)
            if info is None:
                missing.append(f"{module}.{name}")
            else:
                modules[module][name] = info
    return modules, missing


def revisions(source_dir: str | None, ref: str | None) -> dict[str, str]:
    """The revision each file was read at: REVISIONS.json of a source tree, else the git ref."""
    paths = [m.replace(".", "/") + ".py" for m in (*IMPORTED, *RUNTIME)]
    if source_dir and (Path(source_dir) / "REVISIONS.json").is_file():
        recorded = json.loads((Path(source_dir) / "REVISIONS.json").read_text())
        return {p: recorded[p]["commit"] if isinstance(recorded.get(p), dict) else recorded.get(p, "unknown")
                for p in paths}
    return {p: ref or "unknown" for p in paths}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--git-dir", help="bare git directory of NVIDIA/TensorRT-LLM")
    src.add_argument("--source-dir", help="checkout (or per-file download) of NVIDIA/TensorRT-LLM")
    ap.add_argument("--ref", help="tag or commit with --git-dir, e.g. v1.4.0rc1")
    ap.add_argument("--version", required=True, help="TensorRT-LLM version these symbols belong to")
    ap.add_argument("--note", default="", help="how the source was obtained (recorded in the JSON)")
    ap.add_argument("-o", "--output", default=str(Path(__file__).resolve().parents[1] / "trtllm_replayssm" / "serving"
                                                  / "trtllm" / "trtllm_symbols.json"))
    args = ap.parse_args()
    if args.git_dir and not args.ref:
        ap.error("--ref is required with --git-dir")
    imported, missing = extract(IMPORTED, args.git_dir, args.ref, args.source_dir)
    runtime, missing_runtime = extract(RUNTIME, args.git_dir, args.ref, args.source_dir)
    out = {"version": args.version,
           "source": {"git_ref": args.ref, "note": args.note, "files": revisions(args.source_dir, args.ref)},
           "modules": {"tensorrt_llm": {"__version__": {"kind": "attribute"}}, **imported},
           "runtime": runtime}
    Path(args.output).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    for name in missing + missing_runtime:
        print(f"missing: {name}", file=sys.stderr)
    return 1 if missing or missing_runtime else 0


if __name__ == "__main__":
    sys.exit(main())
