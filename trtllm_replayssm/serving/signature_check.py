"""Compare recorded TensorRT-LLM signatures (``trtllm/trtllm_symbols.json``) with the installed callables.

Pure Python, no TensorRT-LLM import: ``recorded_signatures`` flattens the JSON, ``resolve`` imports a dotted name,
``signature_mismatches`` compares. Parameter names, kinds, order, presence of defaults and literal default values
are compared; annotations are not (their text depends on ``from __future__ import annotations`` and import aliases).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

SKIP_ENV = "TRTLLM_REPLAYSSM_SKIP_SIGNATURE_CHECK"
_NO_DEFAULT = object()
_UNPARSED_DEFAULT = object()  # recorded default that is an expression (e.g. an enum member): presence only

P = inspect.Parameter


def recorded_signatures(symbols: Mapping[str, Any]) -> dict[str, str]:
    """``"module:Name[.method]" -> signature text`` for every callable of ``symbols["modules"]`` with a recorded
    (non-null) signature: functions' ``signature`` and classes' ``methods``."""
    out: dict[str, str] = {}
    for module, names in symbols.get("modules", {}).items():
        for name, info in names.items():
            if not isinstance(info, dict):
                continue
            if info.get("kind") == "function" and info.get("signature") is not None:
                out[f"{module}:{name}"] = info["signature"]
            for method, sig in (info.get("methods") or {}).items():
                if sig is not None:
                    out[f"{module}:{name}.{method}"] = sig
    return out


def resolve(qualname: str) -> Callable[..., Any]:
    """Import ``"package.module:Name.attr"`` and return the object (AttributeError/ImportError if absent)."""
    module, sep, path = qualname.partition(":")
    if not sep or not path:
        raise ValueError(f"qualname: expected 'module:Name[.attr]', got {qualname!r}")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _parse(sig: str) -> list[tuple[str, Any, Any]]:
    """``[(name, kind, default)]`` of a recorded signature text such as ``"(self, x: int = 1, *, y)"``."""
    try:
        fn = ast.parse(f"def _f{sig}:\n    pass").body[0]
    except SyntaxError as exc:
        raise ValueError(f"recorded signature is not valid Python: {sig!r} ({exc.msg})") from None
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args

    def default(node: ast.expr | None) -> Any:
        if node is None:
            return _NO_DEFAULT
        try:
            return ast.literal_eval(node)
        except ValueError:
            return _UNPARSED_DEFAULT

    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(x.arg, kind, default(d)) for (x, kind), d in zip(positional, pos_defaults)]
    if a.vararg is not None:
        params.append((a.vararg.arg, P.VAR_POSITIONAL, _NO_DEFAULT))
    params += [(x.arg, P.KEYWORD_ONLY, default(d)) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        params.append((a.kwarg.arg, P.VAR_KEYWORD, _NO_DEFAULT))
    return params


def _describe(name: str, kind: Any, default: Any) -> str:
    prefix = {P.VAR_POSITIONAL: "*", P.VAR_KEYWORD: "**"}.get(kind, "")
    text = f"{prefix}{name}"
    if kind is P.KEYWORD_ONLY:
        text += " (keyword-only)"
    elif kind is P.POSITIONAL_ONLY:
        text += " (positional-only)"
    if default is _UNPARSED_DEFAULT:
        text += "=<default>"
    elif default is not _NO_DEFAULT:
        text += f"={default!r}"
    return text


def _compare(recorded: str, live: Callable[..., Any]) -> str | None:
    """None when ``live`` matches the recorded text, else a one-line difference."""
    want = _parse(recorded)
    try:
        live_sig = inspect.signature(live)
    except (TypeError, ValueError) as exc:
        return f"no inspectable signature ({exc})"
    got = [(p.name, p.kind, _NO_DEFAULT if p.default is P.empty else p.default)
           for p in live_sig.parameters.values()]
    problems = []
    for i in range(max(len(want), len(got))):
        w = want[i] if i < len(want) else None
        g = got[i] if i < len(got) else None
        if w is None:
            problems.append(f"unexpected parameter {_describe(*g)}")
            continue
        if g is None:
            problems.append(f"missing parameter {_describe(*w)}")
            continue
        if w[0] != g[0] or w[1] != g[1]:
            problems.append(f"parameter {i}: recorded {_describe(*w)}, installed {_describe(*g)}")
            continue
        if (w[2] is _NO_DEFAULT) != (g[2] is _NO_DEFAULT):
            problems.append(f"{w[0]}: recorded {'without' if w[2] is _NO_DEFAULT else 'with'} a default, "
                            f"installed {'without' if g[2] is _NO_DEFAULT else 'with'} one")
        elif w[2] not in (_NO_DEFAULT, _UNPARSED_DEFAULT) and w[2] != g[2]:
            problems.append(f"{w[0]}: recorded default {w[2]!r}, installed {g[2]!r}")
    if not problems:
        return None
    return f"recorded {recorded}, installed {live_sig}: " + "; ".join(problems)


def signature_mismatches(recorded: Mapping[str, str], live: Mapping[str, Callable[..., Any] | BaseException]
                         ) -> list[str]:
    """One line per recorded name whose live callable differs, is missing, or failed to resolve.

    ``recorded``: name -> recorded signature text; ``live``: name -> the installed callable, or the exception
    raised while resolving it. Names in ``live`` but not in ``recorded`` are ignored.
    """
    out = []
    for name, sig in recorded.items():
        obj = live.get(name)
        if obj is None:
            out.append(f"{name}: not resolved")
        elif isinstance(obj, BaseException):
            out.append(f"{name}: not found in the installed TensorRT-LLM ({type(obj).__name__}: {obj})")
        else:
            diff = _compare(sig, obj)
            if diff is not None:
                out.append(f"{name}: {diff}")
    return out


def check_signatures(recorded: Mapping[str, str], live: Mapping[str, Callable[..., Any] | BaseException],
                     version: str) -> None:
    """RuntimeError listing every mismatch, unless there is none or SKIP_ENV=1."""
    if os.environ.get(SKIP_ENV) == "1":
        return
    problems = signature_mismatches(recorded, live)
    if problems:
        lines = "\n  ".join(problems)
        raise RuntimeError(f"trtllm-replayssm: the installed tensorrt_llm {version} differs from the signatures "
                           f"recorded in trtllm_symbols.json ({len(problems)} mismatch(es)):\n  {lines}\n"
                           f"The replay hooks would call these with the recorded arguments. Set {SKIP_ENV}=1 to "
                           "register anyway.")


def resolve_all(names: Mapping[str, str]) -> dict[str, Callable[..., Any] | BaseException]:
    """``resolve`` each name; an ImportError/AttributeError is kept as the value (reported by the comparator)."""
    out: dict[str, Callable[..., Any] | BaseException] = {}
    for name in names:
        try:
            out[name] = resolve(name)
        except (ImportError, AttributeError) as exc:
            out[name] = exc
    return out
