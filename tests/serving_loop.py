"""A serving schedule driven through the glue's core (``ModelReplayCache``) the way TensorRT-LLM drives its mixers,
checked against each request's own float64 recurrence.

What is reproduced from TensorRT-LLM's source (see upstream_pools.py and docs/serving.md): a fresh state view per
call from a strided unified pool, slot ids that are block ids in a pool larger than the batch, one persistent
``state_indices`` buffer in batch order (context requests first), prefill writing the live state of context rows,
mixed prefill + decode steps run eagerly and generation-only steps as CUDA graphs per padded batch size whose padding
rows repeat one dummy request's block, eager warm-up before capture, and GDN's decode rows in mixed batches going
through the chunked kernel (stood in for by the baseline step on the live state, which is what that kernel computes).
Requests arrive, finish and their blocks are reused by requests with other prompts.

With ``spec_tokens`` N (MTP), every decode row verifies a window of N + 1 tokens per step (``ModelReplayCache.verify``)
and, after the forward (in the same CUDA graph on graph steps), keeps a random accepted count (1 .. N + 1: only the
bonus token, every draft, and between)
through ``ModelReplayCache.update_mamba_states`` (the module's replacement of the cache manager's, called as upstream
calls it after sampling) on the Python cache manager's speculative layout (``SpeculativePythonPool``: the pool MTP
needs), whose verify conv windows the loop fills with random values in place of upstream's conv kernel; each
request's float64 recurrence checks every window token's output and advances by the accepted tokens only, and its
conv state must be the window of its accepted count. With MTP a GDN mixed batch's decode rows verify too (the
module runs upstream's prefill path on the prefill rows alone).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import torch

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims, SSMDims
from trtllm_replayssm.core.families import Family, get_family
from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.core.samples import step_rows, window_token, with_constants
from trtllm_replayssm.serving.trtllm.core import gdn_materialize_slots, split_batch
from trtllm_replayssm.serving.trtllm.model_cache import ModelReplayCache

from upstream_pools import SpeculativePythonPool, UnifiedPool

PADDED_SIZES = (1, 2, 4, 8)


@dataclass
class Request:
    rid: int
    block: int
    remaining: int  # decode steps left
    states: list[torch.Tensor] = field(default_factory=list)  # float64 live state per layer


@dataclass
class Report:
    steps: int = 0
    decode_rows: int = 0
    mixed_steps: int = 0
    graph_steps: int = 0
    finished: int = 0
    reused_blocks: int = 0
    worst_rel_err: float = 0.0
    graph_eager_checks: int = 0
    pad_rows: int = 0
    accepted_counts: set[int] = field(default_factory=set)  # the accepted counts the commits saw (MTP)
    first_mixed_step: int | None = None  # index of the first step with context and decode rows
    memory: list[int] = field(default_factory=list)


def dims_for(family: str, device: str) -> SSMDims:
    """Small shapes the CPU reference runs quickly; kernel-supported shapes on the GPU."""
    gpu = device != "cpu"
    if family == "mamba2":
        return Mamba2Dims(nheads=8, head_dim=64, d_state=128, n_groups=2) if gpu else Mamba2Dims(4, 16, 32, 2)
    if family == "gdn":
        return GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=128) if gpu else GDNDims(1, 2, 64, 16)
    return KDADims(num_heads=2, head_dim=128) if gpu else KDADims(2, 64)


class ServingLoop:
    def __init__(self, family: str, device: str, buffer_len: int, blocks: int = 16, max_running: int = 6,
                 max_length: int = 40, seed: int = 0, graphs: bool = False, spec_tokens: int | None = None,
                 state: StateSpec | None = None) -> None:
        self.fam: Family = get_family(family)
        self.dims = dims_for(family, device)
        self.device = torch.device(device)
        self.layer_ids = [1, 4]  # global indices of the model's SSM layers
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.act = torch.float32
        state_shape = (self.dims.heads, self.dims.rows, self.dims.cols)
        # FP8/NVFP4 codes live in a bf16 pool (the bundle's mamba_ssm_cache_dtype), plain states in an fp32 one
        self.pool_dtype = torch.bfloat16 if state is not None and state.checkpoint_format.quantized else torch.float32
        self.window = 1 + (spec_tokens or 0)
        if spec_tokens:
            self.pool = SpeculativePythonPool(self.layer_ids, blocks, state_shape, torch.float32, conv_shape=(6, 3),
                                              window=self.window, max_batch=max(PADDED_SIZES), device=self.device)
        else:
            self.pool = UnifiedPool(self.layer_ids, blocks, state_shape, self.pool_dtype, conv_bytes=3 * 16 * 64,
                                    device=self.device)
        self.cache = ModelReplayCache(family, self.layer_ids, self.dims.key_heads, buffer_len, self.act,
                                      state=state, spec_tokens=spec_tokens)
        self.constants = [self.fam.random_step(self.dims, 1, self.gen, self.device, self.act) for _ in self.layer_ids]
        self.state_indices = torch.zeros(max(PADDED_SIZES), dtype=torch.int32, device=self.device)
        # MTP: every row's accepted count, one persistent buffer in batch order as upstream's (contexts first)
        self.counts = torch.ones(max(PADDED_SIZES), dtype=torch.int32, device=self.device)
        self.dummy_block = blocks - 1  # the CUDA-graph padding dummy's own block
        self.free = list(range(blocks - 1))
        self.used_before: set[int] = set()
        self.max_running = max_running
        self.max_length = max_length
        self.graphs = graphs
        self.captured: dict[int, tuple[torch.cuda.CUDAGraph, list, list]] = {}
        self.running: list[Request] = []
        self.next_rid = 0
        self.report = Report()

    # ------------------------------------------------------------------ one model forward
    def forward(self, num_contexts: int, num_seqs: int, steps: list, outs: list,
                prefill_states: list | None = None) -> None:
        """What the mixers do in one model forward: every layer binds its fresh view and hands prefills off, the
        upstream prefill writes the context rows' states, the decode rows run the replay op."""
        cache = self.cache
        cache.begin_step()
        try:
            for i, layer_id in enumerate(self.layer_ids):
                layer = cache.layer_step(layer_id, self.pool.get_ssm_states(layer_id), self.state_indices,
                                         num_contexts)
                if num_contexts:  # upstream prefill: the context rows' live state, then the module's hand-off
                    view = self.pool.get_ssm_states(layer_id)
                    view.index_copy_(0, self.state_indices[:num_contexts].long(), prefill_states[i])
                    cache.prefill_written(layer_id, view, self.state_indices[:num_contexts])
                if num_seqs == num_contexts:
                    continue
                decode_idx = split_batch(self.state_indices, num_contexts, num_seqs).decode_slots
                args, kwargs = steps[i].op_args()
                if num_contexts and self.fam.name == "gdn" and self.window == 1:  # mixed: upstream's chunked kernel
                    state = self.pool.get_ssm_states(layer_id)
                    gdn_materialize_slots(layer, decode_idx)
                    cache.expose_slots(layer_id, state, decode_idx)
                    self.fam.state_update(state, *args, state_batch_indices=decode_idx, out=outs[i], **kwargs)
                    cache.prefill_written(layer_id, state, decode_idx)
                    continue
                if self.window > 1:  # after upstream's verify conv wrote the rows' windows (_fill_windows)
                    cache.verify(layer_id, self.pool.get_ssm_states(layer_id), decode_idx, *args, out=outs[i],
                                 **kwargs)
                    continue
                layer = cache.layer(layer_id, self.pool.get_ssm_states(layer_id))
                self.fam.replay_decode(layer, *args, state_batch_indices=cache.decode_slots(decode_idx),
                                       out=outs[i], plan=cache.decode_plan(layer, decode_idx.shape[0]), **kwargs)
        finally:
            cache.end_step()

    # ------------------------------------------------------------------ schedule
    def _draw(self, batch: int) -> list:
        """Each layer's decode inputs: per row one token, or a window of ``self.window`` ([b, T, ...])."""
        T = self.window
        steps = [with_constants(self.fam.random_step(self.dims, batch * T, self.gen, self.device, self.act), c)
                 for c in self.constants]
        if T == 1:
            return steps
        return [replace(st, **{name: t.reshape(batch, T, *t.shape[1:]) for name, t in vars(st).items()
                               if name not in st.per_head_fields}) for st in steps]

    def _out(self, batch: int) -> list[torch.Tensor]:
        shape = (batch, *((self.window,) if self.window > 1 else ()), self.dims.heads, self.dims.rows)
        return [torch.full(shape, float("nan"), dtype=self.act, device=self.device) for _ in self.layer_ids]

    def forward_and_commit(self, num_contexts: int, num_seqs: int, steps: list, outs: list,
                           prefill_states: list | None = None) -> None:
        """A model forward and, with MTP decode rows, upstream's commit after sampling: ``update_mamba_states``
        with ``self.counts`` (captured together in a graph step, as TensorRT-LLM's MTP worker runs inside the
        captured forward)."""
        self.forward(num_contexts, num_seqs, steps, outs, prefill_states)
        if self.window > 1 and num_seqs > num_contexts:
            self.cache.update_mamba_states(self.pool, SimpleNamespace(num_contexts=num_contexts, num_seqs=num_seqs),
                                           self.counts, self.state_indices)

    def _fill_windows(self) -> None:
        """MTP: upstream's verify conv writes every row's window after each window token (random stand-ins)."""
        for layer_id in self.layer_ids:
            windows = self.pool.mamba_layer_cache(layer_id).intermediate_conv_window
            windows.copy_(torch.randn(windows.shape, generator=self.gen).to(self.device))

    def _set_counts(self, num_contexts: int, num_seqs: int, accepted: list[int]) -> None:
        """The step's accepted counts: context rows and padding rows 1."""
        counts = [1] * num_contexts + accepted + [1] * (num_seqs - num_contexts - len(accepted))
        self.counts[:num_seqs].copy_(torch.tensor(counts, dtype=torch.int32))

    def _check_conv(self, num_contexts: int, accepted: list[int]) -> None:
        """After an MTP commit: each real decode row's conv state is the window of its accepted count."""
        for layer_id in self.layer_ids:
            layer = self.pool.mamba_layer_cache(layer_id)
            for row, a in enumerate(accepted):
                slot = int(self.state_indices[num_contexts + row])
                assert torch.equal(layer.conv[slot], layer.intermediate_conv_window[row, a - 1]), "conv not committed"
        self.report.accepted_counts.update(accepted)

    def warm_up_and_capture(self) -> None:
        """TensorRT-LLM's order: eager warm-up steps (which bind the rings), then one graph per padded size."""
        self.state_indices.fill_(self.dummy_block)
        self.counts.fill_(1)
        for size in PADDED_SIZES:
            self.forward_and_commit(0, size, self._draw(size), self._out(size))
            if self.graphs:
                steps, outs = self._draw(size), self._out(size)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.forward_and_commit(0, size, steps, outs)
                self.captured[size] = (graph, steps, outs)
        if self.graphs:
            torch.cuda.synchronize()
            self.report.memory.append(self.glue_memory())

    def step(self) -> None:
        rep = self.report
        for r in [r for r in self.running if r.remaining == 0]:
            self.running.remove(r)
            self.free.append(r.block)
            rep.finished += 1
        decodes = list(self.running)
        contexts = []
        while (len(self.running) + len(contexts) < self.max_running and self.free
               and self.rng.random() < (0.9 if not decodes else 0.35)):
            block = self.free.pop(self.rng.randrange(len(self.free)))
            rep.reused_blocks += block in self.used_before
            self.used_before.add(block)
            contexts.append(Request(self.next_rid, block, remaining=self.rng.randrange(2, self.max_length)))
            self.next_rid += 1
        num_contexts, n_dec = len(contexts), len(decodes)
        if num_contexts == 0 and n_dec == 0:
            return
        padded = n_dec if num_contexts else next(s for s in PADDED_SIZES if s >= n_dec)  # graph batch sizes
        num_seqs = num_contexts + padded
        ids = [r.block for r in contexts] + [r.block for r in decodes] + [self.dummy_block] * (padded - n_dec)
        self.state_indices[:num_seqs].copy_(torch.tensor(ids, dtype=torch.int32))
        prefill = None
        if num_contexts:
            prefill = [0.1 * torch.randn(num_contexts, *self.pool.all_ssm_states.shape[2:], generator=self.gen)
                       for _ in self.layer_ids]
            prefill = [p.to(self.device, self.pool_dtype) for p in prefill]
            for c, req in enumerate(contexts):  # the float64 references live on the loop's device
                req.states = [p[c].double() for p in prefill]
        steps, outs = self._draw(padded), self._out(padded)
        accepted = [self._accepted_count() for _ in decodes]
        if self.window > 1:
            self._fill_windows()
            self._set_counts(num_contexts, num_seqs, accepted)
        if num_contexts or not self.graphs:
            self.forward_and_commit(num_contexts, num_seqs, steps, outs, prefill)
            if num_contexts and n_dec and rep.first_mixed_step is None:
                rep.first_mixed_step = rep.steps
            rep.mixed_steps += num_contexts > 0
        else:
            self._replay_graph(padded, steps, outs)
        self._check(decodes, steps, outs, accepted)
        if self.window > 1:
            self._check_conv(num_contexts, accepted)
        for r in decodes:
            r.remaining -= 1
        self.running.extend(contexts)
        rep.steps += 1

    def _replay_graph(self, size: int, steps: list, outs: list) -> None:
        graph, static_steps, static_outs = self.captured[size]
        for static, fresh in zip(static_steps, steps):
            for name in vars(fresh):
                getattr(static, name).copy_(getattr(fresh, name))
        if self.report.graph_eager_checks < len(PADDED_SIZES):  # graph replay equals the eager step, bit for bit
            saved = self._snapshot()
            eager_outs = self._out(size)
            self.forward_and_commit(0, size, static_steps, eager_outs)
            eager_after = self._snapshot()
            self._restore(saved)
            graph.replay()
            assert all(torch.equal(a, b) for a, b in zip(eager_outs, static_outs)), "graph output != eager output"
            assert all(torch.equal(a, b) for a, b in zip(eager_after, self._snapshot())), "graph state != eager state"
            self.report.graph_eager_checks += 1
        else:
            graph.replay()
        for out, static in zip(outs, static_outs):
            out.copy_(static)
        self.report.graph_steps += 1

    def glue_memory(self) -> int:
        """The device bytes allocated, less the running requests' float64 references (the test's own, one state per
        layer and request, which come and go with the requests)."""
        refs = sum(-(-s.untyped_storage().nbytes() // 512) * 512  # the caching allocator's 512-byte rounding
                   for r in self.running for s in (r.states or []) if s.is_cuda)
        return torch.cuda.memory_allocated() - refs

    def _tensors(self) -> list[torch.Tensor]:
        """Everything a step writes: the pool, the cursors, every layer's rings and the scratch."""
        cache = self.cache.cache
        pool = ([self.pool.all_ssm_states, self.pool.conv] if self.window > 1 else [self.pool.pool])
        tensors = [*pool, cache.cursor, cache.arrive]
        for i in range(cache.num_layers):
            tensors += [t for name, t in cache.layer(i).tensors().items() if name not in ("cursor", "arrive")]
        return tensors

    def _snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._tensors()]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for t, s in zip(self._tensors(), saved):
            t.copy_(s)

    def _accepted_count(self) -> int:
        """A row's accepted count after a verify (1 without speculation): the bonus token only, every draft, or
        between."""
        T = self.window
        return T if T == 1 else self.rng.choice([1, T, self.rng.randint(1, T)])

    def _check(self, decodes: list[Request], steps: list, outs: list, accepted: list[int]) -> None:
        """Every decode row's outputs (every window token's) against its float64 recurrence, which then keeps the
        state after the row's accepted tokens."""
        rep = self.report
        T = self.window
        for i in range(len(self.layer_ids)):
            for row, req in enumerate(decodes):
                state = req.states[i]
                for t in range(T):
                    token = window_token(steps[i], t) if T > 1 else steps[i]
                    row_step = step_rows(token, [row])
                    out_ref, new_state = self.fam.reference_step(state[None], row_step)
                    state = new_state[0]
                    if t < accepted[row]:
                        req.states[i] = state
                    got = (outs[i][row, t] if T > 1 else outs[i][row]).double()
                    err = float((got - out_ref[0]).norm() / out_ref[0].norm().clamp_min(1e-30))
                    rep.worst_rel_err = max(rep.worst_rel_err, err)
            # padding rows: the first computes against the dummy's block, every repeat is a pad row (zeros)
            pad = outs[i][len(decodes):]
            assert torch.isfinite(pad).all() and (pad[1:] == 0).all(), "padding rows must be finite, repeats zero"
            rep.pad_rows += max(0, pad.shape[0] - 1)
        rep.decode_rows += len(decodes)


def run(family: str, device: str, buffer_len: int, steps: int, graphs: bool, max_length: int = 40,
        seed: int = 0, spec_tokens: int | None = None, state: StateSpec | None = None) -> Report:
    loop = ServingLoop(family, device, buffer_len, max_length=max_length, seed=seed, graphs=graphs,
                       spec_tokens=spec_tokens, state=state)
    loop.warm_up_and_capture()
    for _ in range(steps):
        loop.step()
        if graphs:  # after the step's own inputs and outputs are gone: what the glue and the graphs hold
            torch.cuda.synchronize()
            loop.report.memory.append(loop.glue_memory())
    assert loop.cache.binds == 1, "the rings were reallocated during serving"
    return loop.report
