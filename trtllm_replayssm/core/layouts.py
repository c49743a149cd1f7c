"""Layout specs of what crosses the Python / CUDA seam, checked against the kernels at compile time.

* :class:`ParamLayout`: a kernel's by-value parameter struct, written once here. The kernels include the C++ struct
  generated from it and the launch fills the ctypes struct generated from it, by field name: the two cannot disagree
  on order, and a ``static_assert`` pins the C++ ``sizeof`` to the ctypes one.
* Ring and scratch sizes (:func:`delta_record_len`, the persistent kernels' stage and fold-buffer bytes): the host
  allocates and launches with these numbers; :func:`mamba2_size_checks` / :func:`delta_size_checks` assert them
  against the kernels' own constexpr layouts for every ring length 1..MAX_BUFFER_LEN.
* The key-ring element rule (:func:`key_ring_dtype`), which the cache, the references and the kernels share.
"""
from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass

import torch

from trtllm_replayssm.core.formats import StateSpec, get_dtype
from trtllm_replayssm.core.limits import MAX_BUFFER_LEN, MAX_STAGES, MAX_WINDOW, NUM_WARPS

_CTYPES = {"ptr": ctypes.c_void_p, "long long": ctypes.c_longlong, "int": ctypes.c_int, "float": ctypes.c_float}
_WHERE = "trtllm_replayssm/core/layouts.py"


@dataclass(frozen=True)
class ParamLayout:
    """A kernel's by-value parameter struct, written once as its C++ member lines (``body``: ``type name[, name];``
    with ``//`` comments). The kernels include the struct generated from it (:meth:`header`, an NVRTC in-memory
    header named ``<name>.h``); the launch fills the ctypes struct generated from it by field name."""

    name: str
    body: str

    @functools.cached_property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """``(field, kind)`` in declaration order; kind: ptr, long long, int or float."""
        out = []
        for line in self.body.splitlines():
            decl = line.split("//", 1)[0].strip()
            if not decl:
                continue
            m = re.fullmatch(r"([\w\s]+?\**)\s*(\w+(?:\s*,\s*\w+)*)\s*;", decl)
            if not m:
                raise ValueError(f"{self.name}: cannot parse member line {line!r}")
            ctype = m.group(1).strip()
            kind = "ptr" if ctype.endswith("*") else ctype.replace("const ", "")
            if kind not in _CTYPES:
                raise ValueError(f"{self.name}: member type {ctype!r} has no ctypes kind")
            out += [(n.strip(), kind) for n in m.group(2).split(",")]
        return tuple(out)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.fields)

    @functools.cached_property
    def struct(self) -> type[ctypes.Structure]:
        """The ctypes mirror (natural alignment, as the C++ struct)."""
        return type(self.name, (ctypes.Structure,), {"_fields_": [(f, _CTYPES[k]) for f, k in self.fields]})

    def pack(self, **values: object) -> ctypes.Structure:
        """The struct with every field set by name (pointers as ints); KeyError naming missing or unknown fields."""
        names = [f for f, _ in self.fields]
        missing, unknown = [n for n in names if n not in values], [n for n in values if n not in names]
        if missing or unknown:
            raise KeyError(f"{self.name}: missing fields {missing}, unknown fields {unknown}")
        return self.struct(**values)

    @property
    def header_name(self) -> str:
        return f"{self.name}.h"

    def header(self) -> str:
        """The C++ struct, and a ``static_assert`` pinning its size to the ctypes mirror's."""
        return (f"// {self.name}: generated from {_WHERE}; edit it there.\n#pragma once\n"
                f"struct {self.name} {{\n{self.body}\n}};\n"
                f'static_assert(sizeof({self.name}) == {ctypes.sizeof(self.struct)}, "{self.name}: size differs from '
                f'its ctypes mirror ({_WHERE})");\n')


def common_checks() -> str:
    """``static_assert`` lines pinning plugins/replayssm_common.cuh's limits to core/limits.py."""
    return "\n".join(f'static_assert(rssm::{cpp} == {value}, "rssm::{cpp} differs from core/limits.py {py}");'
                     for cpp, value, py in (("kMaxL", MAX_BUFFER_LEN, "MAX_BUFFER_LEN"), ("kNumWarps", NUM_WARPS,
                                            "NUM_WARPS"), ("kMaxStages", MAX_STAGES, "MAX_STAGES"),
                                            ("kMaxWindow", MAX_WINDOW, "MAX_WINDOW")))


# plugins/mamba2_decode.cu: one by-value struct for every Mamba-2 kernel
MAMBA2_PARAMS = ParamLayout("Mamba2Params", """  void* state;            // [slots, H, P, N]
  void* x_ring;           // [slots, H, L, P]
  float* dt_ring;         // [slots, H, L]
  void* B_ring;           // [slots, G, L, N]
  int* cursor;            // [slots]
  int* arrive;            // [slots]
  float* coef;            // [rows >= b, H, L + 1] scratch by batch row: weights of the step (index L: decay)
  int* step;              // [rows >= b] scratch by batch row: w of the step, or -(w + 1) for a flush; step[-1]: the
                          // main kernel's tail-tile claim counter (zeroed by the prep kernel)
  const void* x;          // [b, H, P]
  const void* dt;         // [b, H]  (act dtype or fp32, see dt_is_f32)
  const float* A;         // [H]
  const void* B;          // [b, G, N]
  const void* C;          // [b, G, N]
  const float* D;         // [H] or null
  const void* z;          // [b, H, P] or null
  const float* dt_bias;   // [H] or null
  const int* slot_idx;    // [b]
  void* out;              // [b, H, P]; a verify's [b, T, H, P]
  void* inter;            // per-draft verify: [b, T, H, P, N] the state after each window token (state dtype)
  const int* accepted;    // per-draft commit: [b] accepted tokens of each row (1..T)
  float* state_scale;     // [slots, H, P] fp32 row scales of an fp8/nvfp4 checkpoint, or null
  void* state_bscale;     // [slots, H, P, N/16] E4M3 block scales of an nvfp4 checkpoint, or null
  void* read;             // dual mode: the read copy's codes [slots, H, P, N (fp8) or N/2 (nvfp4)], else null
  float* read_scale;      // [slots, H, P] its fp32 row scales
  void* read_bscale;      // [slots, H, P, N/16] its E4M3 block scales (nvfp4)
  int* flushes;           // [slots] checkpoint writes per slot (stochastic rounding), or null
  long long s_state_slot, s_state_head;
  long long s_xr_slot, s_xr_head;
  long long s_dtr_slot, s_dtr_head;
  long long s_Br_slot, s_Br_group;
  long long s_coef_row;
  long long s_x_b, s_x_h, s_dt_b, s_dt_h, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_out_b, s_out_h;
  long long s_x_t, s_dt_t, s_B_t, s_C_t, s_z_t, s_out_t;  // a verify window's token strides (inputs [b, T, ...])
  long long s_inter_b, s_inter_t;
  int nheads, ngroups, L, pad_slot_id;
  int slots;              // slots of the pool: a row whose id is outside [0, slots) is skipped (rssm::row_slot)
  int seed;               // the layer's stochastic-rounding seed
  int dt_softplus, dt_is_f32, force_flush, batch;
  int window;             // tokens per row of the step: T of a verify, else 1
  int stages, stage_bytes;  // persistent main kernel: shared-memory stages and bytes per stage
  int fold_bytes;           // fold buffer after the stages ([L][N] B rows of a flush), 0: a flush loads them itself
  int tail_start;           // persistent main kernel: first tile claimed at run time (produce_tiles_claiming_tail)
  int flush_apart;          // persistent main kernel: 1 = flush rows left to the flush-rows kernel
  int l2_hints;             // state kernels: 1 = hint L2 for the guessed slot before the wait (LaunchPlan.l2_hints)""")

# plugins/spec_commit.cu: the speculative commit of every family
SPEC_COMMIT_PARAMS = ParamLayout("SpecCommitParams", """  int* cursor;            // [layers, slots] rssm::SpecCursor words, contiguous
  const int* accepted;    // [batch] accepted tokens per row (1..window), the same in every layer
  const int* slot_idx;    // [batch] each row's slot in every layer
  int batch, pad_slot_id, slots, window, ring_len;
  int layers;             // cursor rows: thread t commits row t % batch of layer t / batch""")

# plugins/delta_rule_decode.cu: one by-value struct for every GDN and KDA kernel
DELTA_PARAMS = ParamLayout("DeltaParams", """  void* state;            // [slots, HV, V, K]
  void* u_ring;           // [slots, HV, L, V]       (replay only)
  void* k_ring;           // GDN [slots, H, L, K], KDA [slots, HV, L, K] (kring_t) (replay only)
  float* g_ring;          // [slots, HV, L(, K)]     (replay only)
  int* cursor;            // [slots]                 (replay only)
  int* arrive;            // [slots]                 (replay only)
  float* coef;            // [rows >= b, HV, record_len(L)] scratch by batch row, one record per (row, value head)
  int* step;              // [rows >= b] scratch by batch row: w of the step, or -(w + 1) for a flush; step[-1]: the
                          // main kernel's tail-tile claim counter (zeroed by the prep kernel)
  const void* q;          // [b, H, K]
  const void* k;          // [b, H, K]
  const void* v;          // [b, HV, V]
  const void* gate;       // GDN: a [b, HV]; KDA: raw gate [b, HV, K]   (act dtype or fp32, see gate_is_f32)
  const void* beta;       // [b, HV] logits                             (act dtype or fp32, see beta_is_f32)
  const float* A_log;     // [HV]
  const float* dt_bias;   // GDN: [HV]; KDA: [HV, K]
  const int* slot_idx;    // [b]
  void* out;              // [b, HV, V]; speculative kernels [b T, HV, V] (token inputs too: row b T + t)
  const int* accepted;    // [b] accepted window tokens, 1 .. window (commit kernels)
  void* inter;            // [b, T, HV, V, K] per-draft states (per-draft kernels)
  float* state_scale;     // [slots, HV, V] fp32 row scales of an fp8/nvfp4 checkpoint, or null
  void* state_bscale;     // [slots, HV, V, K/16] E4M3 block scales of an nvfp4 checkpoint, or null
  void* read;             // dual mode: the read copy's codes [slots, HV, V, K (fp8) or K/2 (nvfp4)], else null
  float* read_scale;      // [slots, HV, V] its fp32 row scales
  void* read_bscale;      // [slots, HV, V, K/16] its E4M3 block scales (nvfp4)
  int* flushes;           // [slots] checkpoint writes per slot (stochastic rounding), or null
  long long s_state_slot, s_state_head;
  long long s_ur_slot, s_ur_head, s_kr_slot, s_kr_head, s_gr_slot, s_gr_head, s_coef_row;
  long long s_inter_b, s_inter_t, s_inter_h;
  long long s_q_b, s_q_h, s_k_b, s_k_h, s_v_b, s_v_h, s_gate_b, s_gate_h, s_beta_b, s_beta_h, s_out_b, s_out_h;
  float scale, lower_bound;  // lower_bound: KDA safe gate, used when has_lower_bound
  int num_k_heads, num_v_heads, L, pad_slot_id;
  int slots;       // slots of the pool: a row whose id is outside [0, slots) is skipped (rssm::row_slot)
  int seed;        // the layer's stochastic-rounding seed
  int gate_is_f32, beta_is_f32, has_lower_bound, force_flush;
  int window;      // speculative kernels: tokens T of a verify window
  int batch, stages, stage_bytes;  // persistent main kernel: batch rows, shared-memory stages, bytes per stage
  int fold_bytes;  // fold buffer after the stages (a flush's ring keys and gates, fold_layout), 0: loaded by the fold
  int tail_start;  // persistent main kernel: first tile claimed at run time (kTailClaims)
  int flush_apart;  // persistent main kernel: 1 = flush rows left to the flush-rows kernel
  int l2_hints;     // state kernels: 1 = hint L2 for the guessed slot before the wait (LaunchPlan.l2_hints)""")


# plugins/state_formats.cuh: the kernels' code of each checkpoint format (MASTER_FMT / READ_FMT)
STATE_FORMAT_CODES = {"fp32": 0, "fp16": 0, "bf16": 0, "fp8": 1, "nvfp4": 2}


def stored_state_params(spec: StateSpec) -> tuple[tuple[str, object], ...]:
    """Compile-time parameters of a checkpoint spec: ``state_t`` (the master's C++ element type, unsigned char for
    FP8/NVFP4 codes) and, for anything but plain round-to-nearest rows, ``master_fmt``, ``read_fmt`` (0 without a read
    copy) and ``sr``."""
    master = spec.checkpoint_format
    state_t = "unsigned char" if master.quantized else get_dtype(master.name).cuda
    if not spec.quantized and not spec.stochastic_rounding:
        return (("state_t", state_t),)
    read = STATE_FORMAT_CODES[spec.read_format.name] if spec.dual else 0
    return (("state_t", state_t), ("master_fmt", STATE_FORMAT_CODES[master.name]), ("read_fmt", read),
            ("sr", int(spec.stochastic_rounding)))


def format_code_checks() -> str:
    """``static_assert`` lines pinning plugins/state_formats.cuh's format codes to STATE_FORMAT_CODES."""
    return "\n".join(f'static_assert(rssm::{cpp} == {STATE_FORMAT_CODES[name]}, "rssm::{cpp} differs from '
                     f'core/layouts.py STATE_FORMAT_CODES");'
                     for cpp, name in (("kFmtPlain", "fp32"), ("kFmtFp8", "fp8"), ("kFmtNvfp4", "nvfp4")))


# ---------------------------------------------------------------------------------------------- rings and scratch
def key_ring_dtype(act_dtype: torch.dtype, per_channel_gate: bool) -> torch.dtype:
    """Element type of the key ring: the activation dtype; fp32 for KDA with fp16 activations (fp16 cannot hold a
    pre-decayed key, up to e^64 |k|) (plugins/delta_rule_decode.cu kring_t)."""
    return torch.float32 if per_channel_gate and act_dtype == torch.float16 else act_dtype


def _r4(n: int) -> int:
    return (n + 3) // 4 * 4


def _r16(n: int) -> int:
    return (n + 15) // 16 * 16


def _r128(n: int) -> int:
    return (n + 127) // 128 * 128


def delta_record_len(L: int, key_dim: int, per_channel_gate: bool) -> int:
    """Floats of the GDN/KDA prep kernel's record per (batch row, value head): ring coefficients (2 L), the log-decay
    (K for KDA, 1 for GDN; from a 16-byte boundary), the q and k multipliers, k·q~ and beta, and for KDA the ring's key
    form (padded to 4) (plugins/delta_rule_decode.cu rec_len)."""
    return _r4(2 * L) + _r4(key_dim if per_channel_gate else 1) + (8 if per_channel_gate else 4)


def delta_verify_rec_floats(L: int, key_dim: int, window: int) -> int:
    """Floats of the GDN/KDA verify record per (batch row, value head) for windows of ``window`` tokens: xq and xk
    [T][K], cq and ck [T][L], and per token k·q~, beta and the log-decay, padded to 4 (plugins/delta_rule_decode.cu
    VerifyRec::stride)."""
    return _r4(2 * window * key_dim + 2 * window * L + 4 * window)


def mamba2_stage_bytes(L: int, rows: int, d_state: int, state_row_bytes: int, act_elem: int, head_dim: int) -> int:
    """Bytes of one shared-memory stage of the Mamba-2 persistent replay kernel for a tile of ``rows`` state rows
    (more than ``head_dim``: a multiple of it, spanning that many adjacent heads): the checkpoint rows non-flush steps
    read (``state_row_bytes`` each, scales included: StateFormat.row_bytes), slot/step, D and coef[0..L] per head, x
    and z of the rows, C, and per head L ring rows (plugins/mamba2_decode.cu stage_layout)."""
    heads = rows // head_dim if rows > head_dim else 1
    head_rows = rows // heads
    d_words = _r16(heads * 4) if heads > 1 else 0  # one head's D is an info word
    return _r128(rows * state_row_bytes + 16 + d_words + _r16(heads * (L + 1) * 4) + 2 * _r16(rows * act_elem)
                 + _r16(d_state * act_elem) + heads * _r16(L * head_rows * act_elem))


def mamba2_stream_records_bytes(L: int, heads: int, head_dim: int, act_elem: int) -> int:
    """Bytes of the Mamba-2 streaming one-launch replay's records after its stages: per head of a CTA its x ring rows
    j < L - 1 in the activation dtype, then its Δ ring in fp32 (plugins/mamba2_decode.cu stream_layout)."""
    return _r16(heads * (L - 1) * head_dim * act_elem) + _r16(heads * (L - 1) * 4)


GDN_PREP_MAX_GROUP = 16  # value heads per key head sharing a GDN verify prep CTA (delta_rule_decode.cu kMaxGroup)
VERIFY_WINDOW_BUCKETS = (2, 4, 8)  # the verify kernels' compile-time window bounds (mamba2_verify_{grid,main}_t<k>)


def verify_coef_floats(ring_len: int, window: int = MAX_WINDOW) -> int:
    """Mamba-2 verify scratch floats per (row, head) (plugins/mamba2_decode.cu VerifyCoef): a fold's weights and
    decay, then those of every token of a window of ``window`` tokens, [R + 1] each."""
    return (1 + window) * (ring_len + 1)


def mamba2_verify_stage_bytes(R: int, rows: int, d_state: int, state_elem: int, act_elem: int, bucket: int) -> int:
    """Bytes of one shared-memory stage of the Mamba-2 persistent verify for windows of up to ``bucket`` tokens and
    rings of ``R`` records: the checkpoint rows, slot/word/D, the weights, x and z of the window's rows, the window's
    C and the history's x rows (plugins/mamba2_decode.cu verify_stage_layout)."""
    return _r128(rows * d_state * state_elem + 16 + _r16(verify_coef_floats(R, bucket) * 4)
                 + 2 * _r16(bucket * rows * act_elem) + _r16(bucket * d_state * act_elem) + _r16(R * rows * act_elem))


def mamba2_fold_bytes(L: int, d_state: int, act_elem: int) -> int:
    """Bytes of the Mamba-2 fold buffer: a flush tile's B rows, [L][d_state] (plugins/mamba2_decode.cu fold_bytes)."""
    return _r16(L * d_state * act_elem)


def delta_stage_bytes(L: int, rows: int, key_dim: int, state_row_bytes: int, act_elem: int,
                      per_channel_gate: bool) -> int:
    """Bytes of one shared-memory stage of the GDN/KDA persistent replay kernel: the checkpoint rows non-flush steps
    read (``state_row_bytes`` each, scales included: StateFormat.row_bytes), slot/step, the record, v of the rows, the
    raw q and k rows and L u-ring rows (plugins/delta_rule_decode.cu stage_layout)."""
    return _r128(rows * state_row_bytes + 16 + _r16(delta_record_len(L, key_dim, per_channel_gate) * 4)
                 + _r16(rows * act_elem) + _r16(2 * key_dim * act_elem) + _r16(L * rows * act_elem))


def delta_verify_stage_bytes(L: int, window: int, rows: int, key_dim: int, state_elem: int, act_elem: int,
                             key_elem: int, per_channel_gate: bool) -> int:
    """Bytes of one shared-memory stage of the GDN/KDA persistent verify for windows of ``window`` tokens: the (rows x
    K) checkpoint tile, slot/cursor word, the verify record, v of the rows per token, L history u rows, and a folding
    row's L ring keys (``key_elem`` bytes each) and cumulative gates (GDN [L], KDA [L][K] fp32)
    (plugins/delta_rule_decode.cu verify_stage_layout)."""
    gates = L * (key_dim if per_channel_gate else 1) * 4
    return _r128(rows * key_dim * state_elem + 16 + delta_verify_rec_floats(L, key_dim, window) * 4
                 + _r16(window * rows * act_elem) + _r16(L * rows * act_elem) + _r16(L * key_dim * key_elem)
                 + _r16(gates))


def delta_fold_bytes(L: int, key_dim: int, key_elem: int, per_channel_gate: bool) -> int:
    """Bytes of the GDN/KDA fold buffer: a flush tile's ring keys [L][K] (``key_elem`` bytes each) and, for GDN, its
    cumulative gates [L] fp32 (plugins/delta_rule_decode.cu fold_bytes)."""
    return _r16(L * key_dim * key_elem) + (0 if per_channel_gate else _r16(L * 4))


def delta_fused_bytes(L: int, rows: int, key_dim: int, key_elem: int, act_elem: int, per_channel_gate: bool) -> int:
    """Bytes of the GDN/KDA one-launch replay's shared ring buffer: a fold buffer, then the CTA's ``rows`` u ring rows
    [L][rows] (plugins/delta_rule_decode.cu fused_buffer_bytes)."""
    return delta_fold_bytes(L, key_dim, key_elem, per_channel_gate) + _r16(L * rows * act_elem)


def mamba2_size_checks(rows: int, d_state: int, state_row_bytes: int, act_elem: int, head_dim: int) -> str:
    """``static_assert`` lines pinning the Mamba-2 kernel's stage and fold sizes to the functions above and the
    state-format codes to STATE_FORMAT_CODES."""
    lines = [format_code_checks()]
    for L in range(1, MAX_BUFFER_LEN + 1):
        stage = mamba2_stage_bytes(L, rows, d_state, state_row_bytes, act_elem, head_dim)
        lines.append(f"static_assert(stage_layout({L}).bytes == {stage}"
                     f', "stage bytes at L={L} differ from core/layouts.py");')
        lines.append(f"static_assert(fold_buffer_bytes({L}) == {mamba2_fold_bytes(L, d_state, act_elem)}"
                     f', "fold bytes at L={L} differ from core/layouts.py");')
    if rows <= head_dim and state_row_bytes % d_state == 0:  # the verify kernels' modules: plain checkpoints
        lines.append("#if PT <= P && MASTER_FMT == 0 && READ_FMT == 0 && !SR")
        for L in range(1, MAX_BUFFER_LEN + 1):
            lines.append(f"static_assert(VerifyCoef::floats({L}) == {verify_coef_floats(L)}"
                         f', "verify scratch at R={L} differs from core/layouts.py");')
            for k in VERIFY_WINDOW_BUCKETS:
                stage = mamba2_verify_stage_bytes(L, rows, d_state, state_row_bytes // d_state, act_elem, k)
                lines.append(f"static_assert(verify_stage_layout<{k}>({L}).bytes == {stage}"
                             f', "verify stage bytes at R={L}, T<={k} differ from core/layouts.py");')
        lines.append("#endif")
    if rows == head_dim and state_row_bytes % d_state == 0:  # the streaming one-launch replay's modules
        lines.append("#if PT == P && MASTER_FMT == 0 && READ_FMT == 0 && !SR")
        tile = head_dim * state_row_bytes
        for L in range(1, MAX_BUFFER_LEN + 1):
            for stages, heads in ((1, 1), (2, 4), (3, 16)):
                total = stages * tile + mamba2_stream_records_bytes(L, heads, head_dim, act_elem)
                lines.append(f"static_assert(stream_layout({stages}, {heads}, {L}).bytes == {total}"
                             f', "streaming replay bytes at L={L} differ from core/layouts.py");')
        lines.append("#endif")
    return "\n".join(lines)


def delta_size_checks(rows: int, key_dim: int, state_row_bytes: int, act_elem: int, key_elem: int,
                      per_channel_gate: bool, speculative: bool = True) -> str:
    """``static_assert`` lines pinning the GDN/KDA kernel's record, stage and fold sizes to the functions above and
    the state-format codes to STATE_FORMAT_CODES; ``speculative``: a plain checkpoint's module, with the verify
    kernels' sizes."""
    lines = [format_code_checks()]
    for L in range(1, MAX_BUFFER_LEN + 1):
        stage = delta_stage_bytes(L, rows, key_dim, state_row_bytes, act_elem, per_channel_gate)
        lines.append(f"static_assert(rec_len({L}) == {delta_record_len(L, key_dim, per_channel_gate)}"
                     f', "record length at L={L} differs from core/layouts.py");')
        lines.append(f'static_assert(stage_layout({L}).bytes == {stage}, "stage bytes at L={L} differ from '
                     f'core/layouts.py");')
        lines.append(f"static_assert(fold_buffer_bytes({L}) == {delta_fold_bytes(L, key_dim, key_elem, per_channel_gate)}"
                     f', "fold bytes at L={L} differ from core/layouts.py");')
        lines.append(f"static_assert(fused_buffer_bytes({L}) == "
                     f"{delta_fused_bytes(L, rows, key_dim, key_elem, act_elem, per_channel_gate)}"
                     f', "fused ring bytes at L={L} differ from core/layouts.py");')
        for T in range(1, min(L, MAX_WINDOW) + 1 if speculative else 1):
            lines.append(f"static_assert(VerifyRec::stride({L}, {T}) == {delta_verify_rec_floats(L, key_dim, T)}"
                         f', "verify record at L={L}, T={T} differs from core/layouts.py");')
            verify_stage = delta_verify_stage_bytes(L, T, rows, key_dim, state_row_bytes // key_dim, act_elem, key_elem,
                                                    per_channel_gate)
            lines.append(f"static_assert(verify_stage_layout({L}, {T}).bytes == {verify_stage}"
                         f', "verify stage bytes at L={L}, T={T} differ from core/layouts.py");')
    if speculative and not per_channel_gate:
        lines.append(f'static_assert(kMaxGroup == {GDN_PREP_MAX_GROUP}, "kMaxGroup differs from core/layouts.py '
                     f'GDN_PREP_MAX_GROUP");')
    return "\n".join(lines)
