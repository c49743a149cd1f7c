// Gated DeltaNet (KDA=0: one log-gate per value head) and Kimi Delta Attention (KDA=1: one log-gate per key channel)
// single-token decode: the baseline state update and the ReplaySSM replay decode, from one source.
//
// Compile-time constants (NVRTC -D): DK (key dim K), DV (value dim V), VTILE (state rows per CTA), KDA, STATE_T, ACT_T,
// and for quantized or stochastically rounded checkpoints MASTER_FMT, READ_FMT and SR as in plugins/mamba2_decode.cu
// (a state row is one value row's K key channels; STATE_T is unsigned char for FP8/NVFP4 masters). Such modules hold
// the baseline, flush and replay kernels; the speculative kernels take plain checkpoints.
// Grid: (V / VTILE, HV, batch); 128 threads. Each warp owns VTILE/4 rows of the (V x K) state of one value head; each
// lane owns K/32 consecutive key channels. Value head hv uses key head hv / (HV/H). Every state row is touched by one warp only.
//
// Step of a row at cursor w (q~ = scale l2norm(q), k = l2norm(k), g = the token's log-gate, alpha = e^g, beta in (0,1),
// G = g_ring[w-1] the cumulative log-gate of the ring (0 if w = 0), G_j = g_ring[j]; GDN broadcasts g, G over channels):
//   kd_j = e^{g + G - G_j} ⊙ k_j                            ring keys decayed to after the current token (exponent <= 0)
//   a_q[v] = S0[v]·(e^{g+G} ⊙ q~) + Σ_{j<w} (kd_j·q~) u_j[v]     (= S_h Diag(alpha) q~, S_h the state before the token)
//   a_k[v] = S0[v]·(e^{g+G} ⊙ k)  + Σ_{j<w} (kd_j·k)  u_j[v]
//   u[v] = beta (v[v] - a_k[v]),  o[v] = a_q[v] + u[v] (k·q~)
//   non-flush (w < L-1): append u, k and G + g at ring position w; cursor <- w + 1
//     GDN keeps one raw key per key head. KDA keeps one key per value head in the pre-decayed form k~_j = e^{-G_j} ⊙ k_j
//     (then kd_j = e^{g+G} ⊙ k~_j: no per-key gate is read) while G_j >= -kPredecayFloor on every channel, else raw.
//   flush (w == L-1 or force_flush): S[v] = e^{g+G} ⊙ S0[v] + Σ_{j<w} u_j[v] kd_j + u[v] k, stored; cursor <- 0
// The baseline is the same step with an empty ring (w = 0, always a flush). S0 is read once, into registers, and the
// flush folds from those registers (no second pass over the checkpoint).
//
// Kernels: `delta_state_update_kernel` (baseline), `delta_flush_decode_kernel` (adaptive small-batch mode: every row
// flushes; with an empty ring it is the baseline step), and the replay as two launches: `delta_replay_prep_kernel`
// (a warp per (batch row, key head) for GDN, per (batch row, value head) for KDA: each value head's record of ring
// coefficients kd_j·q~, kd_j·k and scalars into a per-row scratch, the row's step, appends k and the gate) and
// `delta_replay_main_kernel` (persistent, warp-specialised, a programmatic dependent launch: streams the checkpoint
// tiles and their inputs through shared-memory stages, advances each row's cursor; flush tiles fold), and where the
// plan keeps flush rows apart `delta_replay_flush_kernel` after it (the main kernel skips them).
#include "state_formats.cuh"

#ifndef MASTER_FMT
#define MASTER_FMT 0
#endif
#ifndef READ_FMT
#define READ_FMT 0
#endif
#ifndef SR
#define SR 0
#endif

#if !defined(DK) || !defined(DV) || !defined(VTILE) || !defined(KDA)
#error "define DK (key dim), DV (value dim), VTILE (rows per CTA) and KDA (0: GDN, 1: KDA)"
#endif

using state_t = STATE_T;
using act_t = ACT_T;

// The kernel parameters, one by-value struct for every GDN and KDA kernel: generated from DELTA_PARAMS in
// trtllm_replayssm/core/layouts.py (the one description of its fields), an in-memory header at compilation.
#include "DeltaParams.h"

namespace {

constexpr int kK = DK;
constexpr int kV = DV;
constexpr bool kPerChannel = KDA != 0;
constexpr int kEpl = kK / rssm::kWarpSize;       // key channels per lane
constexpr int kGates = kPerChannel ? kEpl : 1;   // log-gates per lane
constexpr int kTile = VTILE;                      // state rows per CTA
constexpr int kBulkTileMaxBytes = 32768;           // the one-launch replay's state tile in static shared memory
constexpr int kRows = kTile / rssm::kNumWarps;      // state rows per warp
constexpr int kGdnPrepChunk = kEpl <= 4 ? 8 : 2;  // GDN ring keys whose loads the prep issues at once (registers)
constexpr int kGdnReduce = kEpl <= 4 ? 4 : 2;     // of those, reduced at once (rssm::warp_sum_scatter)
constexpr float kL2Eps = 1e-6f;
constexpr float kLogGateFloor = -128.f;          // as core/reference/gdn.py LOG_GATE_FLOOR: e^-128 is 0 in fp32
// KDA ring key form: entry j is pre-decayed (k~_j = e^{-G_j} ⊙ k_j, at most e^64 |k_j|: fits fp32 and bf16) when its
// cumulative log-gate G_j >= -kPredecayFloor on every channel, else raw. A step decays it by e^{lg} (lg <= G_j); where
// that flushes to zero (lg < -87.3) the lost factor e^{lg - G_j} is below e^-23. G_j falls with j, so a ring whose last
// entry is pre-decayed holds only pre-decayed entries (no gate but G_{w-1} is read). core/reference/gdn.py PREDECAY_FLOOR
// mirrors it.
constexpr float kPredecayFloor = 64.f;

// Key ring element: the activation dtype; fp32 for KDA with fp16 activations (fp16 cannot hold a pre-decayed key).
template <bool kKda, class T> struct KeyRingOf { using type = T; };
template <> struct KeyRingOf<true, __half> { using type = float; };
using kring_t = KeyRingOf<kPerChannel, act_t>::type;
static_assert(kK % rssm::kWarpSize == 0 && (kEpl & (kEpl - 1)) == 0, "K must be 32 times a power of two");
static_assert(kTile % rssm::kNumWarps == 0 && kV % kTile == 0, "row tile must divide V and be a multiple of 4");
static_assert(kRows <= rssm::kWarpSize, "at most 32 rows per warp (one output lane per row)");

__host__ __device__ constexpr int round16(int v) { return (v + 15) / 16 * 16; }

// The fold buffer: ring keys [L][K] (kring_t), then for GDN the ring's cumulative gates [L] (fp32; a KDA fold reads
// gates only for raw ring keys, from global memory); trtllm_replayssm/core/layouts.py mirrors the total.
__host__ __device__ constexpr int fold_gates_offset(int L) { return round16(L * kK * int(sizeof(kring_t))); }
__host__ __device__ constexpr int fold_buffer_bytes(int L) {
  return fold_gates_offset(L) + (kPerChannel ? 0 : round16(L * 4));
}
// The one-launch replay's ring buffer (dynamic shared memory): a fold buffer, then the CTA's u ring rows [L][kTile];
// trtllm_replayssm/core/layouts.py delta_fused_bytes mirrors the total.
__host__ __device__ constexpr int fused_buffer_bytes(int L) {
  return fold_buffer_bytes(L) + round16(L * kTile * int(sizeof(act_t)));
}

// Checkpoint storage (plugins/state_formats.cuh): the master (the one checkpoint outside dual mode) and the rows a
// non-flush step reads (dual mode's read copy, else the master). kStored: anything but plain round-to-nearest rows.
constexpr bool kDual = READ_FMT != rssm::kFmtPlain;
constexpr bool kStored = kDual || MASTER_FMT != rssm::kFmtPlain || SR;
// Launch bounds. The state kernels of stored modules, and on sm_100 and later every state kernel, ask for one CTA per
// SM at least (without a minimum ptxas gives some of them few registers and spills). On sm_90 the plain baseline and
// flush kernels of at most 32 state elements per thread (KDA: 16) ask for 8 CTAs per SM, 64 registers (ptxas chose
// 72 and 92 for 32-row tiles; docs/decisions.md, decode row tiles), but the GDN flush kernel of 32 elements per thread
// 6 (with the programmatic prologue it spilled at 64 registers). The plain GDN one-launch replay of 16-bit states and
// at most 16 elements per thread asks for 5 (unbounded, ptxas chose 80 registers and spilled 8 bytes; KDA's spills
// at 5). A stored checkpoint's replay main kernel never folds (its flush rows go to the flush-rows kernel): on sm_90
// it runs 4 CTAs per SM (71-80 registers); on sm_100 and later 3, 2 with stochastic rounding and a read copy, 1 for
// whole-head 128-row tiles (measured on sm_90 only; asked for 2 there, ptxas had kept a folding KDA kernel at 168
// registers and spilled). A plain checkpoint's runs 3. core/ops/delta.py stored_replay_ctas and whole_head_tuning,
// core/plans.py PLAIN_REPLAY_CTAS mirror them.
#if __CUDA_ARCH__ >= 1000
constexpr int kStateMinBlocks = 1;
constexpr int kFlushMinBlocks = 1;
constexpr int kFusedMinBlocks = 1;
#else
constexpr int kStateMinBlocks = kStored ? 1 : (kRows * kEpl <= (kPerChannel ? 16 : 32) ? 8 : 0);
constexpr int kFlushMinBlocks = kStateMinBlocks == 8 && kRows * kEpl > 16 ? 6 : kStateMinBlocks;
constexpr int kFusedMinBlocks = kStored ? 1 : (!kPerChannel && sizeof(state_t) == 2 && kRows * kEpl <= 16 ? 5 : 0);
#endif
#if __CUDA_ARCH__ >= 1000
constexpr int kReplayCtasPerSm = kStored && kTile >= 128 ? 1 : SR && kDual ? 2 : 3;
#else
constexpr int kReplayCtasPerSm = kStored ? 4 : 3;
#endif
using MasterRows = rssm::Rows<MASTER_FMT, state_t, kK>;
constexpr int kReadFmt = kDual ? READ_FMT : MASTER_FMT;  // the rows non-flush steps read
using ReadRows = rssm::Rows<kReadFmt, state_t, kK>;
// FP8 and NVFP4 rows read from the stage take their dots with xq and xk as fp16x2 products (rssm::QuantRowDots).
constexpr bool kQuantRowDots = kReadFmt != rssm::kFmtPlain && 32 % (kK / 16) == 0 &&
                               kRows % (rssm::kWarpSize / (kK / 16)) == 0;
static_assert(MASTER_FMT == rssm::kFmtPlain || sizeof(state_t) == 1, "quantized checkpoints hold byte codes");

// Rows row0 ... of the master checkpoint of (slot, value head hv).
__device__ __forceinline__ MasterRows master_rows(const DeltaParams& p, int slot, int hv, int row0) {
  auto* data = static_cast<unsigned char*>(p.state) +
               (slot * p.s_state_slot + hv * p.s_state_head) * (long long)sizeof(state_t) +
               (long long)row0 * MasterRows::kDataBytes;
  if constexpr (MASTER_FMT == rssm::kFmtPlain) {
    return {data, nullptr, nullptr};
  } else {
    const long long row = ((long long)slot * p.num_v_heads + hv) * kV + row0;
    return {data, static_cast<unsigned char*>(p.state_bscale) + row * MasterRows::kBlockBytes, p.state_scale + row};
  }
}

// Rows row0 ... of what non-flush steps of (slot, hv) read: the read copy in dual mode, else the master.
__device__ __forceinline__ ReadRows nonflush_rows(const DeltaParams& p, int slot, int hv, int row0) {
#if READ_FMT
  const long long row = ((long long)slot * p.num_v_heads + hv) * kV + row0;
  return {static_cast<unsigned char*>(p.read) + row * ReadRows::kDataBytes,
          static_cast<unsigned char*>(p.read_bscale) + row * ReadRows::kBlockBytes, p.read_scale + row};
#else
  return master_rows(p, slot, hv, row0);
#endif
}

// The checkpoint rows of a (slot, head) that a flush writes (rssm::CheckpointRows).
using CheckpointRows = rssm::CheckpointRows<MASTER_FMT, READ_FMT, SR != 0, state_t, kV, kK>;

__device__ __forceinline__ CheckpointRows checkpoint_rows(const DeltaParams& p, int slot, int hv, int row0) {
  CheckpointRows rows{master_rows(p, slot, hv, row0), {}, slot, hv, row0};
  if constexpr (kDual) rows.read = nonflush_rows(p, slot, hv, row0);
  return rows;
}

__device__ __forceinline__ float load_scalar(const void* base, long long off, int is_f32) {
  return is_f32 ? static_cast<const float*>(base)[off] : rssm::to_float(static_cast<const act_t*>(base)[off]);
}

// The current token's raw gate inputs: x (per channel of this lane for KDA, scalar for GDN) and its bias.
__device__ __forceinline__ void load_gate_inputs(const DeltaParams& p, int b, int hv, int col0, float (&x)[kGates],
                                                 float (&bias)[kGates]) {
  const long long off = b * p.s_gate_b + hv * p.s_gate_h;
  if constexpr (kPerChannel) {
    if (p.gate_is_f32) rssm::load_vec<float, kGates>(static_cast<const float*>(p.gate) + off + col0, x);
    else rssm::load_vec<act_t, kGates>(static_cast<const act_t*>(p.gate) + off + col0, x);
    rssm::load_vec<float, kGates>(p.dt_bias + (long long)hv * kK + col0, bias);
  } else {
    x[0] = load_scalar(p.gate, off, p.gate_is_f32);
    bias[0] = p.dt_bias[hv];
  }
}

// The log-gate g of raw gate inputs (load_gate_inputs) with the head's A_log, clamped to kLogGateFloor.
__device__ __forceinline__ void log_gate(const DeltaParams& p, float a_log, const float (&x)[kGates],
                                         const float (&bias)[kGates], float (&g)[kGates]) {
  const float a_head = __expf(a_log);
#pragma unroll
  for (int e = 0; e < kGates; ++e) {
    const float t = x[e] + bias[e];
    const float lg = kPerChannel && p.has_lower_bound ? p.lower_bound * rssm::sigmoidf(a_head * t)
                                                      : -a_head * rssm::softplus_thr20(t);
    g[e] = fmaxf(lg, kLogGateFloor);
  }
}

// The current token's log-gate g (per channel of this lane for KDA, scalar for GDN), clamped to kLogGateFloor.
__device__ __forceinline__ void current_log_gate(const DeltaParams& p, int b, int hv, int col0, float (&g)[kGates]) {
  float x[kGates], bias[kGates];
  load_gate_inputs(p, b, hv, col0, x, bias);
  log_gate(p, p.A_log[hv], x, bias, g);
}

// The current token's q and k of key head h (this lane's channels), as they are.
__device__ __forceinline__ void load_qk(const DeltaParams& p, int b, int h, int col0, float (&q)[kEpl],
                                        float (&k)[kEpl]) {
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.q) + b * p.s_q_b + h * p.s_q_h + col0, q);
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.k) + b * p.s_k_b + h * p.s_k_h + col0, k);
}

// l2-normalises loaded q (times scale) and k in place and returns their multipliers q~ = q_mul q, k = k_mul k_raw
// and k·q~ (warp-wide).
__device__ __forceinline__ float normalize_qk(const DeltaParams& p, float (&qn)[kEpl], float (&kn)[kEpl], float& q_mul,
                                              float& k_mul) {
  float qq = 0.f, kk = 0.f;
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    qq = fmaf(qn[e], qn[e], qq);
    kk = fmaf(kn[e], kn[e], kk);
  }
  q_mul = p.scale * rsqrtf(rssm::warp_sum(qq) + kL2Eps);
  k_mul = rsqrtf(rssm::warp_sum(kk) + kL2Eps);
  float kq = 0.f;
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    qn[e] *= q_mul;
    kn[e] *= k_mul;
    kq = fmaf(kn[e], qn[e], kq);
  }
  return rssm::warp_sum(kq);
}

// Current token: l2-normalised q (times scale) and k of key head h (this lane's channels) and their multipliers;
// returns k·q~ (warp-wide).
__device__ __forceinline__ float normalized_qk(const DeltaParams& p, int b, int h, int col0, float (&qn)[kEpl],
                                               float (&kn)[kEpl], float& q_mul, float& k_mul) {
  load_qk(p, b, h, col0, qn, kn);
  return normalize_qk(p, qn, kn, q_mul, k_mul);
}

__device__ __forceinline__ float normalized_qk(const DeltaParams& p, int b, int h, int col0, float (&qn)[kEpl],
                                               float (&kn)[kEpl]) {
  float q_mul, k_mul;
  return normalized_qk(p, b, h, col0, qn, kn, q_mul, k_mul);
}

// The cumulative log-gate at ring position pos (this lane's channels for KDA).
__device__ __forceinline__ void gate_at(const float* g_ring, int pos, int col0, float (&big_g)[kGates]) {
  if constexpr (kPerChannel) rssm::load_vec<float, kGates>(g_ring + (long long)pos * kK + col0, big_g);
  else big_g[0] = g_ring[pos];
}

// G = g_ring[w-1] (w >= 1): the ring's cumulative log-gate after its last entry (this lane's channels for KDA).
__device__ __forceinline__ void ring_log_gate(const float* g_ring, int w, int col0, float (&big_g)[kGates]) {
  gate_at(g_ring, w - 1, col0, big_g);
}

// lg = g + G: log-decay of the checkpoint to after the current token; big_g = G (g_ring[w-1], 0 for an empty ring).
__device__ __forceinline__ void checkpoint_log_decay(const DeltaParams& p, int b, int hv, int col0, const float* g_ring,
                                                     int w, float (&lg)[kGates], float (&big_g)[kGates]) {
  current_log_gate(p, b, hv, col0, lg);
#pragma unroll
  for (int e = 0; e < kGates; ++e) big_g[e] = 0.f;
  if (w == 0) return;
  ring_log_gate(g_ring, w, col0, big_g);
#pragma unroll
  for (int e = 0; e < kGates; ++e) lg[e] += big_g[e];
}

// Key ring head of value head hv (key head h): one ring per key head for GDN, per value head for KDA.
__device__ __forceinline__ int key_ring_head(int hv, int h) { return kPerChannel ? hv : h; }

// Warp-collective: whether a cumulative log-gate (this lane's channels) keeps a KDA key pre-decayed (kPredecayFloor).
template <int kN>
__device__ __forceinline__ bool predecayed(const float (&big_g)[kN]) {
  bool ok = true;
#pragma unroll
  for (int e = 0; e < kN; ++e) ok = ok && big_g[e] >= -kPredecayFloor;
  return __all_sync(0xffffffffu, ok);
}

// Ring entry j's loaded key `kd` decayed to after the current token: kd = e^{lg - G_j} ⊙ k_j (exponent <= 0).
// GDN: a raw key times its scalar decay. KDA (`dec` = e^{lg}): a pre-decayed entry times `dec`; with `all_predecayed`
// (the ring's last entry is pre-decayed) no gate is read, else G_j decides the entry's form (warp-collective).
__device__ __forceinline__ void decay_ring_key(const float* g_ring, int j, int col0, const float (&lg)[kGates],
                                               const float (&dec)[kEpl], bool all_predecayed, float (&kd)[kEpl]) {
  if constexpr (kPerChannel) {
    if (all_predecayed) {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) kd[e] *= dec[e];
      return;
    }
    float gj[kEpl];
    rssm::load_vec<float, kEpl>(g_ring + (long long)j * kK + col0, gj);
    const bool pre = predecayed(gj);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) kd[e] *= pre ? dec[e] : __expf(lg[e] - gj[e]);
  } else {
    const float decay = __expf(lg[0] - g_ring[j]);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) kd[e] *= decay;
  }
}

// Ring key j loaded and decayed to after the current token (decay_ring_key).
__device__ __forceinline__ void decayed_key(const kring_t* k_ring, const float* g_ring, int j, int col0,
                                            const float (&lg)[kGates], const float (&dec)[kEpl], bool all_predecayed,
                                            float (&kd)[kEpl]) {
  rssm::load_vec<kring_t, kEpl>(k_ring + (long long)j * kK + col0, kd);
  decay_ring_key(g_ring, j, col0, lg, dec, all_predecayed, kd);
}

// This lane's parts of kd·q~ and kd·k of the c-th decayed ring key of a chunk of kChunk: parts[c], parts[kChunk + c].
// A chunk is reduced at once by rssm::warp_sum_scatter<2 kChunk> (lane c < kChunk: kd_c·q~, kChunk + c: kd_c·k).
template <int kChunk>
__device__ __forceinline__ void ring_key_parts(const float (&kd)[kEpl], const float (&qn)[kEpl],
                                               const float (&kn)[kEpl], int c, float (&parts)[2 * kChunk]) {
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    parts[c] = fmaf(kd[e], qn[e], parts[c]);
    parts[kChunk + c] = fmaf(kd[e], kn[e], parts[kChunk + c]);
  }
}

// Dot products kd_j·q~ and kd_j·k of the ring keys j < w (`keys`: row j at keys + j K, this lane's channels at col0),
// kChunk keys' raw loads in flight at once, then kReduce keys per transposed reduction (rssm::warp_sum_scatter):
// `decay(j, kd)` turns loaded key j into kd (in place), `emit(j1, dot)` gets each reduction's result, lane c of it
// holding kd_{j1+c}·q~ and lane kReduce + c kd_{j1+c}·k (c < kReduce; every lane calls emit).
template <int kChunk, int kReduce, class KeyT, class DecayFn, class EmitFn>
__device__ __forceinline__ void ring_dots(const KeyT* keys, int w, int col0, const float (&qn)[kEpl],
                                          const float (&kn)[kEpl], DecayFn decay, EmitFn emit) {
  static_assert(kChunk % kReduce == 0, "a load chunk holds whole reductions");
  for (int j0 = 0; j0 < w; j0 += kChunk) {
    rssm::RawVecOf<KeyT, kEpl> k_raw[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (j0 + c >= w) break;
      rssm::load_raw(keys + (long long)(j0 + c) * kK + col0, k_raw[c]);
    }
#pragma unroll
    for (int c0 = 0; c0 < kChunk; c0 += kReduce) {
      if (j0 + c0 >= w) break;
      float parts[2 * kReduce] = {};
#pragma unroll
      for (int c = 0; c < kReduce; ++c) {
        if (j0 + c0 + c >= w) break;
        float kd[kEpl];
        rssm::unpack(k_raw[c0 + c], kd);
        decay(j0 + c0 + c, kd);
        ring_key_parts<kReduce>(kd, qn, kn, c, parts);
      }
      emit(j0 + c0, rssm::warp_sum_scatter<2 * kReduce>(parts));
    }
  }
}

// The history's records j < hist.count (ring positions hist.position(j); a replay ring: origin 0) folded into this
// warp's loaded checkpoint rows `acc`: the state after the last record, e^{G} ⊙ S0 + Σ_j u_j (e^{G - G_j} ⊙ k_j)ᵀ
// with G the last record's gate (exponents <= 0). `keys` and `gates` are the ring heads' (global or a fold buffer),
// `u_rows` the u ring at the warp's first row, position pos at u_rows + pos * u_stride.
__device__ __forceinline__ void fold_records(const kring_t* keys, const float* gates, const act_t* u_rows, int u_stride,
                                             int L, rssm::SpecCursor hist, int col0, float (&acc)[kRows][kEpl]) {
  float big_g[kGates], dec[kEpl];
  gate_at(gates, hist.position(hist.count - 1, L), col0, big_g);
#pragma unroll
  for (int e = 0; e < kEpl; ++e) dec[e] = __expf(big_g[kPerChannel ? e : 0]);
  const bool all_predecayed = kPerChannel && predecayed(big_g);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] *= dec[e];
  for (int j = 0; j < hist.count; ++j) {
    const int pos = hist.position(j, L);
    float kd[kEpl];
    decayed_key(keys, gates, pos, col0, big_g, dec, all_predecayed, kd);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float uj = rssm::to_float(u_rows[(long long)pos * u_stride + r]);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(uj, kd[e], acc[r][e]);
    }
  }
}

// fold_records from the rings in global memory (rows row0 ... of value head hv, key head h).
__device__ __forceinline__ void fold_ring_into_rows(const DeltaParams& p, int slot, int hv, int h, int row0,
                                                    rssm::SpecCursor hist, int col0, float (&acc)[kRows][kEpl]) {
  const float* g_ring = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
  const kring_t* k_ring =
      static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head;
  const act_t* u_ring = static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head + row0;
  fold_records(k_ring, g_ring, u_ring, kV, p.L, hist, col0, acc);
}

// This lane's parts of one state row's dots with xq and xk.
__device__ __forceinline__ void row_parts(const float (&row)[kEpl], const float (&xq)[kEpl], const float (&xk)[kEpl],
                                          float& pq, float& pk) {
  pq = pk = 0.f;
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    pq = fmaf(row[e], xq[e], pq);
    pk = fmaf(row[e], xk[e], pk);
  }
}

// The row dots of this warp's rows against xq and xk: lane r < kRows gets aq_r = S[r]·xq and ak_r = S[r]·xk. With
// 2 kRows <= 32 one transposed reduction (rssm::warp_sum_scatter: lane r aq_r, lane kRows + r ak_r), then one shuffle
// moves ak_r to lane r; with more rows, a multiple of 8, one per 8 rows; else a warp_sum per dot.
__device__ __forceinline__ void row_dots(const float (&acc)[kRows][kEpl], const float (&xq)[kEpl],
                                         const float (&xk)[kEpl], float& aq, float& ak) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  if constexpr (2 * kRows <= rssm::kWarpSize && (kRows & (kRows - 1)) == 0) {
    float parts[2 * kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_parts(acc[r], xq, xk, parts[r], parts[kRows + r]);
    aq = rssm::warp_sum_scatter<2 * kRows>(parts);
    ak = __shfl_sync(0xffffffffu, aq, kRows + lane % kRows);
  } else if constexpr (kRows % 8 == 0 && kRows >= 8) {
    // Chunks of 8 rows, one transposed reduction of their 16 dots each: lane l gets row 8 c + l % 8's aq (l % 16 < 8)
    // or ak (l % 16 >= 8) of chunk c; lane r then takes its chunk's two.
    constexpr int kChunks = kRows >= 8 ? kRows / 8 : 1;  // (a non-template function: checked for every kRows)
    float got[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float parts[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) row_parts(acc[min(8 * c + i, kRows - 1)], xq, xk, parts[i], parts[8 + i]);
      got[c] = rssm::warp_sum_scatter<16>(parts);
    }
    aq = ak = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float q = __shfl_sync(0xffffffffu, got[c], lane % 8), k = __shfl_sync(0xffffffffu, got[c], 8 + lane % 8);
      if (lane / 8 == c) {
        aq = q;
        ak = k;
      }
    }
  } else {
    aq = ak = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float pq, pk;
      row_parts(acc[r], xq, xk, pq, pk);
      pq = rssm::warp_sum(pq);
      pk = rssm::warp_sum(pk);
      if (lane == r) {
        aq = pq;
        ak = pk;
      }
    }
  }
}

// One token on this warp's rows held in registers (`acc`, kRows rows of this lane's channels; lane r holds v of row
// r in `v_lane`): a_q = S·(e^{g} ⊙ q~), a_k likewise with k (row_dots), u = beta (v - a_k), o = a_q + u (k·q~), then
// S = e^{g} ⊙ S + u kᵀ in the registers. Returns o of row `lane` (lanes < kRows), its u in `u_lane`.
__device__ __forceinline__ float token_update(float (&acc)[kRows][kEpl], const float (&qn)[kEpl],
                                              const float (&kn)[kEpl], float kq, const float (&lg)[kGates],
                                              float beta, float v_lane, float& u_lane) {
  float decay[kGates];
#pragma unroll
  for (int e = 0; e < kGates; ++e) decay[e] = __expf(lg[e]);
  float xq[kEpl], xk[kEpl];
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    xq[e] = decay[kPerChannel ? e : 0] * qn[e];
    xk[e] = decay[kPerChannel ? e : 0] * kn[e];
  }
  float aq, ak;
  row_dots(acc, xq, xk, aq, ak);
  u_lane = beta * (v_lane - ak);  // row `lane` (lanes < kRows)
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float u = __shfl_sync(0xffffffffu, u_lane, r);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(u, kn[e], acc[r][e] * decay[kPerChannel ? e : 0]);
  }
  return fmaf(u_lane, kq, aq);
}

// A one-launch non-flush step's ring coefficients into `coefs` (shared): coefs[j] = kd_j·q~, coefs[kMaxL + j] = kd_j·k
// for j < w, kd_j = e^{lt - G_j} ⊙ k_j (lt = G_{w-1} + g, `dec` = e^{lt}); the warps take contiguous quarters of the
// ring (ring_dots). The caller synchronises the CTA before reading them.
__device__ __forceinline__ void ring_coefficients(const kring_t* keys, const float* gates, int w, int col0,
                                                  const float (&qn)[kEpl], const float (&kn)[kEpl],
                                                  const float (&lt)[kGates], const float (&dec)[kEpl],
                                                  bool all_predecayed, float* coefs) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int per = (w + rssm::kNumWarps - 1) / rssm::kNumWarps, j0 = warp * per;
  const int n = min(w, j0 + per) - j0;
  if (n <= 0) return;
  ring_dots<kGdnPrepChunk, kGdnReduce>(
      keys + (long long)j0 * kK, n, col0, qn, kn,
      [&](int j, float (&kd)[kEpl]) { decay_ring_key(gates, j0 + j, col0, lt, dec, all_predecayed, kd); },
      [&](int j1, float dot) {
        const int c = lane % kGdnReduce;
        if (lane < 2 * kGdnReduce && j1 + c < n) coefs[(lane < kGdnReduce ? 0 : rssm::kMaxL) + j0 + j1 + c] = dot;
      });
}

// A one-launch non-flush step from the checkpoint rows `acc` and the ring coefficients (ring_coefficients; `u_rows`:
// the staged u ring at the warp's first row, position j at u_rows + j kTile): a_q = e^{lt} S0·q~ + Σ_{j<w} (kd_j·q~)
// u_j, a_k likewise, u = beta (v - a_k). Returns o of row `lane` (lanes < kRows), its u in `u_lane`; no state update.
__device__ __forceinline__ float nonflush_output(const float (&acc)[kRows][kEpl], const float (&qn)[kEpl],
                                                 const float (&kn)[kEpl], float kq, const float (&dec)[kEpl],
                                                 float beta, float v_lane, const float* coefs, const act_t* u_rows,
                                                 int w, float& u_lane) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  float xq[kEpl], xk[kEpl];
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    xq[e] = dec[e] * qn[e];
    xk[e] = dec[e] * kn[e];
  }
  float aq, ak;
  row_dots(acc, xq, xk, aq, ak);
  if (lane < kRows) {
    for (int j = 0; j < w; ++j) {
      const float uj = rssm::to_float(u_rows[j * kTile + lane]);
      aq = fmaf(coefs[j], uj, aq);
      ak = fmaf(coefs[rssm::kMaxL + j], uj, ak);
    }
  }
  u_lane = beta * (v_lane - ak);
  return fmaf(u_lane, kq, aq);
}

// The state kernels' step kinds: the baseline (no ring, no cursor); the adaptive-mode flush (every row folds the ring
// entries it still holds, none in the steady state, and writes its state); the one-launch replay (a non-flush step
// outputs from the checkpoint rows and per-entry ring coefficients, appends its records and writes no state; a flush
// at w = L - 1 folds the ring into the rows in registers and writes them); the replay's flush rows kept apart from its
// persistent kernel (a flush at the cursor w of the prep kernel's step word, which also counted the write; the
// cursor is reset by the caller).
enum class StepKind { kBaseline, kFlush, kFused, kApart };

// A state kernel's tile: batch row, value head, first state row (the grid's by default).
struct StepTile {
  int b, hv, row0;
};

__device__ __forceinline__ StepTile grid_tile() { return {int(blockIdx.z), int(blockIdx.y), int(blockIdx.x) * kTile}; }

// The ring staging of the one-launch replay and the flush-rows kernel: ring keys, GDN gates (the fold buffer's
// layout) and the u rows of the CTA's row tile, entries j < n, copied to shared memory by every thread. The one-launch
// replay stages every position a fold can read (n = L - 1) without waiting for the cursor, so they travel with the
// state loads (the fold reads entries j < w only); the flush-rows kernel the w it folds. Awaited by the caller. Keys
// move in 16-byte async copies where the ring is 16-byte aligned, the rest in 4-byte ones.
__device__ __forceinline__ void stage_ring(const DeltaParams& p, int slot, int hv, int h, int row0, int n,
                                          unsigned char* buf) {
  const kring_t* k_ring =
      static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head;
  constexpr int kKeyWords = kK * int(sizeof(kring_t)) / 4, kRowWords = kTile * int(sizeof(act_t)) / 4;
  static_assert(kKeyWords % 4 == 0, "a ring key row is a whole number of 16-byte chunks");
  if ((reinterpret_cast<unsigned long long>(k_ring) & 15) == 0) {
    for (int i = threadIdx.x; i < n * kKeyWords / 4; i += rssm::kThreads)
      rssm::cp_async16(buf + i * 16, reinterpret_cast<const uint4*>(k_ring) + i);
  } else {
    for (int i = threadIdx.x; i < n * kKeyWords; i += rssm::kThreads)
      rssm::cp_async4(buf + i * 4, reinterpret_cast<const unsigned*>(k_ring) + i);
  }
  if constexpr (!kPerChannel) {
    const float* g_ring = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
    for (int i = threadIdx.x; i < n; i += rssm::kThreads) rssm::cp_async4(buf + fold_gates_offset(p.L) + i * 4, g_ring + i);
  }
  const act_t* u_ring = static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head + row0;
  for (int i = threadIdx.x; i < n * kRowWords; i += rssm::kThreads) {
    const int j = i / kRowWords, word = i % kRowWords;
    rssm::cp_async4(buf + fold_buffer_bytes(p.L) + i * 4, reinterpret_cast<const unsigned*>(u_ring + (long long)j * kV) + word);
  }
  rssm::cp_async_commit();
}

// A state kernel's L2 hints before it waits for the kernel before it, where the plan says so (p.l2_hints;
// rssm::guessed_slot): each warp's checkpoint rows (a one-launch replay in dual mode: the read copy's too), the
// cursor, and for the one-launch replay the ring records stage_ring copies (keys and GDN gates by warps 1 and 2, u
// rows by warp 3).
template <StepKind kKind>
__device__ __forceinline__ void prefetch_step(const DeltaParams& p, StepTile at) {
  if (!p.l2_hints) return;
  const int slot = rssm::guessed_slot(p.slot_idx, at.b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int hv = at.hv, row = at.row0 + warp * kRows;
  master_rows(p, slot, hv, row).prefetch_l2(kRows);
  if constexpr (kKind == StepKind::kBaseline) return;
  if constexpr (kKind == StepKind::kFused && kDual) nonflush_rows(p, slot, hv, row).prefetch_l2(kRows);
  if (threadIdx.x == 0) rssm::prefetch_line_l2(p.cursor + slot);
  if constexpr (kKind == StepKind::kFused) {
    const int n = p.L - 1, h = hv / (p.num_v_heads / p.num_k_heads);
    if (warp == 1)
      rssm::prefetch_l2(static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head,
                        n * kK * int(sizeof(kring_t)));
    if (!kPerChannel && warp == 2) rssm::prefetch_l2(p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head, n * 4);
    if (warp == 3 && lane < n)
      rssm::prefetch_line_l2(static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head +
                             (long long)lane * kV + at.row0);
  }
}

// The flush-rows kernel's stored rows are encoded in the block lane layout (rssm::BlockLanes): the block maximum is a
// lane's own and a row's maximum takes log2(K / 16) shuffles, where the registers' layout (a row per warp, kEpl
// columns per lane) spends a warp reduction per row.
using EncLanes = rssm::BlockLanes<kK>;
// Every stored spec but two stochastically rounded encodes per row (a quantized master and a read copy), whose Philox
// streams for 16 columns spill beside the warp's rows (KDA, sm_90a): those keep the registers' layout.
constexpr bool kEncodeByBlocks = kStored && !(SR && kDual && MASTER_FMT != rssm::kFmtPlain);

// Stores this warp's kRows rows (`acc`: this lane's kEpl columns of each, from column lane · kEpl) through a
// per-warp shared-memory transpose, a pass of rows (EncLanes::kPassRows) at a time; where the rows do not fill the
// last pass, the spare lanes repeat the warp's last row (same values, same stores).
__device__ __forceinline__ void store_rows_by_blocks(const CheckpointRows& ckpt, const float (&acc)[kRows][kEpl],
                                                     unsigned flushes, int seed) {
  __shared__ __align__(16) float s_rows[rssm::kNumWarps][EncLanes::kPassRows][kK + 4];  // + 4: no bank conflicts
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  float(*rows)[kK + 4] = s_rows[warp];
  const int pass_row = lane % EncLanes::kPassRows, blk = lane / EncLanes::kPassRows;
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += EncLanes::kPassRows) {
#pragma unroll
    for (int i = 0; i < EncLanes::kPassRows; ++i) {
      const int r = r0 + i < kRows ? r0 + i : kRows - 1;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) rows[i][lane * kEpl + e] = acc[r][e];
    }
    __syncwarp();
    float v[EncLanes::kCols];
#pragma unroll
    for (int q = 0; q < EncLanes::kCols / 4; ++q) {
      const float4 c = *reinterpret_cast<const float4*>(&rows[pass_row][blk * EncLanes::kCols + 4 * q]);
      v[4 * q] = c.x;
      v[4 * q + 1] = c.y;
      v[4 * q + 2] = c.z;
      v[4 * q + 3] = c.w;
    }
    ckpt.template store<EncLanes::kCols, EncLanes::kPassRows>(min(r0 + pass_row, kRows - 1), v, flushes, seed, blk);
    __syncwarp();  // the pass's rows are read before the next pass rewrites them
  }
}

// One decode step of a CTA's row tile `at`, the state read once into registers (StepKind; kApart: at cursor
// `apart_w`).
template <StepKind kKind>
__device__ __forceinline__ void delta_step(const DeltaParams& p, unsigned char* ring_buf, StepTile at,
                                           int apart_w = 0) {
  constexpr bool kApart = kKind == StepKind::kApart;
  constexpr bool kReplay = kKind != StepKind::kBaseline && !kApart, kFused = kKind == StepKind::kFused;
  // The one-launch replay of a plain checkpoint brings its whole state tile (kTile contiguous rows) into shared memory
  // by one bulk copy, where it fits and its rows are at least 64 values per thread (the tiles it runs at batch 4 and
  // up); its rows move to registers where the step first uses them (land_tile).
  constexpr bool kBulkTile =
      kFused && !kStored && kRows * kEpl >= 64 && kTile * kK * int(sizeof(state_t)) <= kBulkTileMaxBytes;
  __shared__ __align__(128) state_t s_tile[kBulkTile ? kTile * kK : 1];
  __shared__ unsigned long long s_tile_full;
  if constexpr (kBulkTile) rssm::mbar_init_cta(&s_tile_full, 1);
  if constexpr (!kApart) {  // a programmatic state kernel (the flush-rows kernel has waited in for_each_flush_item)
    prefetch_step<kKind>(p, at);
    rssm::wait_previous_grid();
  }
  const int b = at.b;
  const int hv = at.hv, group = p.num_v_heads / p.num_k_heads, h = hv / group;
  const int row0 = at.row0;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int col0 = lane * kEpl, wrow0 = warp * kRows;  // wrow0: first tile row of this warp
  // The token's inputs: normalised q and k, the log gate, beta, and v of the warp's rows (lane r: row r); loaded
  // in turn with their arithmetic (inputs_in_turn), or all loaded first (fetch_inputs) and finished later
  // (finish_inputs).
  float qn[kEpl], kn[kEpl], lg[kGates], gx[kGates], gbias[kGates];
  float kq, beta, v_lane, a_log;
  auto raw_beta = [&] { return load_scalar(p.beta, b * p.s_beta_b + hv * p.s_beta_h, p.beta_is_f32); };
  auto load_v = [&] {
    const act_t* v_in = static_cast<const act_t*>(p.v) + b * p.s_v_b + hv * p.s_v_h + row0 + wrow0;
    v_lane = lane < kRows ? rssm::to_float(v_in[lane]) : 0.f;
  };
  auto inputs_in_turn = [&] {
    kq = normalized_qk(p, b, h, col0, qn, kn);
    current_log_gate(p, b, hv, col0, lg);
    beta = rssm::sigmoidf(raw_beta());
    load_v();
  };
  auto fetch_inputs = [&] {
    load_qk(p, b, h, col0, qn, kn);
    load_gate_inputs(p, b, hv, col0, gx, gbias);
    a_log = p.A_log[hv];
    beta = raw_beta();
    load_v();
  };
  auto finish_inputs = [&] {
    float q_mul, k_mul;
    kq = normalize_qk(p, qn, kn, q_mul, k_mul);
    log_gate(p, a_log, gx, gbias, lg);
    beta = rssm::sigmoidf(beta);
  };
  // The flush kernel loads its inputs before the slot id is known. Loaded in turn after the state loads, ptxas
  // issued those after the q/k norms, so the step waited for three memory round trips in turn (slot id, inputs,
  // state); loaded first, the state loads issue right after the slot id's branch, beside the norms.
  constexpr bool kInputsFirst = kKind == StepKind::kFlush;
  if constexpr (kInputsFirst) fetch_inputs();
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  auto zero_output = [&] {  // a skipped row's outputs are zeros; its state, ring and cursor are not touched
    if (lane < kRows)
      static_cast<act_t*>(p.out)[b * p.s_out_b + hv * p.s_out_h + row0 + wrow0 + lane] = rssm::from_float<act_t>(0.f);
  };
  if (slot == p.pad_slot_id) {
    zero_output();
    return;
  }
  state_t* tile = static_cast<state_t*>(p.state) + slot * p.s_state_slot + hv * p.s_state_head + (long long)row0 * kK;
  const CheckpointRows ckpt = checkpoint_rows(p, slot, hv, row0 + wrow0);
  // This write's key: counted at the arrival, or (kApart) by the prep kernel.
  const unsigned flushes = SR && p.flushes ? p.flushes[slot] - (kApart ? 1u : 0u) : 0u;

  // rssm::row_slot, replay kinds only (the baseline reads no cursor and does not detect repeated ids: docs/decisions.md,
  // rows a step skips): a skipped row is computed like one with an empty ring (every read in its slot) and tested
  // before the first write, so that no branch separates the state loads from the input loads.
  int w = apart_w;
  bool bad_cursor = false;
  auto read_cursor = [&] {
    w = p.cursor[slot];
    bad_cursor = !rssm::cursor_in_ring(w, p.L);
    if (bad_cursor) w = 0;
  };
  // A one-launch replay with a read copy reads the cursor first: a non-flush step decodes the read copy.
  if constexpr (kFused && kDual) read_cursor();

  // Issue the big state loads first (read-once, streaming); everything below overlaps with them.
  float acc[kRows][kEpl];
  if constexpr (kBulkTile) {  // (the ops require 16-byte aligned state rows: core/ops/delta.py)
    if (threadIdx.x == 0) {
      constexpr unsigned kBytes = kTile * kK * sizeof(state_t);
      rssm::mbar_arrive_expect_tx(&s_tile_full, kBytes);
      rssm::bulk_load(s_tile, tile, kBytes, &s_tile_full);
    }
  } else
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kFused && kDual) {
      if (w == p.L - 1) ckpt.master.decode(r, lane, acc[r]);
      else ckpt.read.decode(r, lane, acc[r]);
    } else if constexpr (kStored) {
      ckpt.master.decode(r, lane, acc[r]);
    } else {
      rssm::load_vec<state_t, kEpl, true>(tile + (wrow0 + r) * kK + col0, acc[r]);
    }
  }
  if constexpr (kFused) stage_ring(p, slot, hv, h, row0, p.L - 1, ring_buf);
  if constexpr (kApart) stage_ring(p, slot, hv, h, row0, apart_w, ring_buf);
  if constexpr (kReplay && !(kFused && kDual)) read_cursor();
  if constexpr (kFused && kPerChannel) {  // the fold's G = G_{w-1} (KDA gates are not staged): in L1 by then
    if (w > 0) rssm::prefetch_l1(p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head + (long long)(w - 1) * kK + col0);
  }
  const bool flushing = !kFused || w == p.L - 1;
  // Thread 0's arrival (rssm::cta_arrival; -1: none), answered at the end of the step (advance).
  int arrived_before = -1;
  auto advance = [&] {
    if (threadIdx.x == 0)
      rssm::advance_if_last(arrived_before, p.cursor, p.arrive, slot, gridDim.x * gridDim.y, flushing ? 0 : w + 1,
                            SR && flushing ? p.flushes : nullptr);
  };
  const int first_id = kReplay ? rssm::preload_row_id(p.slot_idx, b, lane) : 0;
  auto fold_pending_ring = [&] {  // replay kinds; uniform per CTA (the cursor advances below)
    if constexpr (kFused || kApart) {
      rssm::cp_async_wait_all();
      __syncthreads();  // the staged ring has landed; every thread has read the cursor
      if (w == 0) return;
      const float* gates = kPerChannel ? p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head
                                       : reinterpret_cast<const float*>(ring_buf + fold_gates_offset(p.L));
      fold_records(reinterpret_cast<const kring_t*>(ring_buf), gates,
                   reinterpret_cast<const act_t*>(ring_buf + fold_buffer_bytes(p.L)) + wrow0, kTile, p.L,
                   rssm::SpecCursor{0, w}, col0, acc);
      if constexpr (kApart) __syncthreads();  // the staged ring is read before the CTA's next item restages it
    } else {
      if (w == 0) return;
      fold_ring_into_rows(p, slot, hv, h, row0 + wrow0, rssm::SpecCursor{0, w}, col0, acc);
      __syncthreads();  // every thread has read the cursor
    }
  };
  // The flush kernel folds a pending ring after the token's input loads (docs/decisions.md, flush order in the flush
  // kernel), the GDN flush-rows kernel before them. The one-launch replay folds (a flush) or computes its ring
  // coefficients (otherwise) after them: its inputs load while the staged ring lands.
  constexpr bool kFoldFirst = kApart && !kPerChannel;
  if constexpr (kFoldFirst) fold_pending_ring();

  if constexpr (kInputsFirst) finish_inputs();
  else inputs_in_turn();

  auto land_tile = [&] {  // kBulkTile: once the copy has landed, this warp's rows into registers
    if constexpr (kBulkTile) {
      rssm::mbar_wait(&s_tile_full, 0);
#pragma unroll
      for (int r = 0; r < kRows; ++r) rssm::load_vec<state_t, kEpl>(&s_tile[(wrow0 + r) * kK + col0], acc[r]);
    }
  };

  const float* ring_coefs = nullptr;
  // A one-launch non-flush step does not fold: the ring enters its output through per-entry coefficients.
  float dec[kEpl];
  if constexpr (kFused) {
    __shared__ float coefs[2 * rssm::kMaxL];
    if (flushing) {
      land_tile();
      fold_pending_ring();
    } else {
      rssm::cp_async_wait_all();
      __syncthreads();  // the staged ring has landed; every thread has read the cursor
      float lt[kGates];
#pragma unroll
      for (int e = 0; e < kGates; ++e) lt[e] = lg[e];
      bool all_predecayed = true;
      const float* gates = kPerChannel ? p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head
                                       : reinterpret_cast<const float*>(ring_buf + fold_gates_offset(p.L));
      if (w != 0) {
        float big_g[kGates];
        gate_at(gates, w - 1, col0, big_g);
        all_predecayed = !kPerChannel || predecayed(big_g);
#pragma unroll
        for (int e = 0; e < kGates; ++e) lt[e] += big_g[e];
      }
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dec[e] = __expf(lt[kPerChannel ? e : 0]);
      if (w != 0) {
        ring_coefficients(reinterpret_cast<const kring_t*>(ring_buf), gates, w, col0, qn, kn, lt, dec, all_predecayed,
                          coefs);
        __syncthreads();  // every warp's coefficients are in
      }
    }
    ring_coefs = coefs;
    if (!flushing) land_tile();  // (also before a skipped row's return: the copy lands in this CTA's memory)
  } else if constexpr ((kReplay || kApart) && !kFoldFirst) {
    fold_pending_ring();
  }
  if constexpr (kReplay) {
    if (bad_cursor ||
        __any_sync(0xffffffffu, rssm::earlier_row_has(p.slot_idx, b, slot, lane, rssm::kWarpSize, first_id))) {
      zero_output();  // the same answer in every warp
      return;
    }
    if constexpr (kFused) {  // every thread has read cursor and count (the staging barrier)
      if (threadIdx.x == 0) arrived_before = rssm::cta_arrival(p.arrive, slot);
    } else if (w != 0 || SR) {  // SR: the last arrival counts the slot's checkpoint write
      if (SR && w == 0) __syncthreads();  // (w != 0: after the fold's barrier) every thread has read cursor and count
      if (threadIdx.x == 0) arrived_before = rssm::cta_arrival(p.arrive, slot);
    }
  }

  float u_lane = 0.f;
  const float o_lane =
      kFused && !flushing
          ? nonflush_output(acc, qn, kn, kq, dec, beta, v_lane, ring_coefs,
                            reinterpret_cast<const act_t*>(ring_buf + fold_buffer_bytes(p.L)) + wrow0, w, u_lane)
          : token_update(acc, qn, kn, kq, lg, beta, v_lane, u_lane);
  if (lane < kRows)
    static_cast<act_t*>(p.out)[b * p.s_out_b + hv * p.s_out_h + row0 + wrow0 + lane] = rssm::from_float<act_t>(o_lane);
  if (kFused && !flushing) {  // append the token's records at ring position w (the prep and main kernels' form)
    if (lane < kRows) {
      act_t* u_ring = static_cast<act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head + (long long)w * kV;
      u_ring[row0 + wrow0 + lane] = rssm::from_float<act_t>(u_lane);
    }
    if (blockIdx.x == 0 && warp == 0) {  // G_w = g + G_{w-1}: the checkpoint's log-decay to after this token
      float* g_ring = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
      float big_g[kGates] = {};
      if (w > 0) ring_log_gate(g_ring, w, col0, big_g);
#pragma unroll
      for (int e = 0; e < kGates; ++e) big_g[e] += lg[e];
      kring_t* k_dst =
          static_cast<kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head + (long long)w * kK;
      if constexpr (kPerChannel) {
        const bool pre = predecayed(big_g);
        float key[kEpl];
#pragma unroll
        for (int e = 0; e < kEpl; ++e) key[e] = pre ? kn[e] * __expf(-big_g[e]) : kn[e];
        rssm::store_vec<kring_t, kEpl>(k_dst + col0, key);
        rssm::store_vec<float, kGates>(g_ring + (long long)w * kK + col0, big_g);
      } else {
        if (lane == 0) g_ring[w] = big_g[0];
        if (hv % group == 0) rssm::store_vec<kring_t, kEpl>(k_dst + col0, kn);  // one key per key head
      }
    }
    advance();
    return;
  }
  if constexpr (kApart && kEncodeByBlocks) {
    store_rows_by_blocks(ckpt, acc, flushes, p.seed);
  } else if constexpr (kStored) {
    ckpt.template store_rows<kRows>(0, acc, flushes, p.seed);
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) rssm::store_vec<state_t, kEpl, true>(tile + (wrow0 + r) * kK + col0, acc[r]);
  }
  if constexpr (kReplay) advance();
}

}  // namespace

// Baseline: u = beta (v - S Diag(alpha) k), S = S Diag(alpha) + u kᵀ, o = S q~. Reads and writes the state every step.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kStateMinBlocks)
    delta_state_update_kernel(const DeltaParams p) {
  delta_step<StepKind::kBaseline>(p, nullptr, grid_tile());
}

// Adaptive small-batch mode: every row flushes; with an empty ring (the steady state) this is the baseline step.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kFlushMinBlocks)
    delta_flush_decode_kernel(const DeltaParams p) {
  delta_step<StepKind::kFlush>(p, nullptr, grid_tile());
}

// Small-batch replay in one launch (ring staged in shared memory, fused_buffer_bytes(L)): a non-flush step outputs
// from its checkpoint rows and per-entry ring coefficients and appends its records; a flush (w = L - 1) folds the
// ring into the rows and writes the state.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kFusedMinBlocks)
    delta_fused_decode_kernel(const DeltaParams p) {
  extern __shared__ __align__(16) unsigned char ring_buf[];
  delta_step<StepKind::kFused>(p, ring_buf, grid_tile());
}

// The prep kernel's record per (batch row, value head), in floats: ring coefficients kd_j·q~ (j < L) and kd_j·k,
// the log-decay lg of the checkpoint to after the token (per key channel for KDA, one for GDN; from a 16-byte
// boundary), then the multipliers of q and k (q~ = q_mul q, k = k_mul k_raw: the main kernel's producer copies the
// raw q and k rows), k·q~ and beta; KDA then 1 if every ring entry is pre-decayed, else 0 (and 3 floats of padding).
// trtllm_replayssm/core/layouts.py:delta_record_len mirrors the length (checked at compilation).
__host__ __device__ constexpr int rec_cq(int) { return 0; }
__host__ __device__ constexpr int rec_ck(int L) { return L; }
__host__ __device__ constexpr int rec_lg(int L) { return (2 * L + 3) / 4 * 4; }
__host__ __device__ constexpr int rec_sc(int L) { return rec_lg(L) + (kPerChannel ? kK : 4); }  // q_mul, k_mul, kq, beta
__host__ __device__ constexpr int rec_form(int L) { return rec_sc(L) + 4; }                      // KDA only
__host__ __device__ constexpr int rec_len(int L) { return rec_sc(L) + (kPerChannel ? 8 : 4); }

// The record's q and k multipliers (lane 0 of a warp).
__device__ __forceinline__ void write_record_muls(float* rec, int L, float q_mul, float k_mul) {
  rec[rec_sc(L)] = q_mul;
  rec[rec_sc(L) + 1] = k_mul;
}

// Warp-collective: the record's log-decay lg (per key channel of this lane for KDA), k·q~ and beta into `rec`
// (rec_*); the ring coefficients and multipliers are written by the caller.
__device__ __forceinline__ void write_record_tail(float* rec, int L, const float (&lg)[kGates], float kq, float beta) {
  const int lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  if constexpr (kPerChannel) rssm::store_vec<float, kGates>(rec + rec_lg(L) + col0, lg);
  if (lane == 0) {
    if constexpr (!kPerChannel) rec[rec_lg(L)] = lg[0];
    rec[rec_sc(L) + 2] = kq;
    rec[rec_sc(L) + 3] = beta;
  }
}

// KDA prep: ring keys whose raw loads are in flight at once, at most 8 registers of them (64 per thread at 8 CTAs per
// SM: 4 16-bit or 2 fp32 keys for K = 128, one for K = 256); shared-memory staging was measured far slower,
// docs/decisions.md, KDA prep loads.
constexpr int kRingKeyRegs = (kEpl * int(sizeof(kring_t)) + 3) / 4;  // registers of one raw ring key per lane
constexpr int kPrepChunk = kEpl > 4 ? 1 : (8 / kRingKeyRegs < 4 ? 8 / kRingKeyRegs : 4);

// KDA ring coefficients kd_j·q~ and kd_j·k (j < w) into the record: the ring keys decayed to after the token
// (decay_ring_key), loaded kChunk at a time (ring_dots). kAllPredecayed: pre-decayed keys times e^{lg}, no gate read
// (the common case, chunked); else each entry's form from its gates, one at a time.
template <int kChunk, bool kAllPredecayed>
__device__ __forceinline__ void kda_ring_dots(const kring_t* k_ring, const float* g_ring, int w, int col0,
                                              const float (&lg)[kGates], const float (&dec)[kEpl],
                                              const float (&qn)[kEpl], const float (&kn)[kEpl], float* rec, int L) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  ring_dots<kChunk, kChunk>(
      k_ring, w, col0, qn, kn,
      [&](int j, float (&kd)[kEpl]) { decay_ring_key(g_ring, j, col0, lg, dec, kAllPredecayed, kd); },
      [&](int j0, float dot) {
        const int c = lane % kChunk;  // lane c: kd_c·q~, lane kChunk + c: kd_c·k
        if (lane < 2 * kChunk && j0 + c < w) rec[(lane < kChunk ? rec_cq(L) : rec_ck(L)) + j0 + c] = dot;
      });
}

// KDA prep item (batch row b, value head hv): the ring coefficients (kda_ring_dots), the record, and for a non-flush
// row the key (pre-decayed if G_w = lg allows) and the gates at ring position w.
__device__ __forceinline__ void kda_prep_item(const DeltaParams& p, int b, int hv, int slot, int w, bool flush) {
  const int lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int group = p.num_v_heads / p.num_k_heads, h = hv / group;
  float qn[kEpl], kn[kEpl], q_mul, k_mul;
  const float kq = normalized_qk(p, b, h, col0, qn, kn, q_mul, k_mul);
  float* g_ring = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
  float lg[kGates], big_g[kGates], dec[kEpl];
  checkpoint_log_decay(p, b, hv, col0, g_ring, w, lg, big_g);
  const bool all_predecayed = predecayed(big_g);
#pragma unroll
  for (int e = 0; e < kEpl; ++e) dec[e] = __expf(lg[e]);
  kring_t* k_ring = static_cast<kring_t*>(p.k_ring) + slot * p.s_kr_slot + hv * p.s_kr_head;
  float* rec = p.coef + b * p.s_coef_row + (long long)hv * rec_len(p.L);
  if (lane == 0) {
    write_record_muls(rec, p.L, q_mul, k_mul);
    rec[rec_form(p.L)] = all_predecayed ? 1.f : 0.f;
  }
  if (all_predecayed) kda_ring_dots<kPrepChunk, true>(k_ring, g_ring, w, col0, lg, dec, qn, kn, rec, p.L);
  else kda_ring_dots<1, false>(k_ring, g_ring, w, col0, lg, dec, qn, kn, rec, p.L);
  write_record_tail(rec, p.L, lg, kq, rssm::sigmoidf(load_scalar(p.beta, b * p.s_beta_b + hv * p.s_beta_h,
                                                                   p.beta_is_f32)));
  if (!flush) {  // G_w = lg
    const bool pre = predecayed(lg);
    float key[kEpl];
#pragma unroll
    for (int e = 0; e < kEpl; ++e) key[e] = pre ? kn[e] * __expf(-lg[e]) : kn[e];
    rssm::store_vec<kring_t, kEpl>(k_ring + (long long)w * kK + col0, key);
    rssm::store_vec<float, kGates>(g_ring + (long long)w * kK + col0, lg);
  }
}

// GDN prep item (batch row b, key head h): the raw ring dot products k_j·q~, k_j·k once (loaded kGdnPrepChunk keys at a
// time, lane j keeping entry j's); the value heads' log-decays lg and betas a lane each (32 value heads at a time);
// per value head, its scalar decays e^{lg - G_j} times the dot products and the record; for a non-flush row k and the
// gates at ring position w. The first value heads' gate loads go out before the ring keys' (one round trip for all).
constexpr int kGatePreload = 2;  // value heads per key head whose ring gates G_j are loaded up front (64 registers)

__device__ __forceinline__ void gdn_prep_item(const DeltaParams& p, int b, int h, int slot, int w, bool flush) {
  const int lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int group = p.num_v_heads / p.num_k_heads;
  float* g_rings = p.g_ring + slot * p.s_gr_slot + (long long)h * group * p.s_gr_head;  // value head h * group
  // Lane l: value head i0 + l's log-decay and beta.
  auto head_scalars = [&](int i0, float (&lg_lane)[kGates], float& beta_lane) {
    if (i0 + lane < group) {
      const int hv = h * group + i0 + lane;
      float big_g[kGates];
      checkpoint_log_decay(p, b, hv, col0, g_rings + (i0 + lane) * p.s_gr_head, w, lg_lane, big_g);
      beta_lane = rssm::sigmoidf(load_scalar(p.beta, b * p.s_beta_b + hv * p.s_beta_h, p.beta_is_f32));
    }
  };
  float g_pre[kGatePreload];  // lane j < w: G_j of value head i < kGatePreload
#pragma unroll
  for (int i = 0; i < kGatePreload; ++i) g_pre[i] = i < group && lane < w ? g_rings[i * p.s_gr_head + lane] : 0.f;
  float lg_lane[kGates] = {}, beta_lane = 0.f;
  head_scalars(0, lg_lane, beta_lane);
  float qn[kEpl], kn[kEpl], q_mul, k_mul;
  const float kq = normalized_qk(p, b, h, col0, qn, kn, q_mul, k_mul);
  const act_t* k_ring = static_cast<const act_t*>(p.k_ring) + slot * p.s_kr_slot + h * p.s_kr_head;
  float raw_q = 0.f, raw_k = 0.f;
  ring_dots<kGdnPrepChunk, kGdnReduce>(  // raw keys: lane j keeps entry j's k_j·q~, k_j·k
      k_ring, w, col0, qn, kn, [](int, float (&)[kEpl]) {},
      [&](int first, float dot) {
        const int c = (lane - first) & (kGdnReduce - 1);
        const float dq = __shfl_sync(0xffffffffu, dot, c), dk = __shfl_sync(0xffffffffu, dot, kGdnReduce + c);
        if (lane >= first && lane < first + kGdnReduce) {
          raw_q = dq;
          raw_k = dk;
        }
      });
  for (int i0 = 0; i0 < group; i0 += rssm::kWarpSize) {
    if (i0 > 0) head_scalars(i0, lg_lane, beta_lane);
#pragma unroll 1
    for (int i = i0; i < min(group, i0 + rssm::kWarpSize); ++i) {
      float* g_ring = g_rings + i * p.s_gr_head;
      float* rec = p.coef + b * p.s_coef_row + (long long)(h * group + i) * rec_len(p.L);
      const float lg[kGates] = {__shfl_sync(0xffffffffu, lg_lane[0], i - i0)};
      if (lane < w) {
        float gj = i < kGatePreload ? 0.f : g_ring[lane];
#pragma unroll
        for (int c = 0; c < kGatePreload; ++c) gj = c == i ? g_pre[c] : gj;
        const float decay = __expf(lg[0] - gj);
        rec[rec_cq(p.L) + lane] = raw_q * decay;
        rec[rec_ck(p.L) + lane] = raw_k * decay;
      }
      if (lane == 0) write_record_muls(rec, p.L, q_mul, k_mul);
      write_record_tail(rec, p.L, lg, kq, __shfl_sync(0xffffffffu, beta_lane, i - i0));
      if (!flush && lane == 0) g_ring[w] = lg[0];
    }
  }
  if (!flush) {
    act_t* k_dst = static_cast<act_t*>(p.k_ring) + slot * p.s_kr_slot + h * p.s_kr_head + (long long)w * kK;
    rssm::store_vec<act_t, kEpl>(k_dst + col0, kn);
  }
}

// Replay step 1, one warp per item: (batch row, key head) for GDN (the value heads of a key head share q, k and the
// ring keys and differ only in scalar decays, so the dot products are computed once), (batch row, value head) for
// KDA (per-channel decays). Grid: ceil(batch * items per row / 4) CTAs of 4 warps. Writes each value head's record
// (see rec_*) into the per-row scratch and the row's step (w, or -(w + 1) for a flush: the main kernel's producer
// advances the cursor from it once prep has finished); for non-flush rows appends k and the gates at ring position
// w. Lets the main kernel launch once the previous grid has finished (rssm::prep_begin).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kEpl <= 4 ? 8 : 6) delta_replay_prep_kernel(
    const DeltaParams p) {  // 64 registers (K <= 128), 80 (K = 256: a lane's 8 channels of q, k, gates and keys)
  rssm::prep_begin(p.step - 1);
  const int lane = threadIdx.x % rssm::kWarpSize;
  const int heads = kPerChannel ? p.num_v_heads : p.num_k_heads;  // items per batch row
  const int item = blockIdx.x * rssm::kNumWarps + threadIdx.x / rssm::kWarpSize;
  if (item >= p.batch * heads) return;
  const int b = item / heads, head = item % heads;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int w = p.cursor[slot];
  const int first_id = rssm::preload_row_id(p.slot_idx, b, lane);
  if (!rssm::cursor_in_ring(w, p.L) ||
      __any_sync(0xffffffffu, rssm::earlier_row_has(p.slot_idx, b, slot, lane, rssm::kWarpSize, first_id))) {
    // a skipped row (rssm::row_slot): the main kernel reads its step word
    if (lane == 0 && head == 0) p.step[b] = rssm::kSkipStep;
    return;
  }
  const bool flush = p.force_flush || w == p.L - 1;
  if constexpr (kPerChannel) kda_prep_item(p, b, head, slot, w, flush);
  else gdn_prep_item(p, b, head, slot, w, flush);
  if (lane == 0 && head == 0) {
    p.step[b] = flush ? -(w + 1) : w;  // the main kernel advances the cursor from it
    if (SR && flush) p.flushes[slot] += 1;  // the main kernel keys this write by the count before it
  }
}

namespace {

constexpr int kTileBytes = kTile * ReadRows::kRowBytes;  // the rows non-flush steps read
// 4-byte states claim the main kernel's tail tiles (rssm::produce_tiles_claiming_tail), 2-byte states keep the
// round-robin schedule: H200, batch 256, against round-robin, claims made fp32 steps 1-2.5% faster, but the claiming
// code made bf16 steps 3-5% slower even with no tile claimed (docs/decisions.md, tail claims). Stored checkpoints
// claim, as Mamba-2's do (a flush tile's encode costs several non-flush tiles).
// trtllm_replayssm/core/ops/delta.py:claims_tail mirrors the choice (checked at compilation).
constexpr bool kTailClaims = sizeof(state_t) == 4 || kStored;
static_assert(kTileBytes % 16 == 0, "state tiles move by bulk copies of a multiple of 16 bytes");
static_assert(kTile * sizeof(act_t) % 4 == 0, "row inputs move by 4-byte async copies");
constexpr int kRowGroups = rssm::kWarpSize / kRows;  // lanes per row that split its ring entries
constexpr int kFoldChunk = kEpl <= 4 ? 16 / kEpl : 1;  // ring keys a flush decays at once (registers)
// State rows a flush folds at once (registers); one with stochastic rounding, whose inlined encodes (Philox) would
// otherwise spill, and four for KDA in dual mode (8 spill on sm_90a with 64-row tiles).
constexpr int kFoldRows = SR ? 1 : kDual && kPerChannel ? 4 : 32 / kEpl < 8 ? 32 / kEpl : 8;

// One shared-memory stage: the checkpoint tile, then the tile's slot and step, its record, v of its rows, the raw q
// and k rows of its key head and the u ring rows j < w ([L][kTile]); trtllm_replayssm/core/layouts.py mirrors the
// total (checked at compilation).
struct StageLayout {
  int info, rec, v, qk, u_ring, bytes;
};

__host__ __device__ constexpr StageLayout stage_layout(int L) {
  StageLayout l{};
  l.info = kTileBytes;
  l.rec = l.info + 16;
  l.v = l.rec + round16(rec_len(L) * 4);
  l.qk = l.v + round16(kTile * int(sizeof(act_t)));
  l.u_ring = l.qk + round16(2 * kK * int(sizeof(act_t)));
  l.bytes = (l.u_ring + round16(L * kTile * int(sizeof(act_t))) + 127) / 128 * 128;
  return l;
}

struct TileCoord {
  int b, hv, row0;
};

// Tile t: batch row, value head and first state row (row tiles fastest, then value heads, then batch rows).
__device__ __forceinline__ TileCoord tile_coord(const DeltaParams& p, int t) {
  constexpr int kRowTiles = kV / kTile;
  const int hb = t / kRowTiles;
  return {hb / p.num_v_heads, hb % p.num_v_heads, (t % kRowTiles) * kTile};
}

// Producer warp (rssm::produce_tiles or produce_tiles_claiming_tail, see kTailClaims): besides slot and step, each
// tile's record, v rows and u ring rows j < w go into its stage; a flush tile's ring keys (and GDN gates) into the fold
// buffer (or an L2 prefetch without one). The producer of a row's first tile writes the row's new cursor (the prep
// kernel, its only reader, has finished).
__device__ __forceinline__ void produce(const DeltaParams& p, rssm::TilePipe& pipe, unsigned char* stage_mem,
                                        int num_tiles) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  const StageLayout lay = stage_layout(p.L);
  auto state_src = [&](int slot, const TileCoord& c) {
    if constexpr (ReadRows::kScaleBytes == 0 && !kDual) {
      if (slot == p.pad_slot_id) return static_cast<const void*>(nullptr);
      return static_cast<const void*>(static_cast<const state_t*>(p.state) + slot * p.s_state_slot +
                                      c.hv * p.s_state_head + (long long)c.row0 * kK);
    } else {
      if (slot == p.pad_slot_id) return rssm::TileParts{};
      const ReadRows rows = nonflush_rows(p, slot, c.hv, c.row0);
      return rssm::TileParts{{rows.data, rows.block, rows.scale},
                             {kTile * ReadRows::kDataBytes, kTile * ReadRows::kBlockBytes, kTile * ReadRows::kScaleBytes}};
    }
  };
  constexpr int kRowWords = kTile * int(sizeof(act_t)) / 4;
  constexpr int kRingKeyBytes = kK * int(sizeof(kring_t));
  unsigned char* fold_buf = stage_mem + (long long)p.stages * p.stage_bytes;
  int folds = 0;
  auto copy_inputs = [&](unsigned char* stage, const TileCoord& c, int slot, int info, unsigned long long*) {
    const int w = info < 0 ? -info - 1 : info;
    if (lane == 0 && c.hv == 0 && c.row0 == 0) p.cursor[slot] = info < 0 ? 0 : w + 1;  // prep has read it
    rssm::cp_async_words(stage + lay.rec, p.coef + c.b * p.s_coef_row + (long long)c.hv * rec_len(p.L),
                         rec_len(p.L));
    rssm::cp_async_words(stage + lay.v, static_cast<const act_t*>(p.v) + c.b * p.s_v_b + c.hv * p.s_v_h + c.row0,
                         kRowWords);
    const int h = c.hv / (p.num_v_heads / p.num_k_heads);
    constexpr int kKeyWords = kK * int(sizeof(act_t)) / 4;
    rssm::cp_async_words(stage + lay.qk, static_cast<const act_t*>(p.q) + c.b * p.s_q_b + h * p.s_q_h, kKeyWords);
    rssm::cp_async_words(stage + lay.qk + kKeyWords * 4, static_cast<const act_t*>(p.k) + c.b * p.s_k_b + h * p.s_k_h,
                         kKeyWords);
    const act_t* ring = static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + c.hv * p.s_ur_head + c.row0;
    for (int q = lane; q < w * kRowWords; q += rssm::kWarpSize) {
      const int j = q / kRowWords, word = q % kRowWords;
      rssm::cp_async4(stage + lay.u_ring + (j * kRowWords + word) * 4,
                      reinterpret_cast<const unsigned*>(ring + (long long)j * kV) + word);
    }
    const kring_t* k_ring =
        static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(c.hv, h) * p.s_kr_head;
    const float* g_ring = p.g_ring + slot * p.s_gr_slot + c.hv * p.s_gr_head;
    if (info < 0 && p.fold_bytes) {  // the fold's ring keys (and GDN gates)
      rssm::fold_buffer_acquire(pipe, folds++);
      rssm::cp_async_words(fold_buf, k_ring, w * kRingKeyBytes / 4);
      if constexpr (!kPerChannel) rssm::cp_async_words(fold_buf + fold_gates_offset(p.L), g_ring, w);
      rssm::cp_async_arrive(&pipe.fold_full);
    } else if (info < 0) {  // the fold loads the ring keys (and GDN gates) itself: have them in L2 by then
      rssm::prefetch_l2(k_ring, w * kRingKeyBytes);
      if constexpr (!kPerChannel) rssm::prefetch_l2(g_ring, w * 4);
    }
  };
  auto coord = [&](int t) { return tile_coord(p, t); };
  if constexpr (kTailClaims) {  // flush rows apart (p.flush_apart): core/ops/delta.py plans them with claims only
    rssm::produce_tiles_claiming_tail(pipe, stage_mem, p.stages, p.stage_bytes, num_tiles, kTileBytes, p.slot_idx,
                                      p.step, p.pad_slot_id, p.slots, p.tail_start, p.step - 1, coord, state_src,
                                      copy_inputs, p.flush_apart != 0);
  } else {
    rssm::produce_tiles(pipe, stage_mem, p.stages, p.stage_bytes, num_tiles, kTileBytes, p.slot_idx, p.step,
                        p.pad_slot_id, p.slots, coord, state_src, copy_inputs);
  }
}

// Flush rows of one consumer warp: S = e^{lg} ⊙ S0 + Σ_{j<w} u_j kd_jᵀ + u kᵀ, stored. `load_s0(r, v)`: this lane's
// values of the warp's row r of S0 (the stage, or dual mode's master in global memory). `u_lane`: lane r holds u of
// row r. The ring keys are decayed here (decayed_key; `k_ring`, `g_ring`: the fold buffer or global memory;
// `all_predecayed`: the record's KDA ring form) in chunks of kFoldChunk entries.
template <class LoadS0>
__device__ __forceinline__ void fold_rows(const DeltaParams& p, const TileCoord& c, int slot, int w,
                                          const float (&lg)[kEpl], const float (&dec)[kEpl], const float (&kn)[kEpl],
                                          float u_lane, const act_t* u_s, LoadS0 load_s0, const kring_t* k_ring,
                                          const float* g_ring, bool all_predecayed) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int wr0 = warp * kRows;  // in the tile
  state_t* dst = static_cast<state_t*>(p.state) + slot * p.s_state_slot + c.hv * p.s_state_head +
                 (long long)(c.row0 + wr0) * kK + col0;
  const CheckpointRows ckpt = checkpoint_rows(p, slot, c.hv, c.row0 + wr0);
  const unsigned flushes = SR ? __ldcg(p.flushes + slot) - 1 : 0u;  // the prep kernel counted this write
  float lg_g[kGates];
#pragma unroll
  for (int e = 0; e < kGates; ++e) lg_g[e] = lg[e];
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += kFoldRows) {
    float acc[kFoldRows][kEpl];
#pragma unroll
    for (int r = 0; r < kFoldRows; ++r) {
      if (r0 + r >= kRows) break;
      load_s0(r0 + r, acc[r]);
      const float u = __shfl_sync(0xffffffffu, u_lane, r0 + r);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(u, kn[e], acc[r][e] * dec[e]);
    }
    for (int j0 = 0; j0 < w; j0 += kFoldChunk) {
      float kd[kFoldChunk][kEpl];
#pragma unroll
      for (int k = 0; k < kFoldChunk; ++k) {
        if (j0 + k >= w) break;
        decayed_key(k_ring, g_ring, j0 + k, col0, lg_g, dec, all_predecayed, kd[k]);
      }
#pragma unroll
      for (int k = 0; k < kFoldChunk; ++k) {
        if (j0 + k >= w) break;
#pragma unroll
        for (int r = 0; r < kFoldRows; ++r) {
          if (r0 + r >= kRows) break;
          const float uj = rssm::to_float(u_s[(j0 + k) * kTile + wr0 + r0 + r]);
#pragma unroll
          for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(uj, kd[k][e], acc[r][e]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kFoldRows; ++r) {
      if (r0 + r >= kRows) break;
      if constexpr (kStored) ckpt.store(r0 + r, acc[r], flushes, p.seed);
      else rssm::store_vec<state_t, kEpl>(dst + (r0 + r) * kK, acc[r]);
    }
  }
}

// This lane's parts of S0[row]·xq and S0[row]·xk for the warp's kRows stage rows (`load_row(r, v)`: this lane's
// values of row r).
template <class LoadRow>
__device__ __forceinline__ void row_dots(LoadRow load_row, const float (&xq)[kEpl], const float (&xk)[kEpl],
                                         float (&pq)[kRows], float (&pk)[kRows]) {
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    float sv[kEpl];
    load_row(rr, sv);
    pq[rr] = 0.f;
    pk[rr] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      pq[rr] = fmaf(sv[e], xq[e], pq[rr]);
      pk[rr] = fmaf(sv[e], xk[e], pk[rr]);
    }
  }
}

// Quantized checkpoint rows' dots with xq = e^{lg} ⊙ q~ and xk = e^{lg} ⊙ k~ (rssm::QuantRowDots): lane r < kRows
// gets aq_r and ak_r; the warp builds each column of xq and xk once from the stage's q~, k~ and log-gates.
template <class R>
__device__ __forceinline__ void quant_checkpoint_dots(const DeltaParams& p, const R& rows, const act_t* qk_s,
                                                      const float* rec, float q_mul, float k_mul, float& aq,
                                                      float& ak) {
  using Dots = rssm::QuantRowDots<kReadFmt, kK, 2>;
  const int lane = threadIdx.x % rssm::kWarpSize;
  const float* lg = rec + rec_lg(p.L);
  const float head_dec = kPerChannel ? 0.f : __expf(lg[0]);
  float d[2];
  Dots dots;
  dots.init([&](int v, int col) {
    const float dec = kPerChannel ? __expf(lg[col]) : head_dec;
    return rssm::to_float(qk_s[v * kK + col]) * ((v == 0 ? q_mul : k_mul) * dec);
  });
  dots.template dots<kRows>(rows, lane, d);
  aq = d[0];
  ak = d[1];
}

// One consumer warp's rows (warp * kRows ...) of the tile in `stage` (complete). Lane r finishes row r:
//   a_q = S0·(e^{lg} ⊙ q~) + Σ_{j<w} cq_j u_j,  a_k likewise with k and ck,  u = beta (v - a_k),  o = a_q + u (k·q~)
// Non-flush: appends u at ring position w (the checkpoint is never written). Flush: folds and stores the checkpoint.
// Releases the stage once its shared memory is read.
__device__ __forceinline__ void replay_tile(const DeltaParams& p, const TileCoord& c, const unsigned char* stage,
                                            rssm::TilePipe& pipe, int s, const unsigned char* fold_buf, int& folds) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const StageLayout lay = stage_layout(p.L);
  const int* info_words = reinterpret_cast<const int*>(stage + lay.info);
  const int slot = info_words[0], info = info_words[1];  // info: stale for a pad row (not read then)
  if (rssm::skipped_stage_row(slot, info, p.pad_slot_id, p.slots)) {
    rssm::release_stage(pipe, s);
    if (lane < kRows)
      static_cast<act_t*>(p.out)[c.b * p.s_out_b + c.hv * p.s_out_h + c.row0 + warp * kRows + lane] =
          rssm::from_float<act_t>(0.f);
    return;
  }
  if ((kStored || p.flush_apart) && info < 0) {  // the flush-rows kernel's row (a stored checkpoint's always)
    rssm::release_stage(pipe, s);
    return;
  }
  const bool flush = !kStored && info < 0;
  const int w = flush ? -info - 1 : info;
  const float* rec = reinterpret_cast<const float*>(stage + lay.rec);
  const act_t* v_s = reinterpret_cast<const act_t*>(stage + lay.v);
  const act_t* u_s = reinterpret_cast<const act_t*>(stage + lay.u_ring);
  const state_t* rows = reinterpret_cast<const state_t*>(stage) + warp * kRows * kK + col0;  // plain rows
  const ReadRows stage_rows = ReadRows::tile(const_cast<unsigned char*>(stage), kTile).offset(warp * kRows);
  auto load_stage_row = [&](int rr, float (&sv)[kEpl]) {
    if constexpr (kStored) stage_rows.decode(rr, lane, sv);
    else rssm::load_vec<state_t, kEpl>(rows + rr * kK, sv);
  };
  const MasterRows master = master_rows(p, slot, c.hv, c.row0 + warp * kRows);  // dual mode: what a flush reads
  // S0 of the checkpoint terms: a flush row of dual mode reads the master (its u and state come from the master, as
  // the write rule says), every other row the stage.
  auto load_s0 = [&](int rr, float (&sv)[kEpl]) {
    if constexpr (kDual) {
      if (info < 0) {
        master.decode(rr, lane, sv);
        return;
      }
    }
    load_stage_row(rr, sv);
  };
  const act_t* qk_s = reinterpret_cast<const act_t*>(stage + lay.qk);
  float qn[kEpl], kn[kEpl], lg[kEpl], dec[kEpl], xq[kEpl], xk[kEpl];
  rssm::load_vec<act_t, kEpl>(qk_s + col0, qn);
  rssm::load_vec<act_t, kEpl>(qk_s + kK + col0, kn);
  if constexpr (kPerChannel) rssm::load_vec<float, kEpl>(rec + rec_lg(p.L) + col0, lg);
  const float q_mul = rec[rec_sc(p.L)], k_mul = rec[rec_sc(p.L) + 1];
  const float kq = rec[rec_sc(p.L) + 2], beta = rec[rec_sc(p.L) + 3];
#pragma unroll
  for (int e = 0; e < kEpl; ++e) {
    if constexpr (!kPerChannel) lg[e] = rec[rec_lg(p.L)];
    qn[e] *= q_mul;
    kn[e] *= k_mul;
    dec[e] = __expf(lg[e]);
    xq[e] = dec[e] * qn[e];
    xk[e] = dec[e] * kn[e];
  }
  // Ring terms Σ_{j<w} (cq_j, ck_j) u_j[row]: lane l sums entries j ≡ l / kRows (mod kRowGroups) of row l % kRows.
  const int r = lane % kRows, grp = lane / kRows, wr = warp * kRows + r;
  float pq = 0.f, pk = 0.f;
  if (grp < kRowGroups)
    for (int j = grp; j < w; j += kRowGroups) {
      const float uj = rssm::to_float(u_s[j * kTile + wr]);
      pq = fmaf(rec[rec_cq(p.L) + j], uj, pq);
      pk = fmaf(rec[rec_ck(p.L) + j], uj, pk);
    }
  float rq = pq, rk = pk;
#pragma unroll
  for (int g = 1; g < kRowGroups; ++g) {
    rq += __shfl_down_sync(0xffffffffu, pq, g * kRows);
    rk += __shfl_down_sync(0xffffffffu, pk, g * kRows);
  }
  // Checkpoint terms S0[row]·xq, S0[row]·xk: this lane's parts for every row, then one transposed reduction.
  float aq_lane = 0.f, ak_lane = 0.f;
  const bool quant_dots = kQuantRowDots && !(kDual && flush);  // a dual-mode flush row reads the master
  if constexpr (kQuantRowDots) {
    if (quant_dots) quant_checkpoint_dots(p, stage_rows, qk_s, rec, q_mul, k_mul, aq_lane, ak_lane);
  }
  if (!quant_dots) {
    if constexpr (2 * kRows <= rssm::kWarpSize) {  // parts [aq rows | ak rows]: lane r gets aq of row r, kRows + r ak
      float pq[kRows], pk[kRows], parts[2 * kRows];
      row_dots(load_s0, xq, xk, pq, pk);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        parts[rr] = pq[rr];
        parts[kRows + rr] = pk[rr];
      }
      aq_lane = rssm::warp_sum_scatter<2 * kRows>(parts);
      ak_lane = __shfl_sync(0xffffffffu, aq_lane, lane + kRows);
    } else {
      float pq[kRows], pk[kRows];
      row_dots(load_s0, xq, xk, pq, pk);
      aq_lane = rssm::warp_sum_scatter<kRows>(pq);
      ak_lane = rssm::warp_sum_scatter<kRows>(pk);
    }
  }
  const float u = beta * (rssm::to_float(v_s[wr]) - ak_lane - rk);
  const float o = aq_lane + rq + u * kq;
  if (flush) {
    const int h = c.hv / (p.num_v_heads / p.num_k_heads);
    const kring_t* k_src =
        static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(c.hv, h) * p.s_kr_head;
    const float* g_src = p.g_ring + slot * p.s_gr_slot + c.hv * p.s_gr_head;
    if (p.fold_bytes) {
      rssm::fold_buffer_wait(pipe, folds);
      k_src = reinterpret_cast<const kring_t*>(fold_buf);
      if constexpr (!kPerChannel) g_src = reinterpret_cast<const float*>(fold_buf + fold_gates_offset(p.L));
    }
    fold_rows(p, c, slot, w, lg, dec, kn, u, u_s, load_s0, k_src, g_src, kPerChannel && rec[rec_form(p.L)] != 0.f);
    if (p.fold_bytes) {
      rssm::fold_buffer_release(pipe);
      ++folds;
    }
  }
  rssm::release_stage(pipe, s);
  if (lane < kRows) {
    const int row = c.row0 + wr;
    static_cast<act_t*>(p.out)[c.b * p.s_out_b + c.hv * p.s_out_h + row] = rssm::from_float<act_t>(o);
    if (!flush) {
      act_t* u_ring = static_cast<act_t*>(p.u_ring) + slot * p.s_ur_slot + c.hv * p.s_ur_head + (long long)w * kV;
      u_ring[row] = rssm::from_float<act_t>(u);
    }
  }
}

}  // namespace

// Replay step 2, persistent and warp-specialised like the Mamba-2 main kernel (grid: a few CTAs per SM; 4 consumer
// warps + 1 producer warp; `stages` stages of `stage_bytes` in dynamic shared memory). Requires sm_90+.
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, kReplayCtasPerSm)
    delta_replay_main_kernel(const DeltaParams p) {
#if __CUDA_ARCH__ >= 900
  if (kStored && !p.flush_apart) __trap();  // a stored checkpoint's flush rows go to the flush-rows kernel
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  const int num_tiles = p.batch * p.num_v_heads * (kV / kTile);
  rssm::persistent_main<kTailClaims>(pipe, stage_mem, p.stages, p.stage_bytes, stage_layout(p.L).bytes, num_tiles,
                                     p.tail_start, kTileBytes, [&] { produce(p, pipe, stage_mem, num_tiles); },
                                     [&](int t, unsigned char* stage, int s, const unsigned char* fold_buf,
                                         int& folds) { replay_tile(p, tile_coord(p, t), stage, pipe, s, fold_buf, folds); });
#endif
}

// Replay step 3 where the plan keeps flush rows apart (p.flush_apart: the main kernel skips them): each row tile
// (batch row, value head, VTILE rows) whose row flushes folds the row's ring (staged in dynamic shared memory,
// fused_buffer_bytes(L)) and token into its checkpoint rows, stores them and writes its outputs (a flush step at the
// prep kernel's cursor, StepKind::kApart); the row's cursor goes back to 0. A programmatic dependent of the main
// kernel; it may come from another row tile's module than the main kernel (LaunchPlan.flush_rows_per_cta): what it
// reads from the prep and main kernels (step words, cursors, rings) does not depend on the tile. One CTA per SM at
// least in its launch bounds (the state kernels' 8 on sm_90 spill here, and without a minimum ptxas gives it too few
// registers on sm_100 and later).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) delta_replay_flush_kernel(const DeltaParams p) {
  extern __shared__ __align__(16) unsigned char ring_buf[];  // fused_buffer_bytes(p.L): the item's staged ring
  constexpr int kRowTiles = kV / kTile;
  rssm::for_each_flush_item(p.step, p.slot_idx, p.pad_slot_id, p.slots, p.batch, p.num_v_heads * kRowTiles,
                            [&](int item, int b, int slot, int w) {
                              const int t = item - b * p.num_v_heads * kRowTiles;
                              if (t == 0 && threadIdx.x == 0) p.cursor[slot] = 0;  // its only reader has finished
                              delta_step<StepKind::kApart>(p, ring_buf, {b, t / kRowTiles, (t % kRowTiles) * kTile},
                                                           w);
                            });
}

#if MASTER_FMT == 0 && READ_FMT == 0 && !SR  // speculative decoding: plain checkpoints
// ============================================================================================== speculative decoding
// A verify window of T = p.window tokens per batch row (1 <= T <= kMaxWindow): token inputs and outputs are the rows
// bt = b T + t of [batch T, ...] tensors (q, k, gate, beta, v, out). Grid (V / VTILE, HV, batch) and 128 threads, like
// the state kernels. Rows skipped as everywhere (rssm::row_slot); the verify also skips a row whose window does not
// fit its ring (w + T > L).
namespace {

constexpr int kMaxWindow = rssm::kMaxWindow;
constexpr int kGateCols = kPerChannel ? kK : 1;  // log-gates per token and value head

// The verify kernel's shared memory. Per window token t: GDN xq = q~_t, xk = k_t and the scalar lg_t; KDA
// xq = e^{lg_t} ⊙ q~_t, xk = e^{lg_t} ⊙ k_t and lg_t per channel (lg_t = G_{w+t}: the checkpoint's log-decay to after
// token t). cq[t][j] = kd_j·q~_t and ck[t][j] = kd_j·k_t with kd_j entry j (ring j < w, window token j - w) decayed to
// after token t (j < w + t). Per-token scalars: k_t·q~_t, beta_t and the q and k multipliers (q~ = q_mul q_raw).
struct VerifyShared {
  float xq[kMaxWindow][kK], xk[kMaxWindow][kK];
  float lg[kMaxWindow][kGateCols];
  float cq[kMaxWindow][rssm::kMaxL], ck[kMaxWindow][rssm::kMaxL];
  float kq[kMaxWindow], beta[kMaxWindow], q_mul[kMaxWindow], k_mul[kMaxWindow];
};

// Window token s's normalised key k_s (this lane's channels), from the raw input row and its multiplier.
__device__ __forceinline__ void window_key(const DeltaParams& p, int bt, int h, int col0, float k_mul,
                                           float (&kn)[kEpl]) {
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.k) + bt * p.s_k_b + h * p.s_k_h + col0, kn);
#pragma unroll
  for (int e = 0; e < kEpl; ++e) kn[e] *= k_mul;
}

// KDA: whether window token s's ring key is pre-decayed (warp-collective) and that key, rounded as the ring holds it.
__device__ __forceinline__ bool kda_window_ring_key(const DeltaParams& p, const VerifyShared& sm, int b, int s, int h,
                                                    int col0, float (&key)[kEpl]) {
  float lg[kEpl];
  rssm::load_vec<float, kEpl>(&sm.lg[s][col0], lg);
  window_key(p, b * p.window + s, h, col0, sm.k_mul[s], key);
  const bool pre = predecayed(lg);
#pragma unroll
  for (int e = 0; e < kEpl; ++e) key[e] = rssm::round_through<kring_t>(pre ? key[e] * __expf(-lg[e]) : key[e]);
  return pre;
}

// Coefficients of entry j (< w + T - 1) for the tokens t > j - w into sm.cq / sm.ck (one warp; `key`: the entry's key as
// the ring holds it, this lane's channels). GDN: raw key dots times e^{lg_t - G_j} (`gj` = G_j). KDA pre-decayed: key
// dots with e^{lg_t} ⊙ q~_t; KDA raw (a cumulative gate below -kPredecayFloor, rare): e^{lg_t - G_j} per channel
// (`gj_row`: G_j's row, this lane's channels) with q~_t and k_t rebuilt from the inputs.
template <int kT>
__device__ __forceinline__ void entry_coefficients(const DeltaParams& p, VerifyShared& sm, int b, int h, int w, int j,
                                                   const float (&key)[kEpl], bool pre, float gj,
                                                   const float* gj_row) {
  const int lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl, T = p.window;
  const int t0 = j < w ? 0 : j - w + 1;
  float parts[2 * kT] = {};
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t >= T) break;
    if (t < t0) continue;
    float xq[kEpl], xk[kEpl], kd[kEpl];
    if (!kPerChannel || pre) {
      rssm::load_vec<float, kEpl>(&sm.xq[t][col0], xq);
      rssm::load_vec<float, kEpl>(&sm.xk[t][col0], xk);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) kd[e] = key[e];
    } else {
      const int bt = b * T + t;
      float lg[kEpl];
      rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.q) + bt * p.s_q_b + h * p.s_q_h + col0, xq);
      window_key(p, bt, h, col0, sm.k_mul[t], xk);
      rssm::load_vec<float, kEpl>(&sm.lg[t][kPerChannel ? col0 : 0], lg);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) {
        xq[e] *= sm.q_mul[t];
        kd[e] = key[e] * __expf(lg[e] - gj_row[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      parts[t] = fmaf(kd[e], xq[e], parts[t]);
      parts[kT + t] = fmaf(kd[e], xk[e], parts[kT + t]);
    }
  }
  float dot = rssm::warp_sum_scatter<2 * kT>(parts);  // lane t: entry·q side of token t, kT + t: k side
  const int t = lane % kT;
  if (lane < 2 * kT && t >= t0 && t < T) {
    if constexpr (!kPerChannel) dot *= __expf(sm.lg[t][0] - gj);
    (lane < kT ? sm.cq : sm.ck)[t][j] = dot;
  }
}

// The verify's per-CTA prologue for windows of T <= kT tokens: every token's scalars, cumulative gates and query/key
// vectors, then the coefficients of every history record (entry j < w = hist.count at ring position hist.position(j))
// and window entry, all in `sm` (complete at return).
template <int kT = kMaxWindow>
__device__ __forceinline__ void verify_prologue(const DeltaParams& p, VerifyShared& sm, int b, int slot, int hv, int h,
                                                rssm::SpecCursor hist) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int T = p.window, w = hist.count;
  for (int t = warp; t < T; t += rssm::kNumWarps) {
    const int bt = b * T + t;
    float qn[kEpl], kn[kEpl], q_mul, k_mul, g[kGates];
    const float kq = normalized_qk(p, bt, h, col0, qn, kn, q_mul, k_mul);
    current_log_gate(p, bt, hv, col0, g);
    rssm::store_vec<float, kEpl>(&sm.xq[t][col0], qn);
    rssm::store_vec<float, kEpl>(&sm.xk[t][col0], kn);
    if constexpr (kPerChannel) rssm::store_vec<float, kGates>(&sm.lg[t][col0], g);
    if (lane == 0) {
      if constexpr (!kPerChannel) sm.lg[t][0] = g[0];
      sm.kq[t] = kq;
      sm.beta[t] = rssm::sigmoidf(load_scalar(p.beta, bt * p.s_beta_b + hv * p.s_beta_h, p.beta_is_f32));
      sm.q_mul[t] = q_mul;
      sm.k_mul[t] = k_mul;
    }
  }
  __syncthreads();
  // lg_t = G_{w-1} + g_0 + ... + g_t per channel (the reference's order of additions); KDA: xq, xk times e^{lg_t}.
  const float* g_ring = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
  for (int c = threadIdx.x; c < kGateCols; c += rssm::kThreads) {
    float lg = w > 0 ? g_ring[(long long)hist.position(w - 1, p.L) * kGateCols + c] : 0.f;
    for (int t = 0; t < T; ++t) {
      lg += sm.lg[t][c];
      sm.lg[t][c] = lg;
      if constexpr (kPerChannel) {
        const float d = __expf(lg);
        sm.xq[t][c] *= d;
        sm.xk[t][c] *= d;
      }
    }
  }
  __syncthreads();
  // Entries j < w + T - 1 (the last token's key is no entry of the window), a warp each in turn.
  const kring_t* k_ring =
      static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head;
  bool all_predecayed = true;  // KDA: every committed entry pre-decayed (its last one is)
  if constexpr (kPerChannel) {
    if (w > 0) {
      float big_g[kGates];
      gate_at(g_ring, hist.position(w - 1, p.L), col0, big_g);
      all_predecayed = predecayed(big_g);
    }
  }
  for (int j = warp; j < w + T - 1; j += rssm::kNumWarps) {
    float key[kEpl], gj_row[kEpl] = {}, gj = 0.f;
    bool pre = true;
    if (j < w) {
      const long long pos = hist.position(j, p.L);
      rssm::load_vec<kring_t, kEpl>(k_ring + pos * kK + col0, key);
      if constexpr (kPerChannel) {
        if (!all_predecayed) {
          rssm::load_vec<float, kEpl>(g_ring + pos * kK + col0, gj_row);
          pre = predecayed(gj_row);
        }
      } else {
        gj = g_ring[pos];
      }
    } else {
      const int s = j - w;
      if constexpr (kPerChannel) {
        pre = kda_window_ring_key(p, sm, b, s, h, col0, key);
        rssm::load_vec<float, kEpl>(&sm.lg[s][col0], gj_row);
      } else {
#pragma unroll
        for (int e = 0; e < kEpl; ++e) key[e] = rssm::round_through<act_t>(sm.xk[s][col0 + e]);
        gj = sm.lg[s][0];
      }
    }
    entry_coefficients<kT>(p, sm, b, h, w, j, key, pre, gj, gj_row);
  }
  __syncthreads();
}

// The window's gates (G_{w+t} = lg_t) and keys at the ring positions of history records w + t (hist.count = w), from
// the verify prologue's `sm`: KDA keys per value head, GDN keys by the first value head of each key head.
__device__ __forceinline__ void write_window_gates_and_keys(const DeltaParams& p, const VerifyShared& sm, int b,
                                                            int slot, int hv, int h, rssm::SpecCursor hist) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int T = p.window, w = hist.count, group = p.num_v_heads / p.num_k_heads;
  float* g_dst = p.g_ring + slot * p.s_gr_slot + hv * p.s_gr_head;
  kring_t* k_dst = static_cast<kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(hv, h) * p.s_kr_head;
  for (int t = warp; t < T; t += rssm::kNumWarps) {
    const long long pos = hist.position(w + t, p.L);
    if constexpr (kPerChannel) {
      float key[kEpl], lg[kEpl];
      kda_window_ring_key(p, sm, b, t, h, col0, key);
      rssm::load_vec<float, kEpl>(&sm.lg[t][col0], lg);
      rssm::store_vec<kring_t, kEpl>(k_dst + pos * kK + col0, key);
      rssm::store_vec<float, kEpl>(g_dst + pos * kK + col0, lg);
    } else {
      if (lane == 0) g_dst[pos] = sm.lg[t][0];
      if (hv % group == 0) {
        float key[kEpl];
        rssm::load_vec<float, kEpl>(&sm.xk[t][col0], key);
        rssm::store_vec<kring_t, kEpl>(k_dst + pos * kK + col0, key);  // kring_t = act_t for GDN
      }
    }
  }
}

// Ring terms of a window's tokens split over the kRowGroups lanes of each row (lane l: row l % kRows): lanes r < kRows
// get row r's sums.
__device__ __forceinline__ void add_row_groups(float (&rq)[kMaxWindow], float (&rk)[kMaxWindow], int T) {
#pragma unroll
  for (int t = 0; t < kMaxWindow; ++t) {
    if (t >= T) break;
    const float own_q = rq[t], own_k = rk[t];
#pragma unroll
    for (int g = 1; g < kRowGroups; ++g) {
      rq[t] += __shfl_down_sync(0xffffffffu, own_q, g * kRows);
      rk[t] += __shfl_down_sync(0xffffffffu, own_k, g * kRows);
    }
  }
}

// A row's committed history as its verify decodes it: empty after a fold (the cursor's records go into the
// checkpoint first), else the cursor's.
__device__ __forceinline__ rssm::SpecCursor verify_history(rssm::SpecCursor cur, bool fold, int L) {
  return {fold ? cur.position(cur.count, L) : cur.origin, fold ? 0 : cur.count};
}

// Whether a verify of T tokens folds the history first (count + 2T > L).
__device__ __forceinline__ bool verify_folds(rssm::SpecCursor cur, int T, int L) {
  return cur.count > 0 && cur.folds_before(T, L);  // an empty history folds to itself
}

// Where a verify's per-token data lies (the grid kernel's VerifyShared, or a stage's VerifyRec): token t's xq and xk
// at xq + t * kK and xk + t * kK, its log-decay (GDN) at lg[t * lg_stride], entry j's coefficients at
// cq[t * c_stride + j] and ck[...], its beta and k·q~ at beta[t * s_stride] and kq[t * s_stride].
struct WindowCoefs {
  const float *xq, *xk, *lg, *cq, *ck, *beta, *kq;
  int lg_stride, c_stride, s_stride;
};

// This warp's rows (registers `acc`) dotted with a token's xq and xk: lane r gets row r's S0·xq in `aq`, S0·xk in `ak`.
__device__ __forceinline__ void state_dots(const float (&acc)[kRows][kEpl], const float (&xq)[kEpl],
                                           const float (&xk)[kEpl], float& aq, float& ak) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  float pq[kRows], pk[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    pq[r] = 0.f;
    pk[r] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      pq[r] = fmaf(acc[r][e], xq[e], pq[r]);
      pk[r] = fmaf(acc[r][e], xk[e], pk[r]);
    }
  }
  if constexpr (2 * kRows <= rssm::kWarpSize) {  // [aq rows | ak rows]: lane r gets aq of row r, r + kRows ak
    float parts[2 * kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      parts[r] = pq[r];
      parts[kRows + r] = pk[r];
    }
    aq = rssm::warp_sum_scatter<2 * kRows>(parts);
    ak = __shfl_sync(0xffffffffu, aq, (lane + kRows) % rssm::kWarpSize);
  } else {
    aq = rssm::warp_sum_scatter<kRows>(pq);
    ak = rssm::warp_sum_scatter<kRows>(pk);
  }
}

// This warp's folded checkpoint rows `acc` stored at `rows`, and `acc` rounded as stored: the window decodes from
// the checkpoint as stored.
__device__ __forceinline__ void store_rounded_rows(state_t* rows, int col0, float (&acc)[kRows][kEpl]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rssm::store_vec<state_t, kEpl>(rows + r * kK + col0, acc[r]);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] = rssm::round_through<state_t>(acc[r][e]);
  }
}

// A folding verify's history folded into this warp's checkpoint rows `acc` (fold_ring_into_rows; rows row0 ... at
// `rows`) and stored (store_rounded_rows).
__device__ __forceinline__ void fold_history_rows(const DeltaParams& p, int slot, int hv, int h, int row0,
                                                  rssm::SpecCursor hist, int col0, state_t* rows,
                                                  float (&acc)[kRows][kEpl]) {
  fold_ring_into_rows(p, slot, hv, h, row0, hist, col0, acc);
  store_rounded_rows(rows, col0, acc);
}

// GDN: token t's checkpoint dots times the checkpoint's decay to after the token, e^{lg_t} (KDA's xq and xk carry
// theirs per channel).
__device__ __forceinline__ void decay_checkpoint_term(const WindowCoefs& c, int t, float& sq, float& sk) {
  if constexpr (!kPerChannel) {
    const float d = __expf(c.lg[t * c.lg_stride]);
    sq *= d;
    sk *= d;
  }
}

// The window's checkpoint terms of this warp's rows held in registers (`acc`): lane r < kRows gets row r's
// sq[t] = S0·(e^{lg_t} ⊙ q~_t) and sk[t] likewise with k_t, for t < T.
__device__ __forceinline__ void checkpoint_terms(const float (&acc)[kRows][kEpl], const WindowCoefs& c, int T,
                                                 float (&sq)[kMaxWindow], float (&sk)[kMaxWindow]) {
  const int col0 = threadIdx.x % rssm::kWarpSize * kEpl;
#pragma unroll
  for (int t = 0; t < kMaxWindow; ++t) {
    if (t >= T) break;
    float xq[kEpl], xk[kEpl];
    rssm::load_vec<float, kEpl>(c.xq + t * kK + col0, xq);
    rssm::load_vec<float, kEpl>(c.xk + t * kK + col0, xk);
    state_dots(acc, xq, xk, sq[t], sk[t]);
    decay_checkpoint_term(c, t, sq[t], sk[t]);
  }
}

// checkpoint_terms from the warp's rows in shared memory (`rows`, as stored), with a row's columns over kLanes lanes
// (kCols = 16 each, in 4-column chunks: rssm::group_chunk_col) and kGroups rows at once: a token's dots of a lane's kChunk
// rows reduce over its lanes by one transposed reduction (rssm::warp_sum_scatter<2 kChunk, kLanes>), about a quarter
// of the shuffles and selects of a 32-lane row. Up to 128 key channels (kStageDots).
struct StageDots {
  static constexpr int kCols = 16, kLanes = kK / kCols, kGroups = rssm::kWarpSize / kLanes;
  static constexpr int kLaneRows = (kRows + kGroups - 1) / kGroups;  // rows g, g + kGroups, ... of lane group g
  static constexpr int kChunk = kLaneRows < kLanes / 2 ? kLaneRows : kLanes / 2;  // rows per reduction
  static constexpr int kChunks = (kLaneRows + kChunk - 1) / kChunk;
  __device__ static int col(int c, int i) { return rssm::group_chunk_col<kLanes>(c, i); }
};
constexpr bool kStageDots = kK <= 128 && kK % 64 == 0;
static_assert(!kStageDots || (StageDots::kChunk & (StageDots::kChunk - 1)) == 0, "rows per reduction: a power of two");

__device__ __forceinline__ void stage_checkpoint_terms(const state_t* rows, const WindowCoefs& c, int T,
                                                       float (&sq)[kMaxWindow], float (&sk)[kMaxWindow]) {
  using D = StageDots;
  const int lane = threadIdx.x % rssm::kWarpSize, g = lane / D::kLanes, cl = lane % D::kLanes;
#pragma unroll
  for (int t = 0; t < kMaxWindow; ++t) sq[t] = sk[t] = 0.f;
  // Lane r < kRows takes its row's sums from the lane that holds them: row r is row rr of chunk k of group r % kGroups.
  const int my_rr = lane / D::kGroups % D::kChunk, my_chunk = lane / D::kGroups / D::kChunk;
  const int src_q = lane % D::kGroups * D::kLanes + my_rr, src_k = src_q + D::kChunk;
#pragma unroll
  for (int k = 0; k < D::kChunks; ++k) {
    float v[D::kChunk][D::kCols];
#pragma unroll
    for (int rr = 0; rr < D::kChunk; ++rr) {
      const int r = g + D::kGroups * (k * D::kChunk + rr);
#pragma unroll
      for (int i = 0; i < D::kCols / 4; ++i) {
        float v4[4] = {};
        if (r < kRows) rssm::load_vec<state_t, 4>(rows + r * kK + D::col(cl, i), v4);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[rr][4 * i + e] = v4[e];
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxWindow; ++t) {
      if (t >= T) break;
      float parts[2 * D::kChunk];
#pragma unroll
      for (int q = 0; q < 2 * D::kChunk; ++q) parts[q] = 0.f;
#pragma unroll
      for (int i = 0; i < D::kCols / 4; ++i) {
        float xq[4], xk[4];
        rssm::load_vec<float, 4>(c.xq + t * kK + D::col(cl, i), xq);
        rssm::load_vec<float, 4>(c.xk + t * kK + D::col(cl, i), xk);
#pragma unroll
        for (int rr = 0; rr < D::kChunk; ++rr)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            parts[rr] = fmaf(v[rr][4 * i + e], xq[e], parts[rr]);
            parts[D::kChunk + rr] = fmaf(v[rr][4 * i + e], xk[e], parts[D::kChunk + rr]);
          }
      }
      // Lane c of a group: the q sum (c < kChunk) or k sum of its chunk row c % kChunk.
      const float total = rssm::warp_sum_scatter<2 * D::kChunk, D::kLanes>(parts);
      const float q = __shfl_sync(0xffffffffu, total, src_q), kk = __shfl_sync(0xffffffffu, total, src_k);
      if (my_chunk == k) {
        sq[t] = q;
        sk[t] = kk;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxWindow; ++t) {
    if (t >= T) break;
    decay_checkpoint_term(c, t, sq[t], sk[t]);
  }
}

// One warp's rows of a verify (lane r < kRows: row r) from the window's checkpoint terms `sq`, `sk` (checkpoint_terms)
// and the row's history of w records, every window token in exact order,
//   a_k[t] = S0·(e^{lg_t} ⊙ k_t) + Σ_{j<w+t} ck[t][j] u_j,  u_t = beta_t (v_t - a_k[t]),
//   o_t = S0·(e^{lg_t} ⊙ q~_t) + Σ_{j<w+t} cq[t][j] u_j + u_t (k_t·q~_t),
// the window's u_j rounded as the ring holds them. `u_hist(j)`: this lane's row of history record j (lane l: row
// l % kRows); `v`: this lane's row of token t's values at v[t * v_stride]; writes out[t * out_stride] and the u
// records at u_dst (this lane's row, ring row stride kV) at the positions of history records w + t.
template <class UHist>
__device__ __forceinline__ void decode_window(const float (&sq)[kMaxWindow], const float (&sk)[kMaxWindow],
                                              const WindowCoefs& c, int T, int L, rssm::SpecCursor hist,
                                              UHist u_hist, const act_t* v, long long v_stride, act_t* out,
                                              long long out_stride, act_t* u_dst) {
  const int lane = threadIdx.x % rssm::kWarpSize, w = hist.count;
  // Committed ring terms Σ_{j<w} (cq, ck)[t][j] u_j[row]: lane l sums entries j ≡ l / kRows (mod kRowGroups) of row
  // l % kRows, then the groups are added into lanes r < kRows.
  float rq[kMaxWindow] = {}, rk[kMaxWindow] = {};
  if (w > 0) {
    const int grp = lane / kRows;
    if (grp < kRowGroups)
      for (int j = grp; j < w; j += kRowGroups) {
        const float uj = u_hist(j);
#pragma unroll
        for (int t = 0; t < kMaxWindow; ++t) {
          if (t >= T) break;
          rq[t] = fmaf(c.cq[t * c.c_stride + j], uj, rq[t]);
          rk[t] = fmaf(c.ck[t * c.c_stride + j], uj, rk[t]);
        }
      }
    add_row_groups(rq, rk, T);
  }
  // The window in exact order.
  float uw[kMaxWindow];
#pragma unroll
  for (int t = 0; t < kMaxWindow; ++t) {
    if (t >= T) break;
    float aq = sq[t] + rq[t], ak = sk[t] + rk[t];
#pragma unroll
    for (int s = 0; s < t; ++s) {
      aq = fmaf(c.cq[t * c.c_stride + w + s], uw[s], aq);
      ak = fmaf(c.ck[t * c.c_stride + w + s], uw[s], ak);
    }
    const float v_in = lane < kRows ? rssm::to_float(v[t * v_stride]) : 0.f;
    const float u = c.beta[t * c.s_stride] * (v_in - ak);
    uw[t] = rssm::round_through<act_t>(u);
    if (lane < kRows) {
      out[t * out_stride] = rssm::from_float<act_t>(fmaf(u, c.kq[t * c.s_stride], aq));
      u_dst[(long long)hist.position(w + t, L) * kV] = rssm::from_float<act_t>(u);
    }
  }
}

}  // namespace

// Speculative verify (docs/algorithm.md, beyond standard decode): each row's window decoded in exact order from the
// checkpoint (read once, into registers) and the row's committed history (rssm::SpecCursor: w = count records from
// ring position origin), token t seeing the window's earlier tokens:
//   a_k[t] = S0·(e^{lg_t} ⊙ k_t) + Σ_{j<w+t} ck[t][j] u_j,  u_t = beta_t (v_t - a_k[t]),
//   o_t = S0·(e^{lg_t} ⊙ q~_t) + Σ_{j<w+t} cq[t][j] u_j + u_t (k_t·q~_t),
// with the window's u_j rounded as the ring holds them. When the history and two windows would overrun the ring
// (count + 2T > L), each CTA first folds the history into its checkpoint rows (fold_history_rows) and the window
// decodes from an empty history (its gates restart at the new checkpoint); the row's cursor moves past the history
// (origin + count, count 0) once every CTA of the row has read it (rssm::arrive_and_advance). Writes out [b T, HV, V]
// and the window's ring records at the positions after the history: u by every CTA for its rows, the gates (and KDA
// keys) by each value head's first CTA, GDN keys by the first CTA of each key head's first value head. Reads no record
// the launch writes (window values come from the inputs). Skips (zero outputs, no writes) pad rows, rows repeating an
// earlier row's slot and rows whose cursor word does not hold the window.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) delta_verify_kernel(const DeltaParams p) {
  __shared__ __align__(16) VerifyShared sm;
  const int b = blockIdx.z, T = p.window;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  const int hv = blockIdx.y, group = p.num_v_heads / p.num_k_heads, h = hv / group;
  const int row0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int col0 = lane * kEpl, wrow = row0 + warp * kRows + lane;  // wrow: lane r's row (r < kRows)
  act_t* out = static_cast<act_t*>(p.out) + hv * p.s_out_h + wrow;
  auto zero_outputs = [&] {
    if (lane < kRows)
      for (int t = 0; t < T; ++t) out[(b * T + t) * p.s_out_b] = rssm::from_float<act_t>(0.f);
  };
  if (slot == p.pad_slot_id) {
    zero_outputs();
    return;
  }
  state_t* rows = static_cast<state_t*>(p.state) + slot * p.s_state_slot + hv * p.s_state_head +
                  (long long)(row0 + warp * kRows) * kK;  // this warp's checkpoint rows
  float acc[kRows][kEpl];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rssm::load_vec<state_t, kEpl, true>(rows + r * kK + col0, acc[r]);
  const int word = p.cursor[slot];
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const int first_id = rssm::preload_row_id(p.slot_idx, b, lane);
  if (word < 0 || !cur.valid(T, p.L) ||
      __any_sync(0xffffffffu, rssm::earlier_row_has(p.slot_idx, b, slot, lane, rssm::kWarpSize, first_id))) {
    zero_outputs();  // the same answer in every warp of every CTA of the row
    return;
  }
  const bool fold = verify_folds(cur, T, p.L);
  const rssm::SpecCursor hist = verify_history(cur, fold, p.L);
  if (fold) {
    fold_history_rows(p, slot, hv, h, row0 + warp * kRows, cur, col0, rows, acc);
    __syncthreads();  // every thread has read the cursor
    if (threadIdx.x == 0) rssm::arrive_and_advance(p.cursor, p.arrive, slot, gridDim.x * gridDim.y, hist.word());
  }
  verify_prologue(p, sm, b, slot, hv, h, hist);
  const WindowCoefs coefs{&sm.xq[0][0], &sm.xk[0][0], &sm.lg[0][0], &sm.cq[0][0], &sm.ck[0][0], sm.beta, sm.kq,
                          kGateCols, rssm::kMaxL, 1};
  const act_t* u_ring = static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head + row0 +
                        warp * kRows + lane % kRows;
  auto u_hist = [&](int j) { return rssm::to_float(u_ring[(long long)hist.position(j, p.L) * kV]); };
  float sq[kMaxWindow], sk[kMaxWindow];
  checkpoint_terms(acc, coefs, T, sq, sk);
  decode_window(sq, sk, coefs, T, p.L, hist, u_hist,
                static_cast<const act_t*>(p.v) + b * T * p.s_v_b + hv * p.s_v_h + wrow, p.s_v_b,
                out + b * T * p.s_out_b, p.s_out_b,
                static_cast<act_t*>(p.u_ring) + slot * p.s_ur_slot + hv * p.s_ur_head + wrow);
  if (blockIdx.x == 0) write_window_gates_and_keys(p, sm, b, slot, hv, h, hist);
}

namespace {

// A verify's record per (batch row, value head) in the p.coef rows (VerifyRec::stride(L, T) floats per value head),
// written by the verify prep kernel for a window of T tokens: xq [T][K] and xk [T][K] as VerifyShared holds them,
// cq [T][L] and ck [T][L] (entries j < w + t of token t), then per token k·q~, beta and (GDN) the log-decay lg_t;
// core/layouts.py delta_verify_rec_floats mirrors the stride.
struct VerifyRec {
  __host__ __device__ static constexpr int xq(int, int) { return 0; }
  __host__ __device__ static constexpr int xk(int, int T) { return T * kK; }
  __host__ __device__ static constexpr int cq(int, int T) { return 2 * T * kK; }
  __host__ __device__ static constexpr int ck(int L, int T) { return 2 * T * kK + T * L; }
  __host__ __device__ static constexpr int tok(int L, int T) { return 2 * T * kK + 2 * T * L; }  // [T][4]
  __host__ __device__ static constexpr int stride(int L, int T) { return (tok(L, T) + 4 * T + 3) / 4 * 4; }
};

// One shared-memory stage of the persistent verify for windows of T tokens and rings of L records: the checkpoint
// tile, slot and cursor word, the record, v of the tile's rows per token ([T][kTile]), the u rows of the row's
// history in history order ([L][kTile]; a folding row's: the records it folds), then a folding row's ring keys
// ([L][K] kring_t) and cumulative gates (GDN [L], KDA [L][K] fp32) in history order; core/layouts.py
// delta_verify_stage_bytes mirrors the total.
struct VerifyStageLayout {
  int info, rec, v, hist, keys, gates, bytes;
};

__host__ __device__ constexpr VerifyStageLayout verify_stage_layout(int L, int T) {
  VerifyStageLayout l{};
  l.info = kTileBytes;
  l.rec = l.info + 16;
  l.v = l.rec + VerifyRec::stride(L, T) * 4;
  l.hist = l.v + round16(T * kTile * int(sizeof(act_t)));
  l.keys = l.hist + round16(L * kTile * int(sizeof(act_t)));
  l.gates = l.keys + round16(L * kK * int(sizeof(kring_t)));
  l.bytes = (l.gates + round16(L * (kPerChannel ? kK : 1) * 4) + 127) / 128 * 128;
  return l;
}

}  // namespace

namespace {

// Value head hv's verify record (VerifyRec) of row b, with the window's xq and xk [T][K] written.
__device__ __forceinline__ float* record_with_rows(const DeltaParams& p, int b, int hv, const float (&xq)[kMaxWindow][kK],
                                                  const float (&xk)[kMaxWindow][kK]) {
  const int T = p.window, L = p.L;
  float* rec = p.coef + b * p.s_coef_row + (long long)hv * VerifyRec::stride(L, T);
  for (int i = threadIdx.x; i < T * kK; i += rssm::kThreads) {
    rec[VerifyRec::xq(L, T) + i] = xq[i / kK][i % kK];
    rec[VerifyRec::xk(L, T) + i] = xk[i / kK][i % kK];
  }
  return rec;
}

// The verify record's per-row part (VerifyRec) from the verify prologue's `sm`, for value head hv.
__device__ __forceinline__ void write_record(const DeltaParams& p, const VerifyShared& sm, int b, int hv, int w) {
  const int T = p.window, L = p.L;
  float* rec = record_with_rows(p, b, hv, sm.xq, sm.xk);
  for (int i = threadIdx.x; i < T * L; i += rssm::kThreads) {
    const int t = i / L, j = i % L;
    if (j < w + t) {
      rec[VerifyRec::cq(L, T) + i] = sm.cq[t][j];
      rec[VerifyRec::ck(L, T) + i] = sm.ck[t][j];
    }
  }
  if (threadIdx.x < T) {
    const int t = threadIdx.x;
    float* tok = rec + VerifyRec::tok(L, T) + 4 * t;
    tok[0] = sm.kq[t];
    tok[1] = sm.beta[t];
    tok[2] = kPerChannel ? 0.f : sm.lg[t][0];
  }
}

// KDA verify prep of (row b, value head hv = blockIdx.x): its prologue (for the smallest compile-time window bound
// that holds the call's window), record, window gates and keys.
__device__ __forceinline__ void value_head_prep(const DeltaParams& p, int b, int slot, rssm::SpecCursor hist) {
  __shared__ __align__(16) VerifyShared sm;
  const int hv = blockIdx.x, h = hv / (p.num_v_heads / p.num_k_heads);
  if (p.window <= 2) verify_prologue<2>(p, sm, b, slot, hv, h, hist);
  else if (p.window <= 4) verify_prologue<4>(p, sm, b, slot, hv, h, hist);
  else verify_prologue<kMaxWindow>(p, sm, b, slot, hv, h, hist);
  write_record(p, sm, b, hv, hist.count);
  write_window_gates_and_keys(p, sm, b, slot, hv, h, hist);
}

// GDN key heads share their queries, keys and key dots among at most this many value heads (a prep CTA's value heads).
constexpr int kMaxGroup = 16;

// The GDN verify prep's shared memory per (row, key head): the window's q~_t and k_t, the raw key dots
// dq[t][j] = k_j·q~_t and dk[t][j] = k_j·k_t of every entry j (ring j < w, window token j - w) with the tokens t > j - w,
// k_t·q~_t, and per value head of the key head beta_t, lg_t (the checkpoint's log-decay to after token t) and G_j (the
// entries' cumulative log-gates: the ring's, then the window's lg).
struct GdnPrepShared {
  float xq[kMaxWindow][kK], xk[kMaxWindow][kK];
  float dq[kMaxWindow][rssm::kMaxL], dk[kMaxWindow][rssm::kMaxL];
  float kq[kMaxWindow];
  float beta[kMaxGroup][kMaxWindow], lg[kMaxGroup][kMaxWindow], big_g[kMaxGroup][rssm::kMaxL];
};

// Raw dots of entry j (< w + T - 1, `key`: as the ring holds it, this lane's channels) with the tokens t > j - w into
// sm.dq / sm.dk (one warp; GDN entry_coefficients without the gate factor, which differs per value head).
template <int kT>
__device__ __forceinline__ void entry_dots(GdnPrepShared& sm, int T, int w, int j, const float (&key)[kEpl]) {
  const int lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int t0 = j < w ? 0 : j - w + 1;
  float parts[2 * kT] = {};
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t >= T) break;
    if (t < t0) continue;
    float xq[kEpl], xk[kEpl];
    rssm::load_vec<float, kEpl>(&sm.xq[t][col0], xq);
    rssm::load_vec<float, kEpl>(&sm.xk[t][col0], xk);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      parts[t] = fmaf(key[e], xq[e], parts[t]);
      parts[kT + t] = fmaf(key[e], xk[e], parts[kT + t]);
    }
  }
  const float dot = rssm::warp_sum_scatter<2 * kT>(parts);  // lane t: entry·q~ of token t, kT + t: entry·k
  const int t = lane % kT;
  if (lane < 2 * kT && t >= t0 && t < T) (lane < kT ? sm.dq : sm.dk)[t][j] = dot;
}

// GDN verify prep of (row b, key head h = blockIdx.x) for windows of T <= kT tokens: the window's normalised queries
// and keys and the key dots once for the key head's `group` value heads, then per value head its gates, its record
// (the coefficients: raw dots times e^{lg_t - G_j}, as entry_coefficients computes them) and its window gates; the
// window's keys into the key head's ring.
template <int kT>
__device__ __forceinline__ void key_head_prep(const DeltaParams& p, GdnPrepShared& sm, int b, int slot,
                                              rssm::SpecCursor hist) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int h = blockIdx.x, T = p.window, L = p.L, w = hist.count, group = p.num_v_heads / p.num_k_heads;
  const float* g_ring = p.g_ring + slot * p.s_gr_slot;
  for (int t = warp; t < T; t += rssm::kNumWarps) {
    float qn[kEpl], kn[kEpl];
    const float kq = normalized_qk(p, b * T + t, h, col0, qn, kn);
    rssm::store_vec<float, kEpl>(&sm.xq[t][col0], qn);
    rssm::store_vec<float, kEpl>(&sm.xk[t][col0], kn);
    if (lane == 0) sm.kq[t] = kq;
  }
  for (int i = threadIdx.x; i < group * T; i += rssm::kThreads) {
    const int g = i / T, t = i % T, hv = h * group + g, bt = b * T + t;
    float lg[kGates];
    current_log_gate(p, bt, hv, 0, lg);
    sm.lg[g][t] = lg[0];
    sm.beta[g][t] = rssm::sigmoidf(load_scalar(p.beta, bt * p.s_beta_b + hv * p.s_beta_h, p.beta_is_f32));
  }
  for (int i = threadIdx.x; i < group * w; i += rssm::kThreads) {
    const int g = i / w, j = i % w;
    sm.big_g[g][j] = g_ring[(h * group + g) * p.s_gr_head + hist.position(j, L)];
  }
  __syncthreads();
  // lg_t = G_{w-1} + g_0 + ... + g_t (the reference's order of additions); the window's entries' G_{w+t} = lg_t
  for (int g = threadIdx.x; g < group; g += rssm::kThreads) {
    float lg = w > 0 ? sm.big_g[g][w - 1] : 0.f;
    for (int t = 0; t < T; ++t) {
      lg += sm.lg[g][t];
      sm.lg[g][t] = lg;
      sm.big_g[g][w + t] = lg;
    }
  }
  const act_t* k_ring = static_cast<const act_t*>(p.k_ring) + slot * p.s_kr_slot + h * p.s_kr_head;
  for (int j = warp; j < w + T - 1; j += rssm::kNumWarps) {
    float key[kEpl];
    if (j < w) {
      rssm::load_vec<act_t, kEpl>(k_ring + (long long)hist.position(j, L) * kK + col0, key);
    } else {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) key[e] = rssm::round_through<act_t>(sm.xk[j - w][col0 + e]);
    }
    entry_dots<kT>(sm, T, w, j, key);
  }
  __syncthreads();
  for (int g = 0; g < group; ++g) {
    const int hv = h * group + g;
    float* rec = record_with_rows(p, b, hv, sm.xq, sm.xk);
    for (int i = threadIdx.x; i < T * L; i += rssm::kThreads) {
      const int t = i / L, j = i % L;
      if (j < w + t) {
        const float decay = __expf(sm.lg[g][t] - sm.big_g[g][j]);
        rec[VerifyRec::cq(L, T) + i] = sm.dq[t][j] * decay;
        rec[VerifyRec::ck(L, T) + i] = sm.dk[t][j] * decay;
      }
    }
    if (threadIdx.x < T) {
      const int t = threadIdx.x;
      float* tok = rec + VerifyRec::tok(L, T) + 4 * t;
      tok[0] = sm.kq[t];
      tok[1] = sm.beta[g][t];
      tok[2] = sm.lg[g][t];
      p.g_ring[slot * p.s_gr_slot + hv * p.s_gr_head + hist.position(w + t, L)] = sm.lg[g][t];
    }
  }
  act_t* k_dst = static_cast<act_t*>(p.k_ring) + slot * p.s_kr_slot + h * p.s_kr_head;
  for (int t = warp; t < T; t += rssm::kNumWarps) {
    float key[kEpl];
    rssm::load_vec<float, kEpl>(&sm.xk[t][col0], key);
    rssm::store_vec<act_t, kEpl>(k_dst + (long long)hist.position(w + t, L) * kK + col0, key);
  }
}

// GDN verify prep for the call's window: the smallest compile-time window bound that holds it.
__device__ __forceinline__ void key_head_prep(const DeltaParams& p, int b, int slot, rssm::SpecCursor hist) {
  __shared__ __align__(16) GdnPrepShared sm;
  if (p.window <= 2) key_head_prep<2>(p, sm, b, slot, hist);
  else if (p.window <= 4) key_head_prep<4>(p, sm, b, slot, hist);
  else key_head_prep<kMaxWindow>(p, sm, b, slot, hist);
}

}  // namespace

// Verify step 1 of the persistent verify, 128 threads, grid (prep CTAs per row, batch): a CTA per (row, key head) for
// GDN (key_head_prep: the queries, keys and key dots are shared by the key head's value heads), per (row, value head)
// for KDA (value_head_prep): the verify prologue (delta_verify_kernel's) into the records (VerifyRec) of the row's
// value heads, the window's gates and keys into the rings after the history; the row's cursor word into p.step
// (rssm::kSkipStep for a row the verify skips); the last prep CTA of a folding row moves the cursor past the history.
// Reads history records only where no launch of the step writes. Lets the persistent verify kernel launch once the
// previous grid has finished (rssm::prep_begin).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) delta_verify_prep_kernel(const DeltaParams p) {
  rssm::prep_begin(p.step - 1);
  const int b = blockIdx.y, T = p.window, L = p.L;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int word = p.cursor[slot];
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const bool bad = word < 0 || !cur.valid(T, L);
  if (__syncthreads_or(bad || rssm::earlier_row_has(p.slot_idx, b, slot, threadIdx.x, blockDim.x,
                                                    rssm::preload_row_id(p.slot_idx, b, threadIdx.x)))) {
    if (threadIdx.x == 0 && blockIdx.x == 0) p.step[b] = rssm::kSkipStep;
    return;
  }
  const bool fold = verify_folds(cur, T, L);
  const rssm::SpecCursor hist = verify_history(cur, fold, L);
  if constexpr (kPerChannel) value_head_prep(p, b, slot, hist);
  else key_head_prep(p, b, slot, hist);
  __syncthreads();  // every thread has read the cursor
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) p.step[b] = word;
    if (fold) rssm::arrive_and_advance(p.cursor, p.arrive, slot, gridDim.x, hist.word());
  }
}

namespace {

// Producer warp of the persistent verify (rssm::produce_tiles_claiming_tail): besides slot and cursor word, each
// tile's record and the window's v rows; the u rows of the row's history, or of a folding row the u rows, ring keys
// and gates of the records it folds, in history order. Short rows go as 16-byte chunks over the warp's lanes
// (rssm::cp_async_pieces).
__device__ __forceinline__ void produce_verify(const DeltaParams& p, rssm::TilePipe& pipe, unsigned char* stage_mem,
                                               int num_tiles) {
  const int T = p.window, L = p.L;
  const VerifyStageLayout lay = verify_stage_layout(L, T);
  constexpr int kRowBytes = kTile * int(sizeof(act_t)), kKeyBytes = kK * int(sizeof(kring_t));
  auto state_src = [&](int slot, const TileCoord& c) -> const void* {
    if (slot == p.pad_slot_id) return nullptr;
    return static_cast<const state_t*>(p.state) + slot * p.s_state_slot + c.hv * p.s_state_head +
           (long long)c.row0 * kK;
  };
  auto copy_inputs = [&](unsigned char* stage, const TileCoord& c, int slot, int word, unsigned long long* full) {
    const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
    const bool fold = verify_folds(cur, T, L);
    const rssm::SpecCursor hist = verify_history(cur, fold, L);
    const float* rec = p.coef + c.b * p.s_coef_row + (long long)c.hv * VerifyRec::stride(L, T);
    if (!rssm::bulk_copy_input(stage + lay.rec, rec, VerifyRec::stride(L, T) * 4, full))
      rssm::cp_async_words(stage + lay.rec, rec, VerifyRec::stride(L, T));
    const act_t* v_b = static_cast<const act_t*>(p.v) + c.b * T * p.s_v_b + c.hv * p.s_v_h + c.row0;
    rssm::cp_async_pieces<kRowBytes>(stage + lay.v, T, [&](int t) { return v_b + t * p.s_v_b; });
    const rssm::SpecCursor rows = fold ? cur : hist;  // the records whose u rows the tile reads
    const act_t* u_ring = static_cast<const act_t*>(p.u_ring) + slot * p.s_ur_slot + c.hv * p.s_ur_head + c.row0;
    rssm::cp_async_pieces<kRowBytes>(stage + lay.hist, rows.count,
                                     [&](int j) { return u_ring + (long long)rows.position(j, L) * kV; });
    if (fold) {
      const int h = c.hv / (p.num_v_heads / p.num_k_heads);
      const kring_t* k_ring =
          static_cast<const kring_t*>(p.k_ring) + slot * p.s_kr_slot + key_ring_head(c.hv, h) * p.s_kr_head;
      const float* g_ring = p.g_ring + slot * p.s_gr_slot + c.hv * p.s_gr_head;
      rssm::cp_async_pieces<kKeyBytes>(stage + lay.keys, cur.count,
                                       [&](int j) { return k_ring + (long long)cur.position(j, L) * kK; });
      constexpr int kGateFloats = kPerChannel ? kK : 1;  // a record's cumulative gates
      rssm::cp_async_pieces<kGateFloats * 4>(stage + lay.gates, cur.count,
                                             [&](int j) { return g_ring + (long long)cur.position(j, L) * kGateFloats; });
    }
  };
  auto coord = [&](int t) { return tile_coord(p, t); };
  rssm::produce_tiles_claiming_tail(pipe, stage_mem, p.stages, p.stage_bytes, num_tiles, kTileBytes, p.slot_idx,
                                    p.step, p.pad_slot_id, p.slots, p.tail_start, p.step - 1, coord, state_src,
                                    copy_inputs);
}

// One consumer warp's rows of a verify tile (stage complete), delta_verify_kernel's arithmetic from the stage: the
// checkpoint rows (a folding row's history first folded into them and stored), every window token's checkpoint
// terms, the history's ring terms and the window in exact order; outputs and the window's u records. Releases the
// stage.
__device__ __forceinline__ void verify_tile(const DeltaParams& p, const TileCoord& c, unsigned char* stage,
                                            rssm::TilePipe& pipe, int s) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int T = p.window, L = p.L, wrow = c.row0 + warp * kRows + lane;  // wrow: lane r's row (r < kRows)
  const VerifyStageLayout lay = verify_stage_layout(L, T);
  const int* info_words = reinterpret_cast<const int*>(stage + lay.info);
  const int slot = info_words[0], word = info_words[1];  // word: stale for a pad row (not read then)
  act_t* out = static_cast<act_t*>(p.out) + c.hv * p.s_out_h + wrow;
  if (rssm::skipped_stage_row(slot, word, p.pad_slot_id, p.slots)) {
    rssm::release_stage(pipe, s);
    if (lane < kRows)
      for (int t = 0; t < T; ++t) out[(c.b * T + t) * p.s_out_b] = rssm::from_float<act_t>(0.f);
    return;
  }
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const bool fold = verify_folds(cur, T, L);
  const rssm::SpecCursor hist = verify_history(cur, fold, L);
  const float* rec = reinterpret_cast<const float*>(stage + lay.rec);
  const float* tok = rec + VerifyRec::tok(L, T);
  const WindowCoefs coefs{rec + VerifyRec::xq(L, T), rec + VerifyRec::xk(L, T), tok + 2, rec + VerifyRec::cq(L, T),
                          rec + VerifyRec::ck(L, T), tok + 1, tok, 4, L, 4};
  const act_t* v_s = reinterpret_cast<const act_t*>(stage + lay.v) + warp * kRows + lane;
  const act_t* u_s = reinterpret_cast<const act_t*>(stage + lay.hist) + warp * kRows + lane % kRows;
  state_t* tile_rows = reinterpret_cast<state_t*>(stage) + warp * kRows * kK;  // the warp's rows, as stored
  float sq[kMaxWindow], sk[kMaxWindow];
  if (fold || !kStageDots) {
    float acc[kRows][kEpl];
#pragma unroll
    for (int r = 0; r < kRows; ++r) rssm::load_vec<state_t, kEpl>(tile_rows + r * kK + col0, acc[r]);
    if (fold) {  // the folded records' u rows, keys and gates are in the stage, in history order
      state_t* rows = static_cast<state_t*>(p.state) + slot * p.s_state_slot + c.hv * p.s_state_head +
                      (long long)(c.row0 + warp * kRows) * kK;
      fold_records(reinterpret_cast<const kring_t*>(stage + lay.keys),
                   reinterpret_cast<const float*>(stage + lay.gates),
                   reinterpret_cast<const act_t*>(stage + lay.hist) + warp * kRows, kTile, L,
                   rssm::SpecCursor{0, cur.count}, col0, acc);
      store_rounded_rows(rows, col0, acc);
      if constexpr (kStageDots) {  // the folded rows as stored back into the stage for the dots
#pragma unroll
        for (int r = 0; r < kRows; ++r) rssm::store_vec<state_t, kEpl>(tile_rows + r * kK + col0, acc[r]);
        __syncwarp();
      }
    }
    if constexpr (!kStageDots) checkpoint_terms(acc, coefs, T, sq, sk);
  }
  if constexpr (kStageDots) stage_checkpoint_terms(tile_rows, coefs, T, sq, sk);
  auto u_hist = [&](int j) { return rssm::to_float(u_s[j * kTile]); };
  decode_window(sq, sk, coefs, T, L, hist, u_hist, v_s, kTile, out + c.b * T * p.s_out_b, p.s_out_b,
                static_cast<act_t*>(p.u_ring) + slot * p.s_ur_slot + c.hv * p.s_ur_head + wrow);
  rssm::release_stage(pipe, s);
}

}  // namespace

// CTAs per SM of the persistent verify: two up to 128 key channels; one above (a lane's 8 channels of every row of its
// warp no longer fit the registers of two); core/ops/delta.py verify_ctas_per_sm mirrors it.
constexpr int kVerifyCtasPerSm = kEpl <= 4 ? 2 : 1;

// Verify step 2, persistent and warp-specialised like the replay main kernel (grid: CTAs per SM x SMs; 4 consumer
// warps + 1 producer warp; `stages` stages of `stage_bytes` in dynamic shared memory, no fold buffer), a programmatic
// dependent of the verify prep kernel, over the row tiles of every (row, value head). Requires sm_90+.
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, kVerifyCtasPerSm) delta_verify_main_kernel(
    const DeltaParams p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  const int num_tiles = p.batch * p.num_v_heads * (kV / kTile);
  rssm::persistent_main<true>(pipe, stage_mem, p.stages, p.stage_bytes, verify_stage_layout(p.L, p.window).bytes,
                              num_tiles, p.tail_start, kTileBytes, [&] { produce_verify(p, pipe, stage_mem, num_tiles); },
                              [&](int t, unsigned char* stage, int s, const unsigned char*, int&) {
                                verify_tile(p, tile_coord(p, t), stage, pipe, s);
                              });
#endif
}

// Per-draft-state verify (the baseline of speculative decoding): the state read once into registers, then the T
// window tokens as baseline steps, each token's state stored to inter[b, t] (state dtype; the recurrence goes on in
// fp32) and its output to out. The slot's state is not written.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) delta_per_draft_verify_kernel(const DeltaParams p) {
  const int b = blockIdx.z, T = p.window;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  const int hv = blockIdx.y, h = hv / (p.num_v_heads / p.num_k_heads);
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int row0 = blockIdx.x * kTile + warp * kRows;
  act_t* out = static_cast<act_t*>(p.out) + hv * p.s_out_h + row0 + lane;
  if (slot == p.pad_slot_id) {
    if (lane < kRows)
      for (int t = 0; t < T; ++t) out[(b * T + t) * p.s_out_b] = rssm::from_float<act_t>(0.f);
    return;
  }
  const state_t* src =
      static_cast<const state_t*>(p.state) + slot * p.s_state_slot + hv * p.s_state_head + (long long)row0 * kK + col0;
  state_t* inter = static_cast<state_t*>(p.inter) + b * p.s_inter_b + hv * p.s_inter_h + (long long)row0 * kK + col0;
  float acc[kRows][kEpl];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rssm::load_vec<state_t, kEpl, true>(src + r * kK, acc[r]);
  for (int t = 0; t < T; ++t) {
    const int bt = b * T + t;
    float qn[kEpl], kn[kEpl], lg[kGates];
    const float kq = normalized_qk(p, bt, h, col0, qn, kn);
    current_log_gate(p, bt, hv, col0, lg);
    const float beta = rssm::sigmoidf(load_scalar(p.beta, bt * p.s_beta_b + hv * p.s_beta_h, p.beta_is_f32));
    const float v_lane = lane < kRows ? rssm::to_float(static_cast<const act_t*>(p.v)[bt * p.s_v_b + hv * p.s_v_h +
                                                                                       row0 + lane])
                                      : 0.f;
    float u_lane;
    const float o = token_update(acc, qn, kn, kq, lg, beta, v_lane, u_lane);
    if (lane < kRows) out[bt * p.s_out_b] = rssm::from_float<act_t>(o);
#pragma unroll
    for (int r = 0; r < kRows; ++r) rssm::store_vec<state_t, kEpl>(inter + t * p.s_inter_t + r * kK, acc[r]);
  }
}

// Per-draft-state commit: the slot's state <- inter[b, accepted[b] - 1] (this CTA's rows). A row with an accepted
// count outside 1 .. T, or repeating an earlier row's slot, is skipped.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) delta_per_draft_commit_kernel(const DeltaParams p) {
  const int b = blockIdx.z;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int hv = blockIdx.y;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize, col0 = lane * kEpl;
  const int row0 = blockIdx.x * kTile + warp * kRows;
  const int accepted = p.accepted[b];
  const int first_id = rssm::preload_row_id(p.slot_idx, b, lane);
  if (accepted < 1 || accepted > p.window ||
      __any_sync(0xffffffffu, rssm::earlier_row_has(p.slot_idx, b, slot, lane, rssm::kWarpSize, first_id)))
    return;
  const state_t* src = static_cast<const state_t*>(p.inter) + b * p.s_inter_b + (accepted - 1) * p.s_inter_t +
                       hv * p.s_inter_h + (long long)row0 * kK + col0;
  state_t* dst = static_cast<state_t*>(p.state) + slot * p.s_state_slot + hv * p.s_state_head + (long long)row0 * kK +
                 col0;
  rssm::RawVecOf<state_t, kEpl> rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rssm::load_raw(src + r * kK, rows[r]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    auto* d = reinterpret_cast<typename rssm::VecTraits<state_t, kEpl>::Raw*>(dst + r * kK);
#pragma unroll
    for (int c = 0; c < rssm::VecTraits<state_t, kEpl>::kChunks; ++c) d[c] = rows[r].chunk[c];
  }
}

#endif
