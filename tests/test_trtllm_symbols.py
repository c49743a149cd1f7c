"""The TensorRT-LLM module may only use TensorRT-LLM names, attributes, call-site keywords and config fields that
trtllm_symbols.json records (extracted from TensorRT-LLM's source by build_scripts/extract_trtllm_symbols.py)."""
import ast
import json
from pathlib import Path

import pytest
import yaml

from trtllm_replayssm.serving.bundle import serve_yaml
from trtllm_replayssm.serving.trtllm.core import GDN_FORWARD_CORE_KWARGS
from trtllm_replayssm.serving.memory_plan import plan
from trtllm_replayssm.serving.presets import get_preset

PKG = Path(__file__).resolve().parents[1] / "trtllm_replayssm" / "serving" / "trtllm"
RECORD = json.loads((PKG / "trtllm_symbols.json").read_text())
SYMBOLS, RUNTIME = RECORD["modules"], RECORD["runtime"]
OWN_PREFIXES = ("_rs", "_replay", "__")  # our subclasses' own attributes/methods, and Python object dunders


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """local name -> (tensorrt_llm module, name) for every ``from tensorrt_llm... import``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tensorrt_llm"):
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def _members(info: dict) -> set[str]:
    return set(info.get("methods", {})) | set(info.get("attributes", [])) | set(info.get("fields", []))


def _runtime(module_suffix: str, *names: str) -> set[str]:
    module = next(m for m in RUNTIME if m.endswith(module_suffix))
    return set().union(*(_members(RUNTIME[module][n]) for n in names))


# Recorded bases' own bases that are not recorded, and the recorded class they derive from (modeling_speculative.py,
# read through the code index: ``class SpecDecOneEngineForCausalLM(DecoderModelForCausalLM[TModel, TConfig], ...)``).
UNRECORDED_BASES = {"SpecDecOneEngineForCausalLM": "DecoderModelForCausalLM"}
RECORDED_CLASSES = {name: info for group in (SYMBOLS, RUNTIME) for names in group.values()
                    for name, info in names.items() if isinstance(info, dict) and info.get("kind") == "class"}


def _known(name: str) -> set[str]:
    """Members of a recorded class and of its recorded ancestors."""
    info = RECORDED_CLASSES.get(name)
    if info is None:
        return _known(UNRECORDED_BASES[name]) if name in UNRECORDED_BASES else set()
    out = _members(info)
    for base in info.get("bases", []):
        out |= _known(base.split("[")[0].rsplit(".", 1)[-1])
    return out


def violations(source: str) -> list[str]:
    """TensorRT-LLM names used by ``source`` that trtllm_symbols.json does not list. A class's methods and
    ``self.<attr>`` uses are checked against its TensorRT-LLM bases, and so are those of a local class it lists
    before them (a mixin)."""
    tree = ast.parse(source)
    bad = []
    imported = _imports(tree)
    for local, (module, name) in imported.items():
        if name not in SYMBOLS.get(module, {}):
            bad.append(f"import {module}.{name}")
    local_classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    mixin_known: dict[str, set[str]] = {}  # a mixin's members must be known to one of the classes that use it
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
            if name not in SYMBOLS.get(module, {}):
                continue
            known |= _known(name)
        for b in node.bases:
            if isinstance(b, ast.Name) and b.id in local_classes:
                mixin_known.setdefault(b.id, set()).update(known)
        bad += _unknown_members(node, known, f"{bases}")
    for name, known in mixin_known.items():
        bad += _unknown_members(local_classes[name], known, "any class using it")
    return bad


def _unknown_members(cls: ast.ClassDef, known: set[str], where: str) -> list[str]:
    bad = []
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and not item.name.startswith(OWN_PREFIXES) and item.name not in known:
            bad.append(f"{cls.name}.{item.name} overrides a method not in {where}")
    for sub in ast.walk(cls):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                and not sub.attr.startswith(OWN_PREFIXES) and sub.attr not in known):
            bad.append(f"{cls.name}: self.{sub.attr} not in {where}")
    return bad


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_module_uses_only_recorded_symbols(path):
    assert violations(path.read_text()) == []


def test_checker_catches_unknown_names():
    src = ("from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer, NoSuchThing\n"
           "import tensorrt_llm\nv = tensorrt_llm.nope\n"
           "class Mix:\n    def mixin_magic(self):\n        return self.other_secret\n"
           "class X(Mix, Mamba2Mixer):\n    def forward_magic(self):\n        return self.secret_attr\n")
    found = violations(src)
    for name in ("NoSuchThing", "tensorrt_llm.nope", "forward_magic", "secret_attr", "mixin_magic", "other_secret"):
        assert any(name in f for f in found), name


def _attribute_reads(root: str) -> set[tuple[str, str]]:
    """(object name, attribute) for every ``<root>.<a>`` and ``<root>.<a>.<b>`` read in the glue."""
    out = set()
    for path in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == root:
                out.add((root, node.attr))
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == root):
                out.add((node.value.attr, node.attr))
    return out


def test_metadata_and_cache_manager_reads_are_recorded():
    attn = _runtime("interface", "AttentionMetadata")
    mamba = _runtime("mamba2_metadata", "Mamba2Metadata")
    manager = _runtime("mamba_cache_manager", "PythonMambaCacheManager", "MambaHybridCacheManager",
                       "CppMambaHybridCacheManager") | _runtime("resource_manager", "KVCacheManager")
    allowed = {"attn_metadata": attn, "mamba_metadata": mamba, "kv_cache_manager": manager}
    reads = _attribute_reads("attn_metadata") | _attribute_reads("mamba_metadata")
    unknown = [f"{obj}.{attr}" for obj, attr in sorted(reads) if obj in allowed and attr not in allowed[obj]]
    assert reads and unknown == []
    assert "temporal" in _runtime("mamba_cache_manager", "PythonMambaCacheManager.State")  # mamba_layer_cache(i)


def test_call_site_keywords_the_glue_relies_on():
    """The keyword arguments the overrides read are the ones upstream passes at the recorded call sites."""
    mamba2 = SYMBOLS["tensorrt_llm._torch.modules.mamba.mamba2_mixer"]["Mamba2Mixer"]
    ssu_kwargs = set(mamba2["dict_keys"]["forward"]["ssu_kwargs"])
    assert {"state_batch_indices", "out", "z", "dt_bias", "dt_softplus"} <= ssu_kwargs
    # the pure-decode override calls in_proj and out_proj as forward does
    calls = mamba2["calls"]["forward"]
    assert set(calls["in_proj"]) == set(calls["out_proj"]) == {"layer_idx", "lora_params"}
    gdn = SYMBOLS["tensorrt_llm._torch.modules.mamba.gdn_mixer"]["Qwen3NextGatedDeltaNet"]
    gdn_kwargs = set(gdn["dict_keys"]["forward_core"]["kwargs"])
    assert {"mixed_qkv", "a", "b", "cache_indices"} <= gdn_kwargs
    assert GDN_FORWARD_CORE_KWARGS == gdn_kwargs  # what gdn_prefill_kwargs accepts is what upstream was read building
    # the MTP verify (forward_decode, forward_extend) and core.gdn_prefill_kwargs
    assert {"num_decodes", "num_decode_tokens", "num_prefill", "num_prefill_tokens", "state_indices_p",
            "state_indices_d", "has_initial_states", "query_start_loc", "query_start_loc_long", "batch_size",
            "use_replay", "use_cached_replay_all_layer_commit"} <= gdn_kwargs
    assert {"is_target_verify", "intermediate_conv_states", "output", "spec_metadata"} <= set(
        gdn["calls"]["forward_core"]["forward_decode"]) & set(gdn["calls"]["forward_core"]["forward_extend"])
    kda = SYMBOLS["tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer"]["KimiKDALinearAttention"]
    assert {"forward_decode", "forward_verify"} <= set(kda["calls"]["_forward_impl"])
    # the override keeps upstream's parameters: _forward_impl passes all but ``output`` by position
    assert kda["methods"]["forward_verify"].startswith(
        "(self, x2d, num_steps, layer_cache, conv_pool, ssm_pool, slot_indices, output")


def test_bundle_yaml_keys_are_llm_args_fields():
    args = _runtime("llm_args", "BaseLlmArgs", "TorchLlmArgs")
    kv = _runtime("llm_args", "KvCacheConfig")
    graphs = _runtime("llm_args", "BaseCudaGraphConfig")
    spec = get_preset("nemotron-3-nano-4b")
    data = yaml.safe_load(serve_yaml(spec, plan(spec, "h100")))
    assert set(data) <= args, set(data) - args
    assert set(data["kv_cache_config"]) <= kv and set(data["cuda_graph_config"]) <= graphs


def test_integration_imports_tensorrt_llm_lazily():
    """The package __init__ must not import TensorRT-LLM at module level (only inside register())."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("tensorrt_llm" in ast.unparse(n) for n in top)


def test_model_classes_are_module_level_and_registered_at_import():
    """Workers find an external model by importing ``cls.__module__`` (TensorRT-LLM PR #18284) or by unpickling it
    by reference: every registered class must be defined at the top level of integration.py (directly or under a
    top-level ``if``) and registered by the module's own import, not by a function call."""
    tree = ast.parse((PKG / "integration.py").read_text())
    top = [n for n in tree.body] + [n for s in tree.body if isinstance(s, ast.If) for n in s.body]
    top_classes = {n.name for n in top if isinstance(n, ast.ClassDef)}
    registered = set()
    for n in top:
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "MODELS":
            registered |= {v.id for v in n.value.values}
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).startswith("MODELS["):
            registered.add(n.value.id)
    assert len(registered) == 5 and registered <= top_classes
    loops = [s for s in tree.body if isinstance(s, ast.For) and "register_auto_model" in ast.unparse(s)]
    assert len(loops) == 1 and "MODELS.items()" in ast.unparse(loops[0].iter)
    assert not any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "type" and len(n.args) == 3
                   for n in ast.walk(tree))  # no class built by type(name, bases, ns)
