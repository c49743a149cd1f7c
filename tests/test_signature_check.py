"""The recorded-vs-installed signature comparator, exercised with ordinary functions defined here."""
import ast
import enum
import json
from pathlib import Path

import pytest

from trtllm_replayssm.serving.signature_check import (SKIP_ENV, check_signatures, recorded_signatures, resolve, resolve_all,
                                              signature_mismatches)


class Strategy(enum.Enum):
    AUTO = 0


def decode(self, x2d, conv_pool, slot_indices, mamba_metadata=None, output=None, **kwargs):
    return None


def init(self, cfg, layer_idx: int, strategy=Strategy.AUTO, *, scale: float = 1.0):
    return None


def test_matching_signatures_ignore_annotations():
    recorded = {"m:decode": "(self, x2d, conv_pool, slot_indices: torch.Tensor, mamba_metadata=None, "
                            "output: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor",
                "m:init": "(self, cfg, layer_idx: int, strategy=AllReduceStrategy.AUTO, *, scale: float = 1.0)"}
    assert signature_mismatches(recorded, {"m:decode": decode, "m:init": init}) == []


def test_reports_each_kind_of_difference():
    recorded = {
        "m:renamed": "(self, x, conv_pool, slot_indices, mamba_metadata=None, output=None, **kwargs)",
        "m:extra": "(self, x2d, conv_pool, slot_indices, mamba_metadata=None)",
        "m:default": "(self, cfg, layer_idx: int, strategy=Strategy.AUTO, *, scale: float = 2.0)",
        "m:kind": "(self, cfg, layer_idx, strategy=None, scale=1.0)",
        "m:missing": "(self)",
    }
    live = {"m:renamed": decode, "m:extra": decode, "m:default": init, "m:kind": init,
            "m:missing": AttributeError("no attribute 'gone'")}
    found = "\n".join(signature_mismatches(recorded, live))
    assert "m:renamed" in found and "recorded x, installed x2d" in found
    assert "m:extra" in found and "unexpected parameter output=None" in found
    assert "m:default" in found and "recorded default 2.0, installed 1.0" in found
    assert "m:kind" in found and "scale (keyword-only)" in found
    assert "m:missing: not found in the installed TensorRT-LLM (AttributeError" in found


def test_check_raises_one_error_listing_all_and_env_bypasses(monkeypatch):
    recorded = {"m:a": "(self, y)", "m:b": "(self, z)"}
    live = {"m:a": decode, "m:b": init}
    monkeypatch.delenv(SKIP_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"tensorrt_llm 9\.9 .*2 mismatch\(es\)(.|\n)*m:a(.|\n)*m:b") as exc:
        check_signatures(recorded, live, "9.9")
    assert SKIP_ENV in str(exc.value)
    monkeypatch.setenv(SKIP_ENV, "1")
    check_signatures(recorded, live, "9.9")
    check_signatures({"m:decode": "(self, x2d, conv_pool, slot_indices, mamba_metadata=None, output=None, **kw)"},
                     {"m:decode": decode}, "9.9")


def test_bad_recorded_text_is_a_value_error():
    with pytest.raises(ValueError, match="not valid Python"):
        signature_mismatches({"m:f": "(self, "}, {"m:f": decode})


def test_resolve_and_resolve_all():
    assert resolve("json:dumps") is json.dumps
    assert resolve("pathlib:Path.with_name") is Path.with_name
    got = resolve_all({"json:dumps": "", "json:no_such_name": "", "no_such_module_xyz:f": ""})
    assert got["json:dumps"] is json.dumps
    assert isinstance(got["json:no_such_name"], AttributeError)
    assert isinstance(got["no_such_module_xyz:f"], ImportError)
    with pytest.raises(ValueError, match="qualname"):
        resolve("json.dumps")


def test_recorded_signatures_of_the_shipped_json_all_parse():
    path = Path(__file__).resolve().parents[1] / "trtllm_replayssm" / "serving" / "trtllm" / "trtllm_symbols.json"
    recorded = recorded_signatures(json.loads(path.read_text()))
    key = "tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer:KimiKDALinearAttention.forward_decode"
    assert key in recorded
    # the revision's own defaults are recorded: GDN's layer_idx=None (a gate without it rejected that revision)
    gdn_init = "tensorrt_llm._torch.modules.mamba.gdn_mixer:Qwen3NextGatedDeltaNet.__init__"

    def upstream_init(self, model_config, aux_stream, layer_idx=None): ...

    def no_default_init(self, model_config, aux_stream, layer_idx): ...

    assert signature_mismatches({gdn_init: recorded[gdn_init]}, {gdn_init: upstream_init}) == []
    assert signature_mismatches({gdn_init: recorded[gdn_init]}, {gdn_init: no_default_init}) != []
    # every recorded text parses; comparing each against itself as a real function must match
    for name, sig in recorded.items():
        ns: dict = {}
        src = "def f" + sig.split(" -> ")[0] + ": pass"
        tree = ast.parse(src)
        fn = tree.body[0]
        for arg_list in (fn.args.defaults, fn.args.kw_defaults):
            for i, node in enumerate(arg_list):
                if node is not None:
                    try:
                        ast.literal_eval(node)
                    except ValueError:
                        arg_list[i] = ast.Constant(value=None)  # expression defaults: presence only
        for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            a.annotation = None
        for a in (fn.args.vararg, fn.args.kwarg):
            if a is not None:
                a.annotation = None
        exec(compile(ast.fix_missing_locations(tree), name, "exec"), ns)
        assert signature_mismatches({name: sig}, {name: ns["f"]}) == [], name
