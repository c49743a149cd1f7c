"""Swapping one model's SSM mixers to their ReplaySSM subclasses, and back as a whole (TensorRT-LLM-free).

A served model either runs ReplaySSM in every SSM layer or in none: what replay cannot serve yet is refused with one
logged line per reason before the first replay step, and the model keeps (or gets back) upstream's mixers. A model
in which no mixer of its family's upstream class is found, or one whose mixers lack the hook point a subclass needs,
is an error: the TensorRT-LLM revision differs from the one the module was written against.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.serving.trtllm.core import refusals_from_cache_manager
from trtllm_replayssm.serving.trtllm.model_cache import ModelReplayCache

_log = logging.getLogger("trtllm_replayssm")

# The attribute a checked cache manager carries: the ReplayModel that checked it (and, with MTP, took over its
# commit). Kept on the manager, so that the model holds no reference to a manager TensorRT-LLM has dropped.
CHECKED_ATTR = "_trtllm_replayssm_checked_by"


@dataclass(frozen=True)
class Swap:
    module: torch.nn.Module
    original: type


def _cannot_hook(module: torch.nn.Module, replay_cls: type) -> str | None:
    if not isinstance(getattr(module, "layer_idx", None), int):
        return f"{type(module).__name__} has no integer layer_idx"
    check = getattr(replay_cls, "_rs_cannot_hook", None)
    return check(module) if check else None


def log_refusals(arch: str, reasons: Sequence[str]) -> None:
    for reason in reasons:
        _log.warning("trtllm-replayssm: %s runs upstream TensorRT-LLM kernels: %s", arch, reason)


class ReplayModel:
    """The replay side of one served model: its swapped mixers and their shared :class:`ModelReplayCache`."""

    def __init__(self, arch: str, cache: ModelReplayCache, swaps: list[Swap]) -> None:
        self.arch = arch
        self.cache = cache
        self.swaps = swaps

    @classmethod
    def install(cls, model: torch.nn.Module, arch: str, family: str, swap_classes: Mapping[type, type],
                buffer_len: int, act_dtype: torch.dtype, refusals: Sequence[str] = (),
                planned: tuple[int, int] | None = None, state: StateSpec | None = None,
                spec_tokens: int | None = None) -> "ReplayModel | None":
        """Swap every mixer of ``model`` whose exact class is a key of ``swap_classes``; None (upstream kernels,
        one warning per reason) when ``refusals`` is not empty; ``planned``: (bytes, slots) of the bundle's ring
        plan, to warn when TensorRT-LLM's pool needs more; ``state``: the bundle's checkpoint spec
        (:class:`ModelReplayCache`); ``spec_tokens``: MTP draft tokens whose windows the mixers verify (None:
        standard decode). Every upstream mixer needs a ``layer_idx``; replay mixer
        classes provide ``_rs_num_k_heads()`` and ``_rs_setup(cache)``, optionally ``_rs_cannot_hook(module) -> str |
        None`` (what an upstream mixer lacks) and ``_rs_teardown()`` (undo ``_rs_setup`` beyond the class swap)."""
        if refusals:
            log_refusals(arch, refusals)
            return None
        found = [m for m in model.modules() if type(m) in swap_classes]
        if not found:
            names = ", ".join(c.__name__ for c in swap_classes)
            raise RuntimeError(f"trtllm-replayssm: {arch} has no {names} layer: this TensorRT-LLM builds its "
                               f"{family} layers from another class, so ReplaySSM would change nothing "
                               "(TRTLLM_REPLAYSSM_DISABLE=1 serves with upstream kernels)")
        problems = sorted({p for m in found if (p := _cannot_hook(m, swap_classes[type(m)]))})
        if problems:
            raise RuntimeError(f"trtllm-replayssm: {arch}: cannot hook this TensorRT-LLM's mixers: "
                               + "; ".join(problems) + " (TRTLLM_REPLAYSSM_DISABLE=1 serves with upstream kernels)")
        swaps = [Swap(m, type(m)) for m in found]
        for s in swaps:
            s.module.__class__ = swap_classes[s.original]
        cache = ModelReplayCache(family, [m.layer_idx for m in found], found[0]._rs_num_k_heads(), buffer_len,
                                 act_dtype, planned, state, spec_tokens)
        for m in found:
            m._rs_setup(cache)
        _log.info("trtllm-replayssm: %s: %d %s layers run ReplaySSM decode (L=%d)", arch, len(found), family,
                  buffer_len)
        return cls(arch, cache, swaps)

    def uninstall(self, reasons: Sequence[str]) -> None:
        """Give every swapped mixer back its upstream class (before any replay step)."""
        log_refusals(self.arch, reasons)
        for s in self.swaps:
            if hasattr(s.module, "_rs_teardown"):
                s.module._rs_teardown()
            s.module.__class__ = s.original
        self.swaps = []

    @property
    def active(self) -> bool:
        return bool(self.swaps)

    def begin_step(self, attn_metadata: Any) -> bool:
        """Before each model forward. The first forward with a cache manager this model has not seen
        (``attn_metadata.kv_cache_manager``: an eager warm-up step, before any replay step on it and any graph
        capture; TensorRT-LLM replaces its memory-estimation manager by the serving one) checks it and falls back as
        a whole if it shows what replay cannot serve; a model that verifies MTP windows then takes over its
        ``update_mamba_states`` (the commit after sampling: :meth:`ModelReplayCache.update_mamba_states`). Returns
        whether replay runs this step."""
        manager = getattr(attn_metadata, "kv_cache_manager", None)
        if self.active and getattr(manager, CHECKED_ATTR, None) is not self:
            speculative = self.cache.window > 1
            layer_cache = (manager.mamba_layer_cache(self.cache.layer_ids[0])
                           if speculative and callable(getattr(manager, "mamba_layer_cache", None)) else None)
            reasons = refusals_from_cache_manager(manager, int(getattr(attn_metadata, "beam_width", 1) or 1),
                                                  speculative, layer_cache)
            if reasons:
                self.uninstall(reasons)
            elif manager is not None:  # (a speculative model without a manager was refused above)
                if speculative:
                    manager.update_mamba_states = functools.partial(self.cache.update_mamba_states, manager)
                setattr(manager, CHECKED_ATTR, self)
        if self.active:
            self.cache.begin_step()
        return self.active

    def end_step(self) -> None:
        if self.active:
            self.cache.end_step()
