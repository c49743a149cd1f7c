"""The TensorRT-LLM module may only use TensorRT-LLM names recorded in trtllm_symbols.json (extracted from source)."""
import ast
import json
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "trtllm_replayssm" / "serving" / "trtllm"
SYMBOLS = json.loads((PKG / "trtllm_symbols.json").read_text())["modules"]
OWN_PREFIXES = ("_rs", "_replay", "__")  # our subclasses' own attributes/methods, and Python object dunders


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """local name -> (tensorrt_llm module, name) for every ``from tensorrt_llm... import``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tensorrt_llm"):
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def violations(source: str) -> list[str]:
    """TensorRT-LLM names used by ``source`` that trtllm_symbols.json does not list."""
    tree = ast.parse(source)
    bad = []
    imported = _imports(tree)
    for local, (module, name) in imported.items():
        if name not in SYMBOLS.get(module, {}):
            bad.append(f"import {module}.{name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tensorrt_llm":
            if node.attr not in SYMBOLS["tensorrt_llm"]:
                bad.append(f"tensorrt_llm.{node.attr}")
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported]
        if not bases:
            continue
        known = set()
        for module, name in bases:
            info = SYMBOLS.get(module, {}).get(name, {})
            known |= set(info.get("methods", {})) | set(info.get("attributes", []))
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and not item.name.startswith(OWN_PREFIXES) and item.name not in known:
                bad.append(f"{node.name}.{item.name} overrides a method not in {bases}")
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                    and not sub.attr.startswith(OWN_PREFIXES) and sub.attr not in known):
                bad.append(f"{node.name}: self.{sub.attr} not in {bases}")
    return bad


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_module_uses_only_recorded_symbols(path):
    assert violations(path.read_text()) == []


def test_checker_catches_unknown_names():
    src = ("from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer, NoSuchThing\n"
           "import tensorrt_llm\nv = tensorrt_llm.nope\n"
           "class X(Mamba2Mixer):\n    def forward_magic(self):\n        return self.secret_attr\n")
    found = violations(src)
    assert any("NoSuchThing" in f for f in found)
    assert any("tensorrt_llm.nope" in f for f in found)
    assert any("forward_magic" in f for f in found)
    assert any("secret_attr" in f for f in found)


def test_integration_imports_tensorrt_llm_lazily():
    """The package __init__ must not import TensorRT-LLM at module level (only inside register())."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("tensorrt_llm" in ast.unparse(n) for n in top)
