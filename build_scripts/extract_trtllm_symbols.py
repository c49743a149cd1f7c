#!/usr/bin/env python3
"""Extract the TensorRT-LLM names and signatures trtllm_replayssm.serving.trtllm relies on into trtllm_symbols.json.

Source: a git directory and tag (``--git-dir DIR --ref v1.4.0rc1``, e.g. from a bare clone) or a source tree
(``--source-dir DIR``). For each module in SYMBOLS it parses the file with ``ast`` and records, for every wanted
name, whether it is a class (its methods with signatures and the ``self.<attr>`` names assigned anywhere in it) or a
function (its signature). Missing names are reported and make the script exit 1.
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

SYMBOLS: dict[str, list[str]] = {
    "tensorrt_llm._torch.models.modeling_utils": ["register_auto_model"],
    "tensorrt_llm._torch.models.modeling_nemotron_h": ["NemotronHForCausalLM"],
    "tensorrt_llm._torch.models.modeling_qwen3_next": ["Qwen3NextForCausalLM"],
    "tensorrt_llm._torch.models.modeling_qwen3_5": ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"],
    "tensorrt_llm._torch.modules.mamba.mamba2_mixer": ["Mamba2Mixer"],
    "tensorrt_llm._torch.modules.mamba.gdn_mixer": ["Qwen3NextGatedDeltaNet"],
    "tensorrt_llm._torch.modules.mamba.causal_conv1d": ["causal_conv1d_update"],
}


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``(a, b=..., *, c=...)``-style signature text of a function definition."""
    return "(" + ast.unparse(fn.args) + ")"


def describe(tree: ast.Module, name: str) -> dict | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            methods = {n.name: signature(n) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            attrs = sorted({t.attr for n in ast.walk(node) for t in getattr(n, "targets", [getattr(n, "target", None)])
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"})
            return {"kind": "class", "bases": [ast.unparse(b) for b in node.bases], "methods": methods,
                    "attributes": attrs}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return {"kind": "function", "signature": signature(node)}
    return None


def read_source(module: str, git_dir: str | None, ref: str | None, source_dir: str | None) -> str:
    rel = module.replace(".", "/") + ".py"
    if source_dir:
        return (Path(source_dir) / rel).read_text()
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:{rel}"], check=True, capture_output=True,
                          text=True).stdout


def extract(git_dir: str | None, ref: str | None, source_dir: str | None) -> tuple[dict, list[str]]:
    modules, missing = {}, []
    for module, names in SYMBOLS.items():
        tree = ast.parse(read_source(module, git_dir, ref, source_dir))
        modules[module] = {}
        for name in names:
            info = describe(tree, name)
            if info is None:
                missing.append(f"{module}.{name}")
            else:
                modules[module][name] = info
    return modules, missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--git-dir", help="bare git directory of NVIDIA/TensorRT-LLM")
    src.add_argument("--source-dir", help="checkout of NVIDIA/TensorRT-LLM")
    ap.add_argument("--ref", help="tag or commit with --git-dir, e.g. v1.4.0rc1")
    ap.add_argument("--version", required=True, help="TensorRT-LLM version these symbols belong to")
    ap.add_argument("-o", "--output", default=str(Path(__file__).resolve().parents[1] / "trtllm_replayssm" / "serving" / "trtllm"
                                                  / "trtllm_symbols.json"))
    args = ap.parse_args()
    if args.git_dir and not args.ref:
        ap.error("--ref is required with --git-dir")
    modules, missing = extract(args.git_dir, args.ref, args.source_dir)
    out = {"version": args.version, "source": {"git_ref": args.ref, "source_dir": args.source_dir},
           "modules": modules}
    Path(args.output).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    for name in missing:
        print(f"missing: {name}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
