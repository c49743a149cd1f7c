// Mamba-2 single-token decode: baseline state update, ReplaySSM replay decode (prep + main), and flush decode.
//
// Compile-time constants (NVRTC -D): P (head_dim), N (d_state), PT (state rows per CTA), STATE_T, ACT_T, and for
// quantized or stochastically rounded checkpoints MASTER_FMT (the checkpoint a flush folds from and writes: 0 plain
// STATE_T rows, 1 FP8, 2 NVFP4; STATE_T is unsigned char for the last two), READ_FMT (dual mode: the read copy
// non-flush steps read, 1 FP8 or 2 NVFP4; 0: none) and SR (stochastic rounding of every checkpoint write).
// State kernels run grid (P / PT, nheads, batch) with 128 threads: each warp owns PT/4 rows of one head's (P x N) state
// tile, each lane N/32 consecutive columns, so every update is row-local and the state is read exactly once.
//
// Replay, for a row at cursor w (Δ_j from the ring for j < w, Δ_w of the current token):
//   ex_j = Σ_{j<i<=w} Δ_i,  tot = Σ_{i<=w} Δ_i,  s_j = Δ_j exp(A ex_j),  decay = exp(A tot)
//   non-flush: y = decay (S0 · C) + Σ_{j<=w} s_j (B_j · C) x_j + D x ; append (x, Δ, B) at ring position w
//   flush:     S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ ; store S ; y = S · C + D x
// The replay is two launches: `prep` (grid (batch, ngroups)) computes the per-head weights into a per-batch-row
// scratch, appends Δ/B, advances the cursor; `main` is persistent and warp-specialised: a producer warp streams each
// (PT x N) checkpoint tile (PT a multiple of P: PT / P adjacent heads) with a bulk copy and the tile's inputs with
// bulk or async copies into shared-memory stages, four consumer warps compute the rows from shared memory. Where the
// plan keeps flush rows apart, `main` skips them and a third launch, `replay_flush`, folds them per (row, head).
// `flush_decode` (adaptive small-batch mode) is the baseline step with a fold of any pending ring entries.
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

using state_t = STATE_T;
using act_t = ACT_T;

// The kernel parameters, one by-value struct for every Mamba-2 kernel: generated from MAMBA2_PARAMS in
// trtllm_replayssm/core/layouts.py (the one description of its fields), an in-memory header at compilation.
#include "Mamba2Params.h"

namespace {

constexpr int kEpl = N / rssm::kWarpSize;     // state columns per lane
constexpr int kRowsPerWarp = PT / rssm::kNumWarps;
// A row tile of more rows than a head has (PT a multiple of P, the persistent replay kernel only) spans kTileHeads
// adjacent heads of one batch row: twice the bytes per tile for the producer warp, whose per-tile work bounds small
// tiles (docs/decisions.md, the persistent producer bounds small tiles). The state kernels need PT <= P.
constexpr int kTileHeads = PT > P ? PT / P : 1;
constexpr int kHeadRows = PT / kTileHeads;  // a tile's rows of each head

// Checkpoint storage (plugins/state_formats.cuh): the master (the one checkpoint outside dual mode) and the rows a
// non-flush step reads (dual mode's read copy, else the master). kStored: anything but plain round-to-nearest rows.
constexpr bool kDual = READ_FMT != rssm::kFmtPlain;
constexpr bool kStored = kDual || MASTER_FMT != rssm::kFmtPlain || SR;
// Launch bounds of stored modules: the state kernels ask for one CTA per SM at least (without a minimum ptxas
// gives some stored state kernels few registers and spills), and a replay main kernel with stochastic rounding
// and a read copy runs 2 CTAs per SM (at 3 its 128 registers spill; core/plans.py replay_tuning mirrors it).
constexpr int kStateMinBlocks = kStored ? 1 : 0;
// The one-launch replay asks for one CTA per SM at least on sm_100 and later too: without a minimum ptxas there gives
// it 72-80 registers and spills (plain fp32 32-row and fp16 80-row tiles).
#if __CUDA_ARCH__ >= 1000
constexpr int kFusedMinBlocks = 1;
#else
constexpr int kFusedMinBlocks = kStateMinBlocks;
#endif
// The persistent replay kernel's CTAs per SM (launch bounds; core/ops/mamba2.py STORED_REPLAY_CTAS, plans.py
// PLAIN_REPLAY_CTAS): a stored checkpoint's never folds (its flush rows go to the flush-rows kernel) and needs 64-72
// registers, a plain one's folds.
constexpr int kReplayCtasPerSm = kStored ? 5 : 3;
using MasterRows = rssm::Rows<MASTER_FMT, state_t, N>;
constexpr int kReadFmt = kDual ? READ_FMT : MASTER_FMT;  // the rows non-flush steps read
using ReadRows = rssm::Rows<kReadFmt, state_t, N>;
// FP8 and NVFP4 rows read by non-flush steps take their dots as fp16x2 products (rssm::QuantRowDots).
constexpr bool kQuantRowDots = kReadFmt != rssm::kFmtPlain && N % 16 == 0 && 32 % (N / 16) == 0 &&
                               kRowsPerWarp % (rssm::kWarpSize / (N / 16)) == 0;
static_assert(MASTER_FMT == rssm::kFmtPlain || sizeof(state_t) == 1, "quantized checkpoints hold byte codes");
static_assert(N % rssm::kWarpSize == 0, "d_state must be a multiple of 32");
static_assert(PT % rssm::kNumWarps == 0 && (P % PT == 0 || PT % P == 0) && PT <= rssm::kThreads,
              "row tile must divide head_dim or be a multiple of it, be a multiple of 4 and at most 128");

// The state tile stays in registers in its storage format while its loads are in flight (half the registers for
// 16-bit states); rows are widened to fp32 one at a time when used. FP8 and NVFP4 rows are decoded as they load.
using RawVec = rssm::VecTraits<state_t, kEpl>;
using RawTile = rssm::conditional_t<MASTER_FMT == rssm::kFmtPlain, typename RawVec::Raw[kRowsPerWarp][RawVec::kChunks],
                                  float[kRowsPerWarp][kEpl]>;

// Per-row output staging: the warps reduce S·C per row, thread i < PT finishes row i (coalesced stores).
struct __align__(16) OutStage {
  float dot[PT];    // Σ_n S[row, n] C[n]
  float extra[PT];  // D x (+ ring terms of a non-flush replay step)
  float gate[PT];   // silu(z) or 1
  float x[PT];      // current x
};

// Rows row0 ... of the master checkpoint of (slot, head).
__device__ __forceinline__ MasterRows master_rows(const Mamba2Params& p, int slot, int head, int row0) {
  auto* data = static_cast<unsigned char*>(p.state) +
               (slot * p.s_state_slot + head * p.s_state_head) * (long long)sizeof(state_t) +
               (long long)row0 * MasterRows::kDataBytes;
  if constexpr (MASTER_FMT == rssm::kFmtPlain) {
    return {data, nullptr, nullptr};
  } else {
    const long long row = ((long long)slot * p.nheads + head) * P + row0;
    return {data, static_cast<unsigned char*>(p.state_bscale) + row * MasterRows::kBlockBytes, p.state_scale + row};
  }
}

// Rows row0 ... of the read copy of (slot, head) (dual mode).
__device__ __forceinline__ ReadRows read_rows(const Mamba2Params& p, int slot, int head, int row0) {
  const long long row = ((long long)slot * p.nheads + head) * P + row0;
  return {static_cast<unsigned char*>(p.read) + row * ReadRows::kDataBytes,
          static_cast<unsigned char*>(p.read_bscale) + row * ReadRows::kBlockBytes, p.read_scale + row};
}

// Rows row0 ... of what non-flush steps of (slot, head) read: the read copy in dual mode, else the master.
__device__ __forceinline__ ReadRows nonflush_rows(const Mamba2Params& p, int slot, int head, int row0) {
#if READ_FMT
  return read_rows(p, slot, head, row0);
#else
  return master_rows(p, slot, head, row0);
#endif
}

// The checkpoint rows of a (slot, head) that a flush writes (rssm::CheckpointRows).
using CheckpointRows = rssm::CheckpointRows<MASTER_FMT, READ_FMT, SR != 0, state_t, P, N>;

__device__ __forceinline__ CheckpointRows checkpoint_rows(const Mamba2Params& p, int slot, int head, int row0) {
  CheckpointRows rows{master_rows(p, slot, head, row0), {}, slot, head, row0};
  if constexpr (kDual) rows.read = read_rows(p, slot, head, row0);
  return rows;
}

struct Tile {
  int b, slot, head, group, row0, warp, lane;
  state_t* state;      // this lane's first element of this warp's rows (plain master)
  MasterRows master;   // this warp's first row of the master
  CheckpointRows rows;  // this warp's first row of what a stored checkpoint's write stores
  unsigned flushes;    // the slot's checkpoint writes so far (stochastic rounding)
};

// A pad row's outputs are zeros (its state, ring and cursor are not touched): rows row0 .. row0+PT-1 of head h, for
// every token of the row (a verify's window).
__device__ __forceinline__ void zero_pad_output(const Mamba2Params& p, int b, int h, int row0) {
  for (int i = threadIdx.x; i < p.window * PT; i += blockDim.x)
    static_cast<act_t*>(p.out)[b * p.s_out_b + (i / PT) * p.s_out_t + h * p.s_out_h + row0 + i % PT] =
        rssm::from_float<act_t>(0.f);
}

// The tile's coordinates (batch row, head, group, first row, warp, lane): no loads.
__device__ __forceinline__ void tile_coords(const Mamba2Params& p, Tile& t) {
  t.b = blockIdx.z;
  t.head = blockIdx.y;
  t.group = t.head / (p.nheads / p.ngroups);
  t.row0 = blockIdx.x * PT;
  t.warp = threadIdx.x / rssm::kWarpSize;
  t.lane = threadIdx.x % rssm::kWarpSize;
}

// The row's slot and the state's addresses of a tile with its coordinates (tile_coords); false, with zero outputs,
// for a pad row.
__device__ __forceinline__ bool locate_slot(const Mamba2Params& p, Tile& t) {
  t.slot = rssm::row_slot(p.slot_idx, t.b, p.pad_slot_id, p.slots);
  if (t.slot == p.pad_slot_id) {
    zero_pad_output(p, t.b, t.head, t.row0);
    return false;
  }
  t.state = static_cast<state_t*>(p.state) + t.slot * p.s_state_slot + t.head * p.s_state_head +
            (long long)(t.row0 + t.warp * kRowsPerWarp) * N + t.lane * kEpl;
  t.master = master_rows(p, t.slot, t.head, t.row0 + t.warp * kRowsPerWarp);
  if constexpr (kStored) t.rows = checkpoint_rows(p, t.slot, t.head, t.row0 + t.warp * kRowsPerWarp);
  t.flushes = SR && p.flushes ? p.flushes[t.slot] : 0u;
  return true;
}

// The tile (tile_coords, then locate_slot); false, with zero outputs, for a pad row.
__device__ __forceinline__ bool setup_tile(const Mamba2Params& p, Tile& t) {
  tile_coords(p, t);
  return locate_slot(p, t);
}

// Whether the tile's row repeats an earlier row's slot (rssm::row_slot; warp-uniform, the same in every warp).
// `first_id`: rssm::preload_row_id(p.slot_idx, t.b, t.lane), loaded with the tile's first loads.
__device__ __forceinline__ bool repeats_earlier_row(const Mamba2Params& p, const Tile& t, int first_id) {
  return __any_sync(0xffffffffu, rssm::earlier_row_has(p.slot_idx, t.b, t.slot, t.lane, rssm::kWarpSize, first_id));
}

// The exponent A Σ Δ of a decay, with 0 when either factor is 0 (no time elapsed, or no decay: A = -inf with Δ = 0
// and A = 0 with Δ = inf give no decay, as a sum of such terms does in the baseline).
__device__ __forceinline__ float decay_exponent(float a, float delta_sum) {
  return a == 0.f || delta_sum == 0.f ? 0.f : a * delta_sum;
}

// dt + dt_bias of row b's token `tok` (a verify's window; 0 otherwise) for head h, before the softplus.
__device__ __forceinline__ float biased_dt(const Mamba2Params& p, int b, int h, int tok = 0) {
  const long long off = b * p.s_dt_b + tok * p.s_dt_t + h * p.s_dt_h;
  float dt = p.dt_is_f32 ? static_cast<const float*>(p.dt)[off] : rssm::to_float(static_cast<const act_t*>(p.dt)[off]);
  if (p.dt_bias) dt += p.dt_bias[h];
  return dt;
}

// Δ of a biased dt (biased_dt).
__device__ __forceinline__ float delta_of(const Mamba2Params& p, float dt) {
  return p.dt_softplus ? rssm::softplus_thr20(dt) : dt;
}

// Δ of row b's token `tok` (a verify's window; 0 otherwise) for head h.
__device__ __forceinline__ float current_delta(const Mamba2Params& p, int b, int h, int tok = 0) {
  return delta_of(p, biased_dt(p, b, h, tok));
}

template <class Raw>  // RawTile (a template: the branch not taken is discarded)
__device__ __forceinline__ void load_raw(const Tile& t, Raw& raw) {
  if constexpr (MASTER_FMT != rssm::kFmtPlain) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) t.master.decode(r, t.lane, raw[r]);
  } else {
    const auto* src = reinterpret_cast<const typename RawVec::Raw*>(t.state);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int c = 0; c < RawVec::kChunks; ++c) {
        if constexpr (RawVec::kChunk == 16) raw[r][c] = __ldcs(src + r * (N / RawVec::kPerChunk) + c);
        else raw[r][c] = src[r * (N / RawVec::kPerChunk) + c];
      }
  }
}

template <class Raw>  // RawTile
__device__ __forceinline__ void unpack_row(const Raw& raw, int r, float (&v)[kEpl]) {
  if constexpr (MASTER_FMT != rssm::kFmtPlain) {
#pragma unroll
    for (int e = 0; e < kEpl; ++e) v[e] = raw[r][e];
  } else {
    static_assert(RawVec::kChunk >= 4, "raw chunks must hold whole 32-bit words");
#pragma unroll
    for (int c = 0; c < RawVec::kChunks; ++c)
#pragma unroll
      for (int i = 0; i < RawVec::kPerChunk; ++i) v[c * RawVec::kPerChunk + i] = rssm::raw_elem<state_t>(raw[r][c], i);
  }
}

__device__ __forceinline__ const act_t* group_vec(const void* base, long long sb, long long sg, int b, int g) {
  return static_cast<const act_t*>(base) + b * sb + g * sg;
}

__device__ __forceinline__ const act_t* x_of(const Mamba2Params& p, const Tile& t) {
  return static_cast<const act_t*>(p.x) + t.b * p.s_x_b + t.head * p.s_x_h;
}

__device__ __forceinline__ const act_t* x_ring_at(const Mamba2Params& p, int slot, int head) {
  return static_cast<const act_t*>(p.x_ring) + slot * p.s_xr_slot + head * p.s_xr_head;
}

// Row i's x, D and z as loaded (thread i < PT; the others stage nothing): stage_extras turns them into x, D x and
// the gate.
struct Extras {
  float x = 0.f, d = 0.f, z = 0.f;
};

__device__ __forceinline__ Extras load_extras(const Mamba2Params& p, const Tile& t) {
  Extras e;
  const int i = threadIdx.x;
  if (i < PT) {
    const int row = t.row0 + i;
    e.x = rssm::to_float(x_of(p, t)[row]);
    if (p.D) e.d = p.D[t.head];
    if (p.z) e.z = rssm::to_float(static_cast<const act_t*>(p.z)[t.b * p.s_z_b + t.head * p.s_z_h + row]);
  }
  return e;
}

__device__ __forceinline__ void stage_extras(const Mamba2Params& p, const Extras& e, OutStage& st) {
  const int i = threadIdx.x;
  if (i >= PT) return;
  st.x[i] = e.x;
  st.extra[i] = p.D ? e.d * e.x : 0.f;
  st.gate[i] = p.z ? rssm::siluf(e.z) : 1.f;
}

// Thread i < PT stages row i's x, D x and its gate.
__device__ __forceinline__ void stage_extras(const Mamba2Params& p, const Tile& t, OutStage& st) {
  stage_extras(p, load_extras(p, t), st);
}

// Warp-reduce row r's S·C into the stage.
__device__ __forceinline__ void stage_row_dot(const Tile& t, int r, const float (&v)[kEpl], const float (&cv)[kEpl],
                                              OutStage& st) {
  float dot = 0.f;
#pragma unroll
  for (int e = 0; e < kEpl; ++e) dot = fmaf(v[e], cv[e], dot);
  dot = rssm::warp_sum(dot);
  if (t.lane == 0) st.dot[t.warp * kRowsPerWarp + r] = dot;
}

// The S·C of every row of this warp's tile (`v`: this lane's columns) reduced together into the stage
// (rssm::warp_sum_scatter over kDotSlots sums: kDotSlots - 1 + log2(32 / kDotSlots) shuffles instead of 5 a row).
constexpr int kDotSlots = kRowsPerWarp <= 1 ? 1 : kRowsPerWarp <= 2 ? 2 : kRowsPerWarp <= 4 ? 4 : kRowsPerWarp <= 8 ? 8
                        : kRowsPerWarp <= 16 ? 16 : 32;
static_assert(kRowsPerWarp <= rssm::kWarpSize, "a warp's rows: at most 32");
__device__ __forceinline__ void stage_tile_dots(const Tile& t, const float (&v)[kRowsPerWarp][kEpl],
                                                const float (&cv)[kEpl], OutStage& st) {
  float dot[kDotSlots] = {};
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kEpl; ++e) dot[r] = fmaf(v[r][e], cv[e], dot[r]);
  const float sum = rssm::warp_sum_scatter<kDotSlots>(dot);
  if (t.lane < kRowsPerWarp) st.dot[t.warp * kRowsPerWarp + t.lane] = sum;
}

// y[row] = (S·C + extra) · gate for the CTA's rows.
__device__ __forceinline__ void finish_output(const Mamba2Params& p, const Tile& t, const OutStage& st) {
  __syncthreads();
  const int i = threadIdx.x;
  if (i < PT) {
    const float y = (st.dot[i] + st.extra[i]) * st.gate[i];
    static_cast<act_t*>(p.out)[t.b * p.s_out_b + t.head * p.s_out_h + t.row0 + i] = rssm::from_float<act_t>(y);
  }
}

__device__ __forceinline__ void store_row(const Mamba2Params& p, const Tile& t, int r, const float (&v)[kEpl]) {
  if constexpr (kStored) t.rows.store(r, v, t.flushes, p.seed);
  else rssm::store_vec<state_t, kEpl>(t.state + r * N, v);
}

// store_row of every row of this warp's tile (a stored checkpoint's rows encoded together: CheckpointRows::store_rows).
__device__ __forceinline__ void store_tile_rows(const Mamba2Params& p, const Tile& t,
                                                const float (&v)[kRowsPerWarp][kEpl]) {
  if constexpr (kStored) {
    t.rows.template store_rows<kRowsPerWarp>(0, v, t.flushes, p.seed);
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) store_row(p, t, r, v[r]);
  }
}

// Rows fetched ahead while a stored checkpoint's row loop (not unrolled, or a few rows: every row's write inlined, the
// writes of a whole tile take up to 254 registers) works on one: about 24 registers of fetched bytes (Rows::Fetched).
template <class SrcRows>
constexpr int kFetchWords = int(sizeof(typename SrcRows::template Fetched<kEpl>)) / 4;
template <class SrcRows>
constexpr int fetch_ahead() {  // 24 words' worth, at least 2 rows, at most the warp's
  const int rows = 24 / kFetchWords<SrcRows> < 2 ? 2 : 24 / kFetchWords<SrcRows>;
  return rows < kRowsPerWarp ? rows : kRowsPerWarp;
}
template <class SrcRows>
constexpr int kFetchAhead = fetch_ahead<SrcRows>();

// The first kFetchAhead rows of this warp's rows of `rows`, fetched (a row loop's loads in flight before it starts).
template <class SrcRows>
struct RowsAhead {
  typename SrcRows::template Fetched<kEpl> row[kFetchAhead<SrcRows>];
};

template <class SrcRows>
__device__ __forceinline__ RowsAhead<SrcRows> fetch_first_rows(const SrcRows& rows, int lane) {
  RowsAhead<SrcRows> ahead;
#pragma unroll
  for (int k = 0; k < kFetchAhead<SrcRows>; ++k) ahead.row[k] = rows.template fetch<kEpl>(k, lane);
  return ahead;
}

// f(r, v) for the rows r = 0 .. kRowsPerWarp-1 of `rows` (this warp's rows of a stored checkpoint) in order, v the
// row's values in fp32 (this lane's kEpl columns), with the loads of the next kFetchAhead rows in flight (`ahead`:
// the first ones, fetch_first_rows).
template <int kUnroll = 1, class SrcRows, class F>
__device__ __forceinline__ void for_each_stored_row(const SrcRows& rows, int lane, RowsAhead<SrcRows> ahead, F&& f) {
  constexpr int kAhead = kFetchAhead<SrcRows>;
#pragma unroll kUnroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const typename SrcRows::template Fetched<kEpl> cur = ahead.row[0];
#pragma unroll
    for (int k = 0; k + 1 < kAhead; ++k) ahead.row[k] = ahead.row[k + 1];
    if constexpr (kUnroll > 1)  // past the last row: the last row again, so that the unrolled body has no branch
      ahead.row[kAhead - 1] = rows.template fetch<kEpl>(min(r + kAhead, kRowsPerWarp - 1), lane);
    else if (r + kAhead < kRowsPerWarp)
      ahead.row[kAhead - 1] = rows.template fetch<kEpl>(r + kAhead, lane);
    float v[kEpl];
    rows.decode(cur, v);
    f(r, v);
  }
}

// f(r, v) for this warp's rows r = 0 .. kRowsPerWarp-1 of the tile in registers (`raw`), unrolled, v in fp32.
template <class F>
__device__ __forceinline__ void for_each_raw_row(const RawTile& raw, F&& f) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v[kEpl];
    unpack_row(raw, r, v);
    f(r, v);
  }
}

// A one-step tile's rows in a loop unrolled kStepUnroll times, the master's first rows fetched ahead (the rest by
// the loop), where the whole tile unrolled needs too many registers: dual mode with an NVFP4 read copy and more than
// 10 rows per warp, whose encodes of a whole tile take 212-216 registers (Super, 16 rows, sm_90a; Nano, 20 rows: 254)
// and 2 CTAs per SM, the loop 72-93. Other tiles keep the whole tile in registers, unrolled, where the loop is slower
// (docs/decisions.md, a stored one-step tile's rows in a loop).
constexpr bool kRolledStep = kDual && READ_FMT == rssm::kFmtNvfp4 && kRowsPerWarp > 10;
constexpr int kStepUnroll = 4;
// What a one-step tile's rows come from (single_step_rows): the master's first rows fetched (kRolledStep), else the
// whole tile in registers.
using StepRows = rssm::conditional_t<kRolledStep, RowsAhead<MasterRows>, RawTile>;

template <class Rows_>  // StepRows (a template: the branch not taken is discarded)
__device__ __forceinline__ void load_step_rows(const Tile& t, Rows_& rows) {
  if constexpr (kRolledStep) rows = fetch_first_rows(t.master, t.lane);
  else load_raw(t, rows);
}

// The token's inputs of a one-step tile: loaded (fetch_step_inputs; tile_coords suffice) as this lane's B and C
// columns, the head's biased dt and A and the extras, then finished (finish_step_inputs: Δ and the decay).
struct StepInputs {
  float bv[kEpl], cv[kEpl];
  float dt, a, delta, decay;
  Extras extras;
};

__device__ __forceinline__ void fetch_step_inputs(const Mamba2Params& p, const Tile& t, StepInputs& in) {
  rssm::load_vec<act_t, kEpl>(group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group) + t.lane * kEpl, in.bv);
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, in.cv);
  in.dt = biased_dt(p, t.b, t.head);
  in.a = p.A[t.head];
  in.extras = load_extras(p, t);
}

__device__ __forceinline__ void finish_step_inputs(const Mamba2Params& p, StepInputs& in) {
  in.delta = delta_of(p, in.dt);
  in.decay = __expf(decay_exponent(in.a, in.delta));
}

// One recurrence step on the tile (the baseline update) with the token's inputs `in`: S = exp(A Δ) S + Δ x Bᵀ,
// stored; S·C staged. With kSkipRepeats, returns false, with zero outputs and nothing stored, for a row that is
// `skipped` or repeats an earlier row's slot (`first_id`: repeats_earlier_row). Every thread of the CTA calls it (it
// synchronises).
template <bool kSkipRepeats, class Rows_>  // Rows_: StepRows
__device__ __forceinline__ bool single_step_rows(const Mamba2Params& p, const Tile& t, const Rows_& rows,
                                                 const StepInputs& in, OutStage& st, int first_id, bool skipped) {
  const auto& bv = in.bv;
  const auto& cv = in.cv;
  const float delta = in.delta, decay = in.decay;
  stage_extras(p, in.extras, st);
  __syncthreads();  // st.x ready
  if (kSkipRepeats && (skipped || repeats_earlier_row(p, t, first_id))) {
    zero_pad_output(p, t.b, t.head, t.row0);
    return false;
  }
  auto step = [&](int r, float (&v)[kEpl]) {
    const float u = delta * st.x[t.warp * kRowsPerWarp + r];
#pragma unroll
    for (int e = 0; e < kEpl; ++e) v[e] = fmaf(decay, v[e], u * bv[e]);
  };
  if constexpr (kRolledStep) {
    for_each_stored_row<kStepUnroll>(t.master, t.lane, rows, [&](int r, float (&v)[kEpl]) {
      step(r, v);
      store_row(p, t, r, v);
      stage_row_dot(t, r, v, cv, st);
    });
  } else {  // the whole tile in registers: its rows' encodes and dots reduce together
    float v[kRowsPerWarp][kEpl];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      unpack_row(rows, r, v[r]);
      step(r, v[r]);
    }
    stage_tile_dots(t, v, cv, st);
    store_tile_rows(p, t, v);
  }
  return true;
}

// The first rows of `rows` a stored row loop starts from: the master's rows the flush kernel fetched first
// (load_step_rows), else fetched here.
__device__ __forceinline__ const RowsAhead<MasterRows>& first_rows(const RowsAhead<MasterRows>& fetched,
                                                                  const MasterRows&, int) {
  return fetched;
}
template <class Raw, class SrcRows>
__device__ __forceinline__ RowsAhead<SrcRows> first_rows(const Raw&, const SrcRows& rows, int lane) {
  return fetch_first_rows(rows, lane);
}

// f(r, v) for this warp's checkpoint rows in fp32: from the registers (`raw`: RawTile) for a plain checkpoint
// (unrolled), else fetched ahead and decoded from `rows` (the master, or dual mode's read copy), from the master's
// first rows already fetched where `raw` holds them (the flush kernel's StepRows).
template <class Raw, class SrcRows, class F>
__device__ __forceinline__ void for_each_checkpoint_row(const Tile& t, const Raw& raw, const SrcRows& rows, F&& f) {
  if constexpr (kStored) for_each_stored_row(rows, t.lane, first_rows(raw, rows, t.lane), f);
  else for_each_raw_row(raw, f);
}

// Fold of staged entries 0..w (ring entries j < w, then the current token): S = decay S + Σ_j xs_j B_jᵀ with B_j
// the rows of `s_B` and xs_j = s_j x_j the rows of `s_xs` (the tile's rows); stores S and stages S·C (`cv`: this
// lane's C). The caller has staged the extras (stage_extras) and synchronised after writing the staged rows.
template <class Raw>  // RawTile or StepRows
__device__ __forceinline__ void fold_staged_rows(const Mamba2Params& p, const Tile& t, const Raw& raw,
                                                 const float (&cv)[kEpl], const act_t (*s_B)[N],
                                                 const float (*s_xs)[PT], float decay, int w, OutStage& st) {
  for_each_checkpoint_row(t, raw, t.master, [&](int r, float (&v)[kEpl]) {
#pragma unroll
    for (int e = 0; e < kEpl; ++e) v[e] *= decay;
    for (int j = 0; j <= w; ++j) {
      const float xs = s_xs[j][t.warp * kRowsPerWarp + r];
      float bv[kEpl];
      rssm::load_vec<act_t, kEpl>(&s_B[j][t.lane * kEpl], bv);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) v[e] = fmaf(xs, bv[e], v[e]);
    }
    store_row(p, t, r, v);
    stage_row_dot(t, r, v, cv, st);
  });
}

// The checkpoint rows' S·C (`cv`: this lane's C, scaled by the caller) staged per row without a fold: a one-launch
// replay's non-flush step (`rows`: dual mode's read copy, else the master).
template <class SrcRows>
__device__ __forceinline__ void stage_checkpoint_dots(const Tile& t, const RawTile& raw, const float (&cv)[kEpl],
                                                      OutStage& st, const SrcRows& rows) {
  if constexpr (kStored) {
    for_each_checkpoint_row(t, raw, rows, [&](int r, float (&v)[kEpl]) { stage_row_dot(t, r, v, cv, st); });
  } else {  // the tile in registers: the rows' dots reduce together
    float v[kRowsPerWarp][kEpl];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) unpack_row(raw, r, v[r]);
    stage_tile_dots(t, v, cv, st);
  }
}

// fold_staged_rows of ring entries 0..w-1 plus the current token (entry w), staged from global memory here (the flush
// kernel). `s` holds s_0..s_w (shared or global). Every thread of the CTA calls it (it synchronises).
template <class Raw>  // RawTile or StepRows
__device__ __forceinline__ void fold_rows(const Mamba2Params& p, const Tile& t, const Raw& raw, const float* s,
                                          float decay, int w, OutStage& st) {
  __shared__ __align__(16) act_t s_B[rssm::kMaxL][N];
  __shared__ __align__(16) float s_xs[rssm::kMaxL][PT];
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group;
  const act_t* x_ring = static_cast<const act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head;
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group);
  const act_t* x_cur = x_of(p, t);
  for (int i = threadIdx.x; i < (w + 1) * N; i += rssm::kThreads) {
    const int j = i / N, n = i % N;
    s_B[j][n] = j < w ? B_ring[(long long)j * N + n] : B_cur[n];
  }
  for (int i = threadIdx.x; i < (w + 1) * PT; i += rssm::kThreads) {
    const int j = i / PT, row = t.row0 + i % PT;
    s_xs[j][i % PT] = s[j] * rssm::to_float(j < w ? x_ring[(long long)j * P + row] : x_cur[row]);
  }
  float cv[kEpl];
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  stage_extras(p, t, st);
  __syncthreads();
  fold_staged_rows(p, t, raw, cv, s_B, s_xs, decay, w, st);
}

// Warp-collective: weights of ring entries 0..w (lane j) for one head; returns s_lane, sets decay on every lane.
__device__ __forceinline__ float decay_weights(float delta_lane, float a, float& decay) {
  const float incl = rssm::warp_suffix_sum(delta_lane);                 // Σ_{i>=lane} Δ_i
  const float excl = __shfl_down_sync(0xffffffffu, incl, 1);            // Σ_{i>lane} Δ_i (lane 31: own, fixed below)
  decay = __expf(decay_exponent(a, __shfl_sync(0xffffffffu, incl, 0)));
  const int lane = threadIdx.x % rssm::kWarpSize;
  return delta_lane * __expf(decay_exponent(a, lane == rssm::kWarpSize - 1 ? 0.f : excl));
}

// Warp-collective (one warp): the fold weights s_0..s_w of entries 0..w (lane j's Δ in `d`) and the decay into
// shared memory.
__device__ __forceinline__ void stage_fold_weights(float d, float a, int w, int lane, float* s_w, float& s_decay) {
  float decay;
  const float s = decay_weights(d, a, decay);
  if (lane <= w) s_w[lane] = s;
  if (lane == 0) s_decay = decay;
}

// A state kernel's start (the baseline, flush, one-launch replay and one-launch verify kernels;
// rssm::wait_previous_grid): where the plan says so (p.l2_hints), L2 hints for the guessed slot (rssm::guessed_slot),
// each warp's checkpoint rows (a one-launch replay in dual mode: the read copy's too), with kCursor the cursor, with
// kRing the ring records the one-launch kernels stage (B of the group by warp 1, Δ by warp 2, the tile's x rows by
// warp 3); then the wait for the kernel before.
template <bool kCursor, bool kRing>
__device__ __forceinline__ void begin_state_kernel(const Mamba2Params& p) {
  const int slot = p.l2_hints ? rssm::guessed_slot(p.slot_idx, blockIdx.z, p.pad_slot_id, p.slots) : p.pad_slot_id;
  if (slot != p.pad_slot_id) {
    const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
    const int head = blockIdx.y, row0 = blockIdx.x * PT;
    master_rows(p, slot, head, row0 + warp * kRowsPerWarp).prefetch_l2(kRowsPerWarp);
    if constexpr (kRing && kDual) read_rows(p, slot, head, row0 + warp * kRowsPerWarp).prefetch_l2(kRowsPerWarp);
    if (kCursor && threadIdx.x == 0) rssm::prefetch_line_l2(p.cursor + slot);
    if constexpr (kRing) {
      const int n = p.L - 1, group = head / (p.nheads / p.ngroups);
      if (warp == 1)
        rssm::prefetch_l2(static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + group * p.s_Br_group,
                          n * N * int(sizeof(act_t)));
      if (warp == 2) rssm::prefetch_l2(p.dt_ring + slot * p.s_dtr_slot + head * p.s_dtr_head, n * 4);
      if (warp == 3 && lane < n)
        rssm::prefetch_line_l2(x_ring_at(p, slot, head) + (long long)lane * P + row0);
    }
  }
  rssm::wait_previous_grid();
}

}  // namespace

#if PT <= P  // the state kernels (a tile within one head); a module with PT > P holds the replay kernels only
// Baseline: S = exp(A Δ) S + Δ x Bᵀ ; y = S C + D x (⊙ silu z). Reads and writes the whole state every step.
// Repeated slot ids are not detected here (the rows race on their slot, within it): the per-CTA scan of the batch's
// ids cost up to 18% at batch 256 (docs/decisions.md, rows a step skips).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kStateMinBlocks)
    mamba2_state_update_kernel(const Mamba2Params p) {
  begin_state_kernel<false, false>(p);
  Tile t;
  if (!setup_tile(p, t)) return;
  StepRows rows;
  load_step_rows(t, rows);
  StepInputs in;
  fetch_step_inputs(p, t, in);
  finish_step_inputs(p, in);
  __shared__ OutStage st;
  single_step_rows<false>(p, t, rows, in, st, 0, false);
  finish_output(p, t, st);
}

// Adaptive small-batch mode: every row flushes. With an empty ring (the steady state) this is the baseline step;
// a row that still holds ring entries (after a switch from replay) folds them first and resets its cursor.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kStateMinBlocks)
    mamba2_flush_decode_kernel(const Mamba2Params p) {
  begin_state_kernel<true, false>(p);
  // The token's inputs load before the slot id and their arithmetic (whose branches wait for them) follows the state
  // loads, so that the inputs are in flight with the slot id, not behind the cursor read (docs/decisions.md).
  Tile t;
  tile_coords(p, t);
  StepInputs in;
  fetch_step_inputs(p, t, in);
  if (!locate_slot(p, t)) return;
  StepRows rows;
  load_step_rows(t, rows);
  finish_step_inputs(p, in);
  // rssm::row_slot: a row with a cursor outside the ring is computed like one with an empty ring (every read in its
  // slot) and skipped before the first write, so that no branch separates the state loads from the input loads.
  const int cursor = p.cursor[t.slot];
  const bool bad_cursor = !rssm::cursor_in_ring(cursor, p.L);
  const int w = bad_cursor ? 0 : cursor;
  const int first_id = rssm::preload_row_id(p.slot_idx, t.b, t.lane);
  __shared__ OutStage st;
  if (w == 0 && !SR) {  // a stochastically rounded write counts the slot's flushes in the fold's arrival below
    if (!single_step_rows<true>(p, t, rows, in, st, first_id, bad_cursor)) return;
  } else {
    __shared__ float s_w[rssm::kMaxL];
    __shared__ float s_decay;
    if (t.warp == 0) {
      const float* dt_ring = p.dt_ring + t.slot * p.s_dtr_slot + t.head * p.s_dtr_head;
      stage_fold_weights(t.lane < w ? dt_ring[t.lane] : (t.lane == w ? in.delta : 0.f),
                         p.A[t.head], w, t.lane, s_w, s_decay);
    }
    __syncthreads();
    if (bad_cursor || repeats_earlier_row(p, t, first_id)) {
      zero_pad_output(p, t.b, t.head, t.row0);
      return;
    }
    const int arrived_before = threadIdx.x == 0 ? rssm::cta_arrival(p.arrive, t.slot) : -1;
    fold_rows(p, t, rows, s_w, s_decay, w, st);
    if (threadIdx.x == 0)  // the arrival's answer after the fold (rssm::cta_arrival)
      rssm::advance_if_last(arrived_before, p.cursor, p.arrive, t.slot, gridDim.x * p.nheads, 0,
                            SR ? p.flushes : nullptr);
  }
  finish_output(p, t, st);
}

// Small-batch replay in one launch. A non-flush step does not fold: y = decay S0·C + Σ_{j<=w} s_j (B_j·C) x_j + D x
// from the checkpoint rows and one coefficient per entry, then it appends the token's records (x of its rows; Δ and
// B once per head / group) and stores nothing. A flush (w = L - 1) folds the ring and the token into the loaded rows
// (fold_staged_rows) and stores the state. The prep and main kernels' ring form. The ring records at every position
// a step can read (j < L - 1: B of the group, x of the tile's rows, Δ of the head) are copied to shared memory
// without waiting for the cursor, so they travel with the state loads.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kFusedMinBlocks)
    mamba2_fused_decode_kernel(const Mamba2Params p) {
  __shared__ __align__(16) act_t s_B[rssm::kMaxL][N];
  __shared__ __align__(16) act_t s_x[rssm::kMaxL][PT];
  __shared__ __align__(16) float s_xs[rssm::kMaxL][PT];
  __shared__ float s_dt[rssm::kMaxL];
  __shared__ float s_w[rssm::kMaxL];
  __shared__ float s_decay;
  __shared__ OutStage st;
  begin_state_kernel<true, true>(p);
  Tile t;
  if (!setup_tile(p, t)) return;
  RawTile raw;
  if constexpr (!kStored) load_raw(t, raw);  // (a stored checkpoint's rows are decoded in the fold)
  const int n = p.L - 1;  // ring positions a fold can read
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group;
  static_assert(N * sizeof(act_t) % 16 == 0, "a B row is a whole number of 16-byte chunks");
  if ((reinterpret_cast<unsigned long long>(B_ring) & 15) == 0) {
    for (int i = threadIdx.x; i < n * N * int(sizeof(act_t)) / 16; i += rssm::kThreads)
      rssm::cp_async16(reinterpret_cast<uint4*>(&s_B[0][0]) + i, reinterpret_cast<const uint4*>(B_ring) + i);
  } else {
    for (int i = threadIdx.x; i < n * N * int(sizeof(act_t)) / 4; i += rssm::kThreads)
      rssm::cp_async4(reinterpret_cast<unsigned*>(&s_B[0][0]) + i, reinterpret_cast<const unsigned*>(B_ring) + i);
  }
  constexpr int kRowWords = PT * int(sizeof(act_t)) / 4;
  static_assert(PT * sizeof(act_t) % 4 == 0, "x rows move by 4-byte async copies");
  const act_t* x_ring = x_ring_at(p, t.slot, t.head) + t.row0;
  for (int i = threadIdx.x; i < n * kRowWords; i += rssm::kThreads) {
    const int j = i / kRowWords, word = i % kRowWords;
    rssm::cp_async4(reinterpret_cast<unsigned*>(&s_x[j][0]) + word,
                    reinterpret_cast<const unsigned*>(x_ring + (long long)j * P) + word);
  }
  const float* dt_ring = p.dt_ring + t.slot * p.s_dtr_slot + t.head * p.s_dtr_head;
  for (int i = threadIdx.x; i < n; i += rssm::kThreads) rssm::cp_async4(&s_dt[i], dt_ring + i);
  rssm::cp_async_commit();

  const int cursor = p.cursor[t.slot];
  const bool bad_cursor = !rssm::cursor_in_ring(cursor, p.L);
  const int w = bad_cursor ? 0 : cursor;
  const bool flush = w >= p.L - 1;
  const int first_id = rssm::preload_row_id(p.slot_idx, t.b, t.lane);
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group);
  const act_t* x_cur = x_of(p, t);
  const float delta_w = t.warp == 0 ? current_delta(p, t.b, t.head) : 0.f;
  constexpr int kBPerThread = (N + rssm::kThreads - 1) / rssm::kThreads;
  act_t b_cur[kBPerThread];  // the token's B, element threadIdx.x + k kThreads
#pragma unroll
  for (int k = 0; k < kBPerThread; ++k) {
    const int e = threadIdx.x + k * rssm::kThreads;
    if (e < N) b_cur[k] = B_cur[e];
  }
  float cv[kEpl];
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  stage_extras(p, t, st);
  rssm::cp_async_wait_all();
  __syncthreads();  // the staged ring has landed; every thread has read the cursor
#pragma unroll
  for (int k = 0; k < kBPerThread; ++k) {  // entry w of the fold: the token (after the staged ring row w)
    const int e = threadIdx.x + k * rssm::kThreads;
    if (e < N) s_B[w][e] = b_cur[k];
  }
  if (t.warp == 0)
    stage_fold_weights(t.lane < w ? s_dt[t.lane] : (t.lane == w ? delta_w : 0.f), p.A[t.head], w, t.lane, s_w, s_decay);
  __syncthreads();
  if (bad_cursor || repeats_earlier_row(p, t, first_id)) {
    zero_pad_output(p, t.b, t.head, t.row0);
    return;
  }
  const int arrived_before = threadIdx.x == 0 ? rssm::cta_arrival(p.arrive, t.slot) : -1;  // answered at the end
  if (flush) {
    for (int i = threadIdx.x; i < (w + 1) * PT; i += rssm::kThreads) {
      const int j = i / PT, r = i % PT;
      s_xs[j][r] = s_w[j] * (j < w ? rssm::to_float(s_x[j][r]) : st.x[r]);
    }
    __syncthreads();
    fold_staged_rows(p, t, raw, cv, s_B, s_xs, s_decay, w, st);
  } else {  // no fold: y = decay S0·C + Σ_{j<=w} c_j x_j + D x with c_j = s_j B_j·C (the warps take every 4th entry)
    __shared__ float s_c[rssm::kMaxL];
    for (int j = t.warp; j <= w; j += rssm::kNumWarps) {
      float bv[kEpl];
      rssm::load_vec<act_t, kEpl>(&s_B[j][t.lane * kEpl], bv);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(bv[e], cv[e], dot);
      dot = rssm::warp_sum(dot);
      if (t.lane == 0) s_c[j] = s_w[j] * dot;
    }
    float cvd[kEpl];
#pragma unroll
    for (int e = 0; e < kEpl; ++e) cvd[e] = s_decay * cv[e];
    if constexpr (kDual)
      stage_checkpoint_dots(t, raw, cvd, st, nonflush_rows(p, t.slot, t.head, t.row0 + t.warp * kRowsPerWarp));
    else
      stage_checkpoint_dots(t, raw, cvd, st, t.master);
    __syncthreads();  // every entry's c_j
    const int i = threadIdx.x;
    if (i < PT) {
      float ring = s_c[w] * st.x[i];
      for (int j = 0; j < w; ++j) ring = fmaf(s_c[j], rssm::to_float(s_x[j][i]), ring);
      st.extra[i] += ring;  // (this thread staged it)
    }
  }
  if (!flush) {  // the token's records at ring position w
    const int i = threadIdx.x;
    if (i < PT)
      static_cast<act_t*>(p.x_ring)[t.slot * p.s_xr_slot + t.head * p.s_xr_head + (long long)w * P + t.row0 + i] =
          x_cur[t.row0 + i];
    if (blockIdx.x == 0) {
      if (i == 0) p.dt_ring[t.slot * p.s_dtr_slot + t.head * p.s_dtr_head + w] = delta_w;
      if (t.head % (p.nheads / p.ngroups) == 0) {  // one B record per group
        act_t* B_dst = static_cast<act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group + (long long)w * N;
        for (int e = i; e < N; e += rssm::kThreads) B_dst[e] = B_cur[e];
      }
    }
  }
  finish_output(p, t, st);
  if (threadIdx.x == 0)
    rssm::advance_if_last(arrived_before, p.cursor, p.arrive, t.slot, gridDim.x * p.nheads, flush ? 0 : w + 1,
                          SR && flush ? p.flushes : nullptr);
}

#endif

#if PT <= P && MASTER_FMT == 0 && READ_FMT == 0 && !SR  // speculative decoding: plain checkpoints
namespace {

// A verify's per-head record of weights in the scratch (p.coef rows, VerifyCoef::floats(R) per head), written by
// the prep kernel: first a folding verify's history weights s_j and decay, then token t's weights w[t][l] =
// s_{t,l} B_l · C_t of the records it sees from `base` (l < R) and its checkpoint decay, each [R + 1] with the decay
// at R: a window of T tokens uses the first (1 + T)(R + 1) floats (core/layouts.py verify_coef_floats mirrors it).
struct VerifyCoef {
  __host__ __device__ static constexpr int floats(int ring_len) { return (1 + rssm::kMaxWindow) * (ring_len + 1); }
  __host__ __device__ static constexpr int used(int ring_len, int window) { return (1 + window) * (ring_len + 1); }
  template <class F>
  __device__ static F* fold(F* c, int ring_len) { return c; }
  template <class F>
  __device__ static F* w(F* c, int ring_len, int tok) { return c + (1 + tok) * (ring_len + 1); }
};

constexpr int kVerifyRawBytes = 192;  // per thread; core/ops/mamba2_spec.py VERIFY_RAW_BYTES
// The grid kernel's row tiles the planner takes: the rows and the C columns of 4 tokens load ahead. Other tiles (a
// forced rows_per_cta) get a minimum of one CTA per SM for windows of 2 too, else ptxas spills on sm_100a / sm_103a.
constexpr bool kGridPlannedTile =
    kRowsPerWarp * kEpl * int(sizeof(state_t)) + 4 * kEpl * int(sizeof(float)) <= kVerifyRawBytes;
constexpr int kGridT2MinBlocks = kGridPlannedTile ? 0 : 1;

// Lane l's Δ of head h for a verify of row b from the history `cur` of slot `slot`: record l (history l < count,
// window token l - count), 0 past the window.
__device__ __forceinline__ float record_delta(const Mamba2Params& p, int slot, int b, int h, rssm::SpecCursor cur,
                                              int lane) {
  const float* dt_ring = p.dt_ring + slot * p.s_dtr_slot + h * p.s_dtr_head;
  const int count = cur.count;
  return lane < count ? dt_ring[cur.position(lane, p.L)]
                      : lane < count + p.window ? current_delta(p, b, h, lane - count) : 0.f;
}

// Heads a verify prep warp loads Δ and A of at once.
constexpr int kHeadsAhead = 4;

// Lane l's Δ (record_delta) and the A of this warp's heads first + i kNumWarps (i < kHeadsAhead) of the group's
// `heads` heads starting at head0 (0 past them).
__device__ __forceinline__ void load_head_deltas(const Mamba2Params& p, int slot, int b, int head0, int first,
                                                 int heads, rssm::SpecCursor cur, int lane, float (&d)[kHeadsAhead],
                                                 float (&a)[kHeadsAhead]) {
#pragma unroll
  for (int i = 0; i < kHeadsAhead; ++i) {
    const int hh = first + i * rssm::kNumWarps;
    d[i] = hh < heads ? record_delta(p, slot, b, head0 + hh, cur, lane) : 0.f;
    a[i] = hh < heads ? p.A[head0 + hh] : 0.f;
  }
}

// Warp-collective: head h's verify weights (VerifyCoef, ring length R) into `coef` from lane l's Δ `d` of record l
// (record_delta) and the products bc[tok * kMaxL + j] = B_j · C_tok of the records base .. count + T - 1; a folding
// verify's history weights first.
__device__ __forceinline__ void head_verify_weights(float d, float a, int count, int base, bool fold, int T, int R,
                                                    const float* bc, float* coef) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  if (fold) {
    float decay;
    const float s = decay_weights(lane < count ? d : 0.f, a, decay);
    float* f = VerifyCoef::fold(coef, R);
    if (lane < count) f[lane] = s;
    if (lane == 0) f[R] = decay;
  }
  for (int tok = 0; tok < T; ++tok) {  // token tok sees records base .. count + tok: lane l holds record base + l
    const int seen = count + tok + 1 - base;
    const float dl = __shfl_sync(0xffffffffu, d, (base + lane) % rssm::kWarpSize);
    float decay;
    const float s = decay_weights(lane < seen ? dl : 0.f, a, decay);
    float* w = VerifyCoef::w(coef, R, tok);
    if (lane < seen) w[lane] = s * bc[tok * rssm::kMaxL + base + lane];
    if (lane == 0) w[R] = decay;
  }
}

// Lane `lane`'s kEpl columns of a row, loaded raw, into that row of a shared float matrix.
__device__ __forceinline__ void store_lane_columns(const rssm::RawVecOf<act_t, kEpl>& raw, float (&row)[N], int lane) {
  float v[kEpl];
  rssm::unpack(raw, v);
#pragma unroll
  for (int e = 0; e < kEpl; ++e) row[lane * kEpl + e] = v[e];
}

}  // namespace

// Verify step 1, grid (batch, ngroups), 128 threads: per (row, group) the products B_j · C_t of every record the
// window sees with every window token, per head the weights (VerifyCoef) into the per-row scratch; appends the
// window's Δ (per head) and B (per group) records after the history; records the row's cursor word in p.step (the
// main kernel's copy: rssm::kSkipStep for a row it skips); the last group of a folding row moves the cursor past the
// history. Reads history records only where no launch of the step writes. Lets the persistent verify kernel launch
// once the previous grid has finished (rssm::prep_begin).
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_verify_prep_kernel(const Mamba2Params p) {
  rssm::prep_begin(p.step - 1);
  __shared__ float s_B[rssm::kMaxL][N];
  __shared__ float s_C[rssm::kMaxWindow][N];
  __shared__ float s_bc[rssm::kMaxWindow][rssm::kMaxL];
  const int b = blockIdx.x, g = blockIdx.y, T = p.window, R = p.L;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int word = p.cursor[slot];
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const bool bad = word < 0 || !cur.valid(T, R);
  if (__syncthreads_or(bad || rssm::earlier_row_has(p.slot_idx, b, slot, threadIdx.x, blockDim.x,
                                                    rssm::preload_row_id(p.slot_idx, b, threadIdx.x)))) {
    if (threadIdx.x == 0 && g == 0) p.step[b] = rssm::kSkipStep;
    return;
  }
  const int count = cur.count, n = count + T;
  const bool fold = cur.folds_before(T, R);
  const int base = fold ? count : 0;
  const rssm::SpecCursor after{fold ? cur.position(count, R) : cur.origin, fold ? 0 : count};
  const int heads_per_group = p.nheads / p.ngroups;
  // Every load of the prep is issued before the first result is used: the first kHeadsAhead heads' Δ and A of this
  // warp, the records base .. n-1 (the history before base is folded) and the window's C rows, kRecordsPerWarp a warp.
  float d[kHeadsAhead], a[kHeadsAhead];
  load_head_deltas(p, slot, b, g * heads_per_group, warp, heads_per_group, cur, lane, d, a);
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  constexpr int kRecordsPerWarp = rssm::kMaxL / rssm::kNumWarps, kTokensPerWarp = rssm::kMaxWindow / rssm::kNumWarps;
  rssm::RawVecOf<act_t, kEpl> vb[kRecordsPerWarp], vc[kTokensPerWarp];
#pragma unroll
  for (int i = 0; i < kRecordsPerWarp; ++i) {
    const int j = warp + i * rssm::kNumWarps, tok = j - count;
    if (j >= base && j < n)
      rssm::load_raw<act_t, kEpl>((tok < 0 ? B_ring + (long long)cur.position(j, R) * N
                                            : group_vec(p.B, p.s_B_b, p.s_B_g, b, g) + tok * p.s_B_t) + lane * kEpl,
                                  vb[i]);
  }
#pragma unroll
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const int tok = warp + i * rssm::kNumWarps;
    if (tok < T) rssm::load_raw<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, b, g) + tok * p.s_C_t + lane * kEpl, vc[i]);
  }
#pragma unroll
  for (int i = 0; i < kRecordsPerWarp; ++i) {
    const int j = warp + i * rssm::kNumWarps;
    if (j >= base && j < n) store_lane_columns(vb[i], s_B[j], lane);
  }
#pragma unroll
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const int tok = warp + i * rssm::kNumWarps;
    if (tok < T) store_lane_columns(vc[i], s_C[tok], lane);
  }
  __syncthreads();
  for (int j = base + warp; j < n; j += rssm::kNumWarps) {  // B_j · C_t, a warp per record
    float part[rssm::kMaxWindow];
#pragma unroll
    for (int tok = 0; tok < rssm::kMaxWindow; ++tok) {
      part[tok] = 0.f;
      if (tok < T)
#pragma unroll
        for (int e = 0; e < kEpl; ++e) part[tok] = fmaf(s_B[j][lane * kEpl + e], s_C[tok][lane * kEpl + e], part[tok]);
    }
    const float bc = rssm::warp_sum_scatter<rssm::kMaxWindow>(part);
    if (lane < T) s_bc[lane][j] = bc;
  }
  __syncthreads();
  for (int hh0 = warp; hh0 < heads_per_group; hh0 += kHeadsAhead * rssm::kNumWarps) {  // a warp per head
    if (hh0 != warp) load_head_deltas(p, slot, b, g * heads_per_group, hh0, heads_per_group, cur, lane, d, a);
#pragma unroll
    for (int i = 0; i < kHeadsAhead; ++i) {
      const int h = g * heads_per_group + hh0 + i * rssm::kNumWarps;
      if (hh0 + i * rssm::kNumWarps >= heads_per_group) break;
      head_verify_weights(d[i], a[i], count, base, fold, T, R, &s_bc[0][0],
                          p.coef + b * p.s_coef_row + (long long)h * VerifyCoef::floats(R));
      if (lane >= count && lane < n) p.dt_ring[slot * p.s_dtr_slot + h * p.s_dtr_head +
                                               after.position(after.count + lane - count, R)] = d[i];
    }
  }
  act_t* B_dst = static_cast<act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  for (int i = threadIdx.x; i < T * N; i += rssm::kThreads) {
    const int tok = i / N;
    B_dst[(long long)after.position(after.count + tok, R) * N + i % N] = rssm::from_float<act_t>(s_B[count + tok][i % N]);
  }
  if (threadIdx.x == 0) {
    if (g == 0) p.step[b] = word;
    if (fold) rssm::arrive_and_advance(p.cursor, p.arrive, slot, p.ngroups, after.word());
  }
}

namespace {

// This lane's partial dots of `v` (its kEpl columns) with each of the kT window tokens' C columns `cv`.
template <int kT>
__device__ __forceinline__ void token_partials(const float (&v)[kEpl], const float (&cv)[kT][kEpl],
                                               float (&part)[kT]) {
#pragma unroll
  for (int tok = 0; tok < kT; ++tok) {
    part[tok] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) part[tok] = fmaf(v[e], cv[tok][e], part[tok]);
  }
}

// Verify step 2 at small batch for windows of at most kT tokens, grid (P / PT, nheads, batch): y_t = decay_t (S · C_t) +
// Σ_l w[t][l] x_{base + l} + D x_t over the records token t sees, S the checkpoint or (a folding verify) the
// history folded into it, stored by this CTA for its rows. The row's cursor word and the head's weights come from
// the prep kernel (p.step, p.coef). kOneLaunch: the whole verify in this launch, no prep kernel; each CTA reads the
// cursor word, skips the rows the prep kernel would, and takes its head's weights itself (B · C of its group's records,
// head_verify_weights); the first row tile of each head appends the window's Δ records, of each group's first head
// its B records, and the last CTA of a folding row moves the cursor past the history (rssm::arrive_and_advance).
template <int kT, bool kOneLaunch>
__device__ __forceinline__ void verify_rows(const Mamba2Params& p) {
  if constexpr (kOneLaunch) begin_state_kernel<true, true>(p);
  Tile t;
  if (!setup_tile(p, t)) return;
  int word = kOneLaunch ? p.cursor[t.slot] : p.step[t.b];
  const int first_id = kOneLaunch ? rssm::preload_row_id(p.slot_idx, t.b, t.lane) : 0;
  // The tile's rows load first, in flight while the inputs load, where they and the C columns take at most 48
  // registers (the tiles the planner takes for T <= 4: core/ops/mamba2_spec.py), else each where it is used.
  constexpr bool kPreload = sizeof(RawTile) + sizeof(float) * kT * kEpl <= kVerifyRawBytes;
  RawTile raw;
  if constexpr (kPreload) load_raw(t, raw);
  else (void)raw;
  if constexpr (kOneLaunch) {  // the prep kernel's skip rule, the same answer in every warp of every CTA of the row
    if (word < 0 || !rssm::SpecCursor::of(word).valid(p.window, p.L) || repeats_earlier_row(p, t, first_id))
      word = rssm::kSkipStep;
  }
  if (word == rssm::kSkipStep) {
    zero_pad_output(p, t.b, t.head, t.row0);
    return;
  }
  const int T = p.window, R = p.L;
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const int count = cur.count, n = count + T;
  const bool fold = cur.folds_before(T, R);
  const int base = fold ? count : 0;
  __shared__ float s_x[rssm::kMaxL][PT];
  __shared__ float s_dot[kT][PT];
  __shared__ float s_coef[VerifyCoef::floats(rssm::kMaxL)];
  __shared__ __align__(16) act_t s_B[rssm::kMaxL][N];  // history records (a folding verify; one launch: always)
  // One launch, warp 0: lane l's Δ of record l (record_delta), loaded with the other inputs.
  const float d_head = kOneLaunch && t.warp == 0 ? record_delta(p, t.slot, t.b, t.head, cur, t.lane) : 0.f;
  const act_t* x_ring = x_ring_at(p, t.slot, t.head) + t.row0;
  for (int i = threadIdx.x; i < n * PT; i += rssm::kThreads) {
    const int j = i / PT, r = i % PT;
    const act_t* src = j < count ? x_ring + (long long)cur.position(j, R) * P : x_of(p, t) + (j - count) * p.s_x_t + t.row0;
    s_x[j][r] = rssm::to_float(src[r]);
  }
  if constexpr (!kOneLaunch) {
    const float* coef = p.coef + t.b * p.s_coef_row + (long long)t.head * VerifyCoef::floats(R);
    for (int i = threadIdx.x; i < VerifyCoef::floats(R); i += rssm::kThreads) s_coef[i] = coef[i];
  }
  float cv[kT][kEpl];  // this lane's columns of every window token's C (tokens >= T: zeros)
#pragma unroll
  for (int tok = 0; tok < kT; ++tok) {
    if (tok < T) {
      rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + tok * p.s_C_t + t.lane * kEpl,
                                  cv[tok]);
    } else {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) cv[tok][e] = 0.f;
    }
  }
  if (fold || kOneLaunch) {  // the history records' B (one launch: for its B · C products too)
    const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group;
    for (int j = t.warp; j < count; j += rssm::kNumWarps) {
      using BVec = rssm::VecTraits<act_t, kEpl>;
      const auto* src = reinterpret_cast<const typename BVec::Raw*>(B_ring + (long long)cur.position(j, R) * N);
      auto* dst = reinterpret_cast<typename BVec::Raw*>(&s_B[j][0]);
#pragma unroll
      for (int q = 0; q < BVec::kChunks; ++q) dst[t.lane * BVec::kChunks + q] = src[t.lane * BVec::kChunks + q];
    }
  }
  __syncthreads();
  if constexpr (kOneLaunch) {
    __shared__ float s_bc[kT][rssm::kMaxL];
    for (int j = base + t.warp; j < n; j += rssm::kNumWarps) {  // B_j · C_t, a warp per record the window sees
      float bv[kEpl];
      if (j < count) rssm::load_vec<act_t, kEpl>(&s_B[j][t.lane * kEpl], bv);
      else rssm::load_vec<act_t, kEpl>(group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group) + (j - count) * p.s_B_t +
                                       t.lane * kEpl, bv);
      float part[kT];
      token_partials(bv, cv, part);
      const float bc = rssm::warp_sum_scatter<kT>(part);  // lane tok: token tok's
      if (t.lane < T) s_bc[t.lane][j] = bc;
    }
    __syncthreads();
    if (t.warp == 0) {
      head_verify_weights(d_head, p.A[t.head], count, base, fold, T, R, &s_bc[0][0], s_coef);
    }
    __syncthreads();
  }
  const float* fold_w = VerifyCoef::fold(s_coef, R);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {  // unrolled: the raw tile stays in registers
    const int row = t.warp * kRowsPerWarp + r;
    float v[kEpl];
    if constexpr (kPreload) unpack_row(raw, r, v);
    else rssm::load_vec<state_t, kEpl>(t.state + r * N, v);
    if (fold) {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) v[e] *= fold_w[R];
      for (int j = 0; j < count; ++j) {
        const float xs = fold_w[j] * s_x[j][row];
        float bv[kEpl];
        rssm::load_vec<act_t, kEpl>(&s_B[j][t.lane * kEpl], bv);
#pragma unroll
        for (int e = 0; e < kEpl; ++e) v[e] = fmaf(xs, bv[e], v[e]);
      }
      store_row(p, t, r, v);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) v[e] = rssm::round_through<state_t>(v[e]);
    }
    float part[kT];
    token_partials(v, cv, part);
    float dot = 0.f;  // lane tok: token tok's (a transposed reduction, warp_sum_scatter, spills here)
#pragma unroll
    for (int tok = 0; tok < kT; ++tok) {
      const float sum = rssm::warp_sum(part[tok]);
      if (t.lane == tok) dot = sum;
    }
    if (t.lane < kT) s_dot[t.lane][row] = dot;
  }
  __syncthreads();
  // Outputs and the window's x records, a thread per (token, row).
  const rssm::SpecCursor after{fold ? cur.position(count, R) : cur.origin, fold ? 0 : count};
  const float d_h = p.D ? p.D[t.head] : 0.f;
  act_t* x_dst = static_cast<act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head + t.row0;
  for (int i = threadIdx.x; i < T * PT; i += rssm::kThreads) {
    const int tok = i / PT, r = i % PT, seen = count + tok + 1 - base;
    const float* w = VerifyCoef::w(s_coef, R, tok);
    float y = w[R] * s_dot[tok][r];
    for (int l = 0; l < seen; ++l) y = fmaf(w[l], s_x[base + l][r], y);
    const float xt = s_x[count + tok][r];
    y = fmaf(d_h, xt, y);
    if (p.z)
      y *= rssm::siluf(rssm::to_float(static_cast<const act_t*>(p.z)[t.b * p.s_z_b + tok * p.s_z_t + t.head * p.s_z_h +
                                                                    t.row0 + r]));
    static_cast<act_t*>(p.out)[t.b * p.s_out_b + tok * p.s_out_t + t.head * p.s_out_h + t.row0 + r] =
        rssm::from_float<act_t>(y);
    x_dst[(long long)after.position(after.count + tok, R) * P + r] = rssm::from_float<act_t>(xt);
  }
  if constexpr (kOneLaunch) {  // the window's Δ and B records after the history; a folding row's cursor
    if (blockIdx.x == 0 && t.warp == 0 && t.lane >= count && t.lane < n)
      p.dt_ring[t.slot * p.s_dtr_slot + t.head * p.s_dtr_head + after.position(after.count + t.lane - count, R)] =
          d_head;
    if (blockIdx.x == 0 && t.head % (p.nheads / p.ngroups) == 0) {
      act_t* B_dst = static_cast<act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group;
      const act_t* B_in = group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group);
      for (int i = threadIdx.x; i < T * N; i += rssm::kThreads) {
        const int tok = i / N;
        B_dst[(long long)after.position(after.count + tok, R) * N + i % N] = B_in[tok * p.s_B_t + i % N];
      }
    }
    if (fold && threadIdx.x == 0)  // every thread read the cursor word before the barriers above
      rssm::arrive_and_advance(p.cursor, p.arrive, t.slot, gridDim.x * gridDim.y, after.word());
  }
}

}  // namespace

// Verify step 2 at small batch (verify_rows: a CTA per row tile, core/ops/mamba2_spec.py verify_plan chooses it
// below a batch x heads crossover) for windows of up to 2, 4 and 8 tokens (the host takes the smallest that holds
// T). Windows of 8: a minimum of one CTA per SM, else ptxas trades registers for occupancy and spills.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, kGridT2MinBlocks) mamba2_verify_grid_t2_kernel(
    const Mamba2Params p) {
  verify_rows<2, false>(p);
}
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_verify_grid_t4_kernel(const Mamba2Params p) {
  verify_rows<4, false>(p);
}
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_verify_grid_t8_kernel(const Mamba2Params p) {
  verify_rows<8, false>(p);
}

// The verify in one launch at small batch (verify_rows<kT, true>: no prep kernel; up to
// Tuning.one_launch_verify_max_work_per_sm), windows of up to 2, 4 and 8 tokens: a minimum of one CTA per SM (with
// the grid kernels' bounds ptxas spilled 32-48 bytes in the window-4 kernel on sm_100a).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_verify_one_launch_t2_kernel(
    const Mamba2Params p) {
  verify_rows<2, true>(p);
}
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_verify_one_launch_t4_kernel(
    const Mamba2Params p) {
  verify_rows<4, true>(p);
}
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_verify_one_launch_t8_kernel(
    const Mamba2Params p) {
  verify_rows<8, true>(p);
}

// The per-draft-state verify (the baseline speculative decoding of vLLM and TensorRT-LLM outside their replay
// paths), grid (P / PT, nheads, batch): T recurrence steps from the checkpoint, the state after each window token
// stored to inter[b, t] (state dtype), y_t = S_t · C_t + D x_t. The checkpoint is not written
// (mamba2_per_draft_commit_kernel copies the accepted state back).
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_per_draft_verify_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  float S[kRowsPerWarp][kEpl];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) rssm::load_vec<state_t, kEpl>(t.state + r * N, S[r]);
  __shared__ OutStage st;
  const float a = p.A[t.head];
  for (int tok = 0; tok < p.window; ++tok) {
    float bv[kEpl], cv[kEpl];
    rssm::load_vec<act_t, kEpl>(group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group) + tok * p.s_B_t + t.lane * kEpl, bv);
    rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + tok * p.s_C_t + t.lane * kEpl, cv);
    const float delta = current_delta(p, t.b, t.head, tok);
    const float decay = __expf(decay_exponent(a, delta));
    if (threadIdx.x < PT) {
      const long long i = (long long)tok * p.s_x_t + t.row0 + threadIdx.x;
      const float x = rssm::to_float(x_of(p, t)[i]);
      st.x[threadIdx.x] = x;
      st.extra[threadIdx.x] = p.D ? p.D[t.head] * x : 0.f;
      st.gate[threadIdx.x] =
          p.z ? rssm::siluf(rssm::to_float(static_cast<const act_t*>(p.z)[t.b * p.s_z_b + tok * p.s_z_t +
                                                                        t.head * p.s_z_h + t.row0 + threadIdx.x]))
              : 1.f;
    }
    __syncthreads();
    state_t* dst = static_cast<state_t*>(p.inter) + t.b * p.s_inter_b + tok * p.s_inter_t +
                   ((long long)t.head * P + t.row0 + t.warp * kRowsPerWarp) * N + t.lane * kEpl;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float u = delta * st.x[t.warp * kRowsPerWarp + r];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) S[r][e] = fmaf(decay, S[r][e], u * bv[e]);
      rssm::store_vec<state_t, kEpl>(dst + r * N, S[r]);
      stage_row_dot(t, r, S[r], cv, st);
    }
    __syncthreads();
    if (threadIdx.x < PT)
      static_cast<act_t*>(p.out)[t.b * p.s_out_b + tok * p.s_out_t + t.head * p.s_out_h + t.row0 + threadIdx.x] =
          rssm::from_float<act_t>((st.dot[threadIdx.x] + st.extra[threadIdx.x]) * st.gate[threadIdx.x]);
    __syncthreads();
  }
}

// The per-draft commit, grid (P / PT, nheads, batch): the slot's checkpoint rows <- inter[b, accepted[b] - 1]. A pad
// row, or a count outside 1..T, copies nothing.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_per_draft_commit_kernel(const Mamba2Params p) {
  const int b = blockIdx.z, h = blockIdx.y, row0 = blockIdx.x * PT;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  const int accepted = p.accepted[b];
  if (slot == p.pad_slot_id || accepted < 1 || accepted > p.window) return;
  using Chunk = uint4;
  constexpr int kChunks = PT * N * int(sizeof(state_t)) / int(sizeof(Chunk));
  static_assert(PT * N * sizeof(state_t) % sizeof(Chunk) == 0, "tile rows move in 16-byte chunks");
  const Chunk* src = reinterpret_cast<const Chunk*>(static_cast<const state_t*>(p.inter) + b * p.s_inter_b +
                                                    (accepted - 1) * p.s_inter_t + ((long long)h * P + row0) * N);
  Chunk* dst = reinterpret_cast<Chunk*>(static_cast<state_t*>(p.state) + slot * p.s_state_slot + h * p.s_state_head +
                                        (long long)row0 * N);
  for (int i = threadIdx.x; i < kChunks; i += rssm::kThreads) dst[i] = __ldcs(src + i);
}
#endif

// Replay step 1, grid (batch, ngroups), 4..16 warps: per (row, group) the B·C products, per head the decay weights
// into the per-row scratch; appends Δ (per head) and B (per group) for non-flush rows; advances the cursor. Every
// global load depends on the cursor alone and is issued before any result is used (one load latency per CTA). Lets
// the main kernel launch once the previous grid has finished (rssm::prep_begin).
extern "C" __global__ void __launch_bounds__(512) mamba2_replay_prep_kernel(const Mamba2Params p) {
  rssm::prep_begin(p.step - 1);
  constexpr int kEntriesPerWarp = rssm::kMaxL / rssm::kNumWarps;  // B·C products per warp (>= 4 warps)
  constexpr int kHeadsAhead = 4;                                  // heads per warp whose Δ loads are hoisted
  const int b = blockIdx.x, g = blockIdx.y;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id) return;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int nwarps = blockDim.x / rssm::kWarpSize;
  const int w = p.cursor[slot];
  const int first_id = rssm::preload_row_id(p.slot_idx, b, threadIdx.x);
  auto skip_row = [&] {  // rssm::row_slot: the main kernel reads the step word
    if (threadIdx.x == 0 && g == 0) p.step[b] = rssm::kSkipStep;
  };
  if (!rssm::cursor_in_ring(w, p.L)) return skip_row();
  const bool flush = p.force_flush || w >= p.L - 1;
  const int heads_per_group = p.nheads / p.ngroups;
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, b, g);

  // Loads: C and this warp's ring entries of B (entries warp, warp + nwarps, ...), Δ of this warp's first heads.
  float cv[kEpl], bv[kEntriesPerWarp][kEpl];
  if (!flush) {
    rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, b, g) + lane * kEpl, cv);
#pragma unroll
    for (int k = 0; k < kEntriesPerWarp; ++k) {
      const int j = warp + k * nwarps;
      if (j <= w) rssm::load_vec<act_t, kEpl>((j < w ? B_ring + (long long)j * N : B_cur) + lane * kEpl, bv[k]);
    }
  }
  auto head_delta = [&](int hh, float& d_lane, float& delta_w) {  // lane j < w: Δ_j of the ring; Δ_w: current
    const int h = g * heads_per_group + hh;
    delta_w = current_delta(p, b, h);
    d_lane = lane < w ? p.dt_ring[slot * p.s_dtr_slot + h * p.s_dtr_head + lane] : 0.f;
  };
  float d_ahead[kHeadsAhead], dw_ahead[kHeadsAhead];
#pragma unroll
  for (int m = 0; m < kHeadsAhead; ++m)
    if (warp + m * nwarps < heads_per_group) head_delta(warp + m * nwarps, d_ahead[m], dw_ahead[m]);

  __shared__ float s_bc[rssm::kMaxL];
  if (!flush) {
#pragma unroll
    for (int k = 0; k < kEntriesPerWarp; ++k) {
      const int j = warp + k * nwarps;
      if (j > w) break;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(bv[k][e], cv[e], dot);
      dot = rssm::warp_sum(dot);
      if (lane == 0) s_bc[j] = dot;
    }
  }
  // s_bc ready; every thread has read the cursor
  if (__syncthreads_or(rssm::earlier_row_has(p.slot_idx, b, slot, threadIdx.x, blockDim.x, first_id))) {
    return skip_row();
  }
  if (!flush) {
    act_t* B_dst = static_cast<act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group + (long long)w * N;
    for (int i = threadIdx.x; i < N; i += blockDim.x) B_dst[i] = B_cur[i];
  }

  auto head_weights = [&](int hh, float d, float delta_w) {  // head hh's weights and decay into the scratch
    const int h = g * heads_per_group + hh;
    if (lane == w) d = delta_w;
    float decay;
    const float s = decay_weights(d, p.A[h], decay);
    float* coef = p.coef + b * p.s_coef_row + (long long)h * (p.L + 1);
    if (lane <= w) coef[lane] = flush ? s : s * s_bc[lane];
    if (lane == 0) {
      coef[p.L] = decay;
      if (!flush) p.dt_ring[slot * p.s_dtr_slot + h * p.s_dtr_head + w] = delta_w;
    }
  };
#pragma unroll
  for (int m = 0; m < kHeadsAhead; ++m)  // static indices: the hoisted loads stay in registers
    if (warp + m * nwarps < heads_per_group) head_weights(warp + m * nwarps, d_ahead[m], dw_ahead[m]);
  for (int hh = warp + kHeadsAhead * nwarps; hh < heads_per_group; hh += nwarps) {
    float d, delta_w;
    head_delta(hh, d, delta_w);
    head_weights(hh, d, delta_w);
  }
  if (threadIdx.x == 0) {
    if (g == 0) p.step[b] = flush ? -(w + 1) : w;
    if (SR && flush && g == 0) p.flushes[slot] += 1;  // the main kernel keys this write by the count before it
    rssm::arrive_and_advance(p.cursor, p.arrive, slot, p.ngroups, flush ? 0 : w + 1);
  }
}

namespace {

constexpr int kTileBytes = PT * ReadRows::kRowBytes;  // the rows non-flush steps read
static_assert(kTileBytes % 16 == 0, "state tiles move by bulk copies of a multiple of 16 bytes");
static_assert(kHeadRows * sizeof(act_t) % 4 == 0 && N * sizeof(act_t) % 4 == 0,
              "row inputs move by 4-byte async copies");
static_assert(kTileHeads == 1 || kRowsPerWarp * (rssm::kNumWarps / kTileHeads) == kHeadRows,
              "a consumer warp's rows lie in one head");
constexpr int kRowGroups = rssm::kWarpSize / kRowsPerWarp;  // lanes per row that split its ring entries
constexpr int kFoldChunk = 8;  // ring entries whose B loads a flush issues at once
// State rows a flush folds at once (registers): all of a warp's rows up to 10 (one pass over the ring), else 8.
// Two stochastically rounded encodes (a quantized master and a read copy) per row: 2 rows at once, else ptxas spills.
constexpr int kFoldRows = SR && kDual && MASTER_FMT != rssm::kFmtPlain ? 2 : kRowsPerWarp <= 10 ? kRowsPerWarp : 8;

__host__ __device__ constexpr int round16(int v) { return (v + 15) / 16 * 16; }

// One shared-memory stage: the checkpoint tile, then everything else the consumers read of the tile, copied by the
// producer warp (offsets from the ring length L; trtllm_replayssm/core/layouts.py mirrors the total, checked at
// compilation).
struct StageLayout {
  int info, D, coef, x, z, C, x_ring, ring_head, bytes;
};

__host__ __device__ constexpr StageLayout stage_layout(int L) {
  StageLayout l{};
  l.info = kTileBytes;                                                // slot, step, D (one head), tile (4 words)
  l.D = kTileHeads == 1 ? l.info + 8 : l.info + 16;                   // D of the tile's heads
  l.coef = l.info + 16 + (kTileHeads == 1 ? 0 : round16(kTileHeads * 4));  // coef[0..L] (weights, decay) per head
  l.x = l.coef + round16(kTileHeads * (L + 1) * 4);                   // x of the tile rows, head by head
  l.z = l.x + round16(PT * int(sizeof(act_t)));                       // z of the tile rows
  l.C = l.z + round16(PT * int(sizeof(act_t)));                       // C of the heads' group
  l.x_ring = l.C + round16(N * int(sizeof(act_t)));                   // per head: x ring rows j < w, [L][kHeadRows]
  l.ring_head = round16(L * kHeadRows * int(sizeof(act_t)));
  l.bytes = (l.x_ring + kTileHeads * l.ring_head + 127) / 128 * 128;
  return l;
}

// The fold buffer: a flush tile's B rows [L][N] (trtllm_replayssm/core/layouts.py mirrors it).
__host__ __device__ constexpr int fold_buffer_bytes(int L) { return round16(L * N * int(sizeof(act_t))); }

struct TileCoord {
  int b, head, group, row0;  // head: the tile's first
};

// Tile t of the replay: batch row, first head, their group and first state row (row tiles fastest, then heads, then
// batch rows), by multiplies: one per kernel thread.
struct TileMap {
  rssm::FastDiv by_tiles_per_row, by_group_heads;
  int tiles_per_row;  // head tiles of a batch row
  __device__ explicit TileMap(const Mamba2Params& p)
      : by_tiles_per_row(p.nheads / kTileHeads), by_group_heads(p.nheads / p.ngroups),
        tiles_per_row(p.nheads / kTileHeads) {}
  __device__ __forceinline__ TileCoord operator()(int t) const {
    constexpr int kRowTiles = P / kHeadRows;
    const int hb = t / kRowTiles, b = by_tiles_per_row(hb), head = (hb - b * tiles_per_row) * kTileHeads;
    return {b, head, by_group_heads(head), (t % kRowTiles) * kHeadRows};
  }
};

// Producer warp (rssm::produce_tiles_claiming_tail): besides slot and step, each tile's D, coefficients, x, z, C and
// the x ring rows j < w go into its stage; a flush tile's B rows into the fold buffer (or an L2 prefetch without one).
__device__ __forceinline__ void produce(const Mamba2Params& p, rssm::TilePipe& pipe, unsigned char* stage_mem,
                                        int num_tiles, const TileMap& coord) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  const StageLayout lay = stage_layout(p.L);
  auto state_src = [&](int slot, const TileCoord& c) {
    if constexpr (ReadRows::kScaleBytes == 0 && !kDual) {
      if (slot == p.pad_slot_id) return static_cast<const void*>(nullptr);
      return static_cast<const void*>(static_cast<const state_t*>(p.state) + slot * p.s_state_slot +
                                      c.head * p.s_state_head + (long long)c.row0 * N);
    } else {
      if (slot == p.pad_slot_id) return rssm::TileParts{};
      const ReadRows rows = nonflush_rows(p, slot, c.head, c.row0);
      return rssm::TileParts{{rows.data, rows.block, rows.scale},
                             {PT * ReadRows::kDataBytes, PT * ReadRows::kBlockBytes, PT * ReadRows::kScaleBytes}};
    }
  };
  int folds = 0;
  act_t* fold_buf = reinterpret_cast<act_t*>(stage_mem + (long long)p.stages * p.stage_bytes);
  auto copy_inputs = [&](unsigned char* stage, const TileCoord& c, int slot, int info, unsigned long long* full) {
    if (p.D && lane < kTileHeads) rssm::cp_async4(stage + lay.D + lane * 4, p.D + c.head + lane);
    const int group = c.group;
    const int w = info < 0 ? -info - 1 : info;
    constexpr int kRowWords = kHeadRows * int(sizeof(act_t)) / 4;  // one head's rows of x, z or a ring entry
    rssm::cp_async_words(stage + lay.coef, p.coef + c.b * p.s_coef_row + (long long)c.head * (p.L + 1),
                         kTileHeads * (p.L + 1));
    constexpr int kCBytes = N * int(sizeof(act_t));
    const act_t* C = group_vec(p.C, p.s_C_b, p.s_C_g, c.b, group);
    if (!rssm::bulk_copy_input(stage + lay.C, C, kCBytes, full)) rssm::cp_async_words(stage + lay.C, C, kCBytes / 4);
#pragma unroll
    for (int hl = 0; hl < kTileHeads; ++hl) {
      const int h = c.head + hl;
      rssm::cp_async_words(stage + lay.x + hl * kRowWords * 4,
                           static_cast<const act_t*>(p.x) + c.b * p.s_x_b + h * p.s_x_h + c.row0, kRowWords);
      if (p.z)
        rssm::cp_async_words(stage + lay.z + hl * kRowWords * 4,
                             static_cast<const act_t*>(p.z) + c.b * p.s_z_b + h * p.s_z_h + c.row0, kRowWords);
      // The head's x ring rows j < w: one bulk copy where the tile spans the head's rows (contiguous rows).
      unsigned char* ring_dst = stage + lay.x_ring + hl * lay.ring_head;
      const act_t* ring = x_ring_at(p, slot, h) + c.row0;
      if (kHeadRows != P || !rssm::bulk_copy_input(ring_dst, ring, w * kHeadRows * int(sizeof(act_t)), full)) {
        for (int q = lane; q < w * kRowWords; q += rssm::kWarpSize) {
          const int j = q / kRowWords, word = q % kRowWords;
          rssm::cp_async4(ring_dst + (j * kRowWords + word) * 4,
                          reinterpret_cast<const unsigned*>(ring + (long long)j * P) + word);
        }
      }
    }
    const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + group * p.s_Br_group;
    if (info < 0 && p.fold_bytes) {  // the fold's B rows: ring rows j < w, then the current B at row w
      rssm::fold_buffer_acquire(pipe, folds++);
      constexpr int kBBytes = N * int(sizeof(act_t));
      const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, c.b, group);
      if (!rssm::bulk_copy_input(fold_buf, B_ring, w * kBBytes, &pipe.fold_full))
        rssm::cp_async_words(fold_buf, B_ring, w * kBBytes / 4);
      if (!rssm::bulk_copy_input(fold_buf + w * N, B_cur, kBBytes, &pipe.fold_full))
        rssm::cp_async_words(fold_buf + w * N, B_cur, kBBytes / 4);
      rssm::cp_async_arrive(&pipe.fold_full);
    } else if (info < 0) {  // the fold loads the ring's B rows itself: have them in L2 by then
      rssm::prefetch_l2(B_ring, w * N * int(sizeof(act_t)));
    }
  };
  rssm::produce_tiles_claiming_tail(pipe, stage_mem, p.stages, p.stage_bytes, num_tiles, kTileBytes, p.slot_idx,
                                    p.step, p.pad_slot_id, p.slots, p.tail_start, p.step - 1, coord, state_src,
                                    copy_inputs, p.flush_apart != 0);
}

// A consumer warp's rows of a tile: its head, its first row among that head's rows in the tile and among the
// tile's rows (stage order: head by head).
struct WarpRows {
  int head, head_row0, tile_row0;
};

__device__ __forceinline__ WarpRows warp_rows(const TileCoord& c, int warp) {
  const int hl = warp / (rssm::kNumWarps / kTileHeads), tile_row0 = warp * kRowsPerWarp;
  return {c.head + hl, tile_row0 - hl * kHeadRows, tile_row0};
}

// Flush rows of one consumer warp: S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ from the stage rows, stored; returns row
// r's S·C on lane r. x_j come from the stage (ring rows j < w, then x), B_j from the fold buffer `B_s` ([w + 1][N])
// or, without one, from global memory in chunks of kFoldChunk entries (the producer prefetched them to L2). S0: the
// tile in `stage` (outside dual mode) or the master in global memory (dual mode).
__device__ __forceinline__ float fold_stage_rows(const Mamba2Params& p, const TileCoord& c, const WarpRows& wr,
                                                 int slot, int w, const float* coef, const act_t* x_s,
                                                 const act_t* ring_s, const act_t* B_s, const float (&cv)[kEpl],
                                                 const unsigned char* stage) {
  using BRaw = rssm::VecTraits<act_t, kEpl>;
  const int lane = threadIdx.x % rssm::kWarpSize;
  const state_t* rows = reinterpret_cast<const state_t*>(stage) + wr.tile_row0 * N + lane * kEpl;  // plain
  const int wrow0 = wr.tile_row0;
  const int group = c.group;
  const float sj = lane <= w ? coef[lane] : 0.f;
  const act_t* xj = lane < w ? ring_s + lane * kHeadRows + wr.head_row0 : x_s + wrow0;
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + group * p.s_Br_group;
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, c.b, group);
  state_t* dst = static_cast<state_t*>(p.state) + slot * p.s_state_slot + wr.head * p.s_state_head +
                 (long long)(c.row0 + wr.head_row0) * N + lane * kEpl;
  const float decay = coef[p.L];
  const unsigned flushes = SR ? __ldcg(p.flushes + slot) - 1 : 0u;  // the prep kernel counted this write
  const CheckpointRows ckpt = checkpoint_rows(p, slot, wr.head, c.row0 + wr.head_row0);
  float dot_lane = 0.f;
#pragma unroll
  for (int r0 = 0; r0 < kRowsPerWarp; r0 += kFoldRows) {
    float acc[kFoldRows][kEpl], xs[kFoldRows];  // xs: s_j x_j[row] on lane j
#pragma unroll
    for (int r = 0; r < kFoldRows; ++r) {
      if (r0 + r >= kRowsPerWarp) break;
      xs[r] = lane <= w ? sj * rssm::to_float(xj[r0 + r]) : 0.f;
      if constexpr (!kStored) rssm::load_vec<state_t, kEpl>(rows + (r0 + r) * N, acc[r]);
      else if constexpr (kDual) ckpt.master.decode(r0 + r, lane, acc[r]);
      else ReadRows::tile(const_cast<unsigned char*>(stage), PT).offset(wrow0).decode(r0 + r, lane, acc[r]);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[r][e] *= decay;
    }
    for (int j0 = 0; j0 <= w; j0 += kFoldChunk) {
      typename BRaw::Raw braw[kFoldChunk][BRaw::kChunks];
#pragma unroll
      for (int k = 0; k < kFoldChunk; ++k) {
        const int j = j0 + k;
        const act_t* B_j = B_s ? B_s + j * N : (j < w ? B_ring + (long long)j * N : B_cur);
        const auto* src = reinterpret_cast<const typename BRaw::Raw*>(B_j + lane * kEpl);
#pragma unroll
        for (int q = 0; q < BRaw::kChunks; ++q)
          if (j <= w) braw[k][q] = src[q];
      }
#pragma unroll
      for (int k = 0; k < kFoldChunk; ++k) {
        if (j0 + k > w) break;
        float bv[kEpl];
#pragma unroll
        for (int q = 0; q < BRaw::kChunks; ++q)
#pragma unroll
          for (int e = 0; e < BRaw::kPerChunk; ++e) bv[q * BRaw::kPerChunk + e] = rssm::raw_elem<act_t>(braw[k][q], e);
#pragma unroll
        for (int r = 0; r < kFoldRows; ++r) {
          if (r0 + r >= kRowsPerWarp) break;
          const float xsr = __shfl_sync(0xffffffffu, xs[r], j0 + k);
#pragma unroll
          for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(xsr, bv[e], acc[r][e]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kFoldRows; ++r) {
      if (r0 + r >= kRowsPerWarp) break;
      if constexpr (kStored) ckpt.store(r0 + r, acc[r], flushes, p.seed);
      else rssm::store_vec<state_t, kEpl>(dst + (r0 + r) * N, acc[r]);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(acc[r][e], cv[e], dot);
      dot = rssm::warp_sum(dot);
      if (lane == r0 + r) dot_lane = dot;
    }
  }
  return dot_lane;
}

// One consumer warp's rows (warp * kRowsPerWarp ...) of the tile in `stage` (complete). Lane r finishes row r:
// y = gate (scale S·C + extra), extra = D x (+ Σ_{j<=w} coef_j x_j for non-flush rows). Non-flush: S is the
// checkpoint (never written), scale = decay, appends x. Flush: S is the folded new checkpoint (stored), scale = 1.
// Releases the stage once its shared memory is read.
__device__ __forceinline__ void replay_tile(const Mamba2Params& p, const TileCoord& c, const unsigned char* stage,
                                            rssm::TilePipe& pipe, int s, const act_t* fold_buf, int& folds) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const StageLayout lay = stage_layout(p.L);
  const WarpRows rows_of_warp = warp_rows(c, warp);
  const int* info_words = reinterpret_cast<const int*>(stage + lay.info);
  const int slot = info_words[0], info = info_words[1];  // info: stale for a pad row (not read then)
  act_t* out = static_cast<act_t*>(p.out) + c.b * p.s_out_b + rows_of_warp.head * p.s_out_h + c.row0 +
               rows_of_warp.head_row0;
  if (rssm::skipped_stage_row(slot, info, p.pad_slot_id, p.slots)) {
    rssm::release_stage(pipe, s);
    if (lane < kRowsPerWarp) out[lane] = rssm::from_float<act_t>(0.f);
    return;
  }
  if ((kStored || p.flush_apart) && info < 0) {  // the flush-rows kernel's row (a stored checkpoint's always)
    rssm::release_stage(pipe, s);
    return;
  }
  const int hl = rows_of_warp.head - c.head;
  const float d_h = p.D ? reinterpret_cast<const float*>(stage + lay.D)[hl] : 0.f;
  const float* coef = reinterpret_cast<const float*>(stage + lay.coef) + hl * (p.L + 1);
  const act_t* x_s = reinterpret_cast<const act_t*>(stage + lay.x);
  const act_t* z_s = reinterpret_cast<const act_t*>(stage + lay.z);
  const act_t* ring = reinterpret_cast<const act_t*>(stage + lay.x_ring + hl * lay.ring_head);
  const state_t* rows = reinterpret_cast<const state_t*>(stage) + warp * kRowsPerWarp * N + lane * kEpl;
  const bool flush = !kStored && info < 0;
  const int w = flush ? -info - 1 : info;
  const int r = lane % kRowsPerWarp, wr = warp * kRowsPerWarp + r;  // lane r < kRowsPerWarp: tile row wr
  const int hr = rows_of_warp.head_row0 + r;                         // and its row among the head's in the tile
  float cv[kEpl];
  rssm::load_vec<act_t, kEpl>(reinterpret_cast<const act_t*>(stage + lay.C) + lane * kEpl, cv);
  const act_t x_act = x_s[wr];
  const float x = rssm::to_float(x_act);
  const float gate = p.z ? rssm::siluf(rssm::to_float(z_s[wr])) : 1.f;
  float extra = d_h * x, dot_lane = 0.f;
  if (!flush) {
    // Σ_{j<w} coef_j x_j[row]: lane l sums entries j ≡ l / kRowsPerWarp (mod kRowGroups) of row l % kRowsPerWarp.
    float part = 0.f;
    const int grp = lane / kRowsPerWarp;
    if (grp < kRowGroups)
      for (int j = grp; j < w; j += kRowGroups) part = fmaf(coef[j], rssm::to_float(ring[j * kHeadRows + hr]), part);
    float total = part;
#pragma unroll
    for (int g = 1; g < kRowGroups; ++g) total += __shfl_down_sync(0xffffffffu, part, g * kRowsPerWarp);
    extra += fmaf(coef[w], x, total);
    const float decay = coef[p.L];
    if constexpr (kQuantRowDots) {  // fp16x2 products, a row's columns on neighbouring lanes (rssm::QuantRowDots)
      using Dots = rssm::QuantRowDots<kReadFmt, N>;
      const act_t* c_s = reinterpret_cast<const act_t*>(stage + lay.C);
      float d[1];
      Dots dots;
      dots.init([&](int, int col) { return rssm::to_float(c_s[col]); });
      dots.template dots<kRowsPerWarp>(
          ReadRows::tile(const_cast<unsigned char*>(stage), PT).offset(warp * kRowsPerWarp), lane, d);
      dot_lane = d[0];
    } else if constexpr (kStored && (kRowsPerWarp & (kRowsPerWarp - 1)) == 0) {
      // Decoding leaves little issue slack: one transposed reduction for the warp's rows (lane r: row r).
      const ReadRows tile_rows = ReadRows::tile(const_cast<unsigned char*>(stage), PT).offset(warp * kRowsPerWarp);
      float part[kRowsPerWarp];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) part[rr] = tile_rows.dot(rr, lane, cv);
      dot_lane = rssm::warp_sum_scatter<kRowsPerWarp>(part);
    } else {
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        float dot = 0.f;
        if constexpr (kStored) {
          dot = ReadRows::tile(const_cast<unsigned char*>(stage), PT).offset(warp * kRowsPerWarp).dot(rr, lane, cv);
        } else {
          float v[kEpl];
          rssm::load_vec<state_t, kEpl>(rows + rr * N, v);
#pragma unroll
          for (int e = 0; e < kEpl; ++e) dot = fmaf(v[e], cv[e], dot);
        }
        dot = rssm::warp_sum(dot);
        if (lane == rr) dot_lane = dot;
      }
    }
    dot_lane *= decay;
  } else {
    if (p.fold_bytes) rssm::fold_buffer_wait(pipe, folds);
    dot_lane = fold_stage_rows(p, c, rows_of_warp, slot, w, coef, x_s, ring, p.fold_bytes ? fold_buf : nullptr, cv,
                               stage);
    if (p.fold_bytes) {
      rssm::fold_buffer_release(pipe);
      ++folds;
    }
  }
  rssm::release_stage(pipe, s);
  if (lane < kRowsPerWarp) {
    out[lane] = rssm::from_float<act_t>((dot_lane + extra) * gate);
    if (!flush) {
      act_t* x_ring = static_cast<act_t*>(p.x_ring) + slot * p.s_xr_slot + rows_of_warp.head * p.s_xr_head;
      x_ring[(long long)w * P + c.row0 + hr] = x_act;
    }
  }
}

}  // namespace

// Replay step 2, persistent (grid: a few CTAs per SM; 4 consumer warps + 1 producer warp; `stages` stages of
// `stage_bytes` in dynamic shared memory): the producer streams each checkpoint tile with a bulk copy and the tile's
// inputs with async copies, so consumer warps never wait on a global load outside a flush; consumers compute non-flush
// rows from the checkpoint (never written) and fold flush rows into a new checkpoint (plain checkpoints; a stored
// one's flush rows go to the flush-rows kernel). A programmatic dependent of the
// prep kernel: the first state copies start while prep runs (it never writes the state).
// Requires sm_90+ (bulk copies, mbarrier try_wait); the ops run the flush path on older GPUs.
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, kReplayCtasPerSm)
    mamba2_replay_main_kernel(const Mamba2Params p) {
#if __CUDA_ARCH__ >= 900
  if (kStored && !p.flush_apart) __trap();  // a stored checkpoint's flush rows go to the flush-rows kernel
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  const int num_tiles = p.batch * (p.nheads / kTileHeads) * (P / kHeadRows);
  const TileMap coord(p);
  rssm::persistent_main<true>(pipe, stage_mem, p.stages, p.stage_bytes, stage_layout(p.L).bytes, num_tiles,
                              p.tail_start, kTileBytes, [&] { produce(p, pipe, stage_mem, num_tiles, coord); },
                              [&](int t, unsigned char* stage, int s, const unsigned char* fold_buf, int& folds) {
                                replay_tile(p, coord(t), stage, pipe, s,
                                            reinterpret_cast<const act_t*>(fold_buf), folds);
                              });
#endif
}

namespace {
// The flush-rows kernel's lanes: each keeps 8 columns of two adjacent state rows in registers through the fold (lane
// = column slot · kPairs + pair), so a ring entry's B_j columns are read from shared memory once for both rows; a
// row's N / 8 lanes differ in lane bits 1 ... (the encode's kStride = kPairs), an NVFP4 block spans two of them.
struct FlushLanes {
  static constexpr int kCols = 8;                             // columns per lane and row
  static constexpr int kRowLanes = N / kCols;                 // lanes per row
  static constexpr int kPairs = rssm::kWarpSize / kRowLanes;  // row pairs on a warp at once
  static constexpr int kPassRows = 2 * kPairs;
  static_assert(N % kCols == 0 && rssm::kWarpSize % kRowLanes == 0 && kCols % kEpl == 0,
                "flush lanes: rows of 64 ... 256 columns");
};

// The flush of one (batch row, head) at cursor w with the prep kernel's weights `coef` (s_0..s_w, decay at L): the
// ring's B rows and the token's B (fp32) and s_j x_j of the head's rows, staged; each warp folds its quarter of the
// head's rows, a pass of rows (FlushLanes::kPassRows) at a time (S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ, the FMAs in
// ring order), stores them and writes y = (S·C + D x) · gate. Where a warp's rows do not fill its last pass, the
// spare lanes repeat its last two rows (same values, same stores). Every thread of the CTA calls it (it synchronises).
__device__ __forceinline__ void flush_head(const Mamba2Params& p, int b, int slot, int h, int w, float (*s_B)[N],
                                           float (*s_xs)[P]) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  constexpr int kWarpRows = P / rssm::kNumWarps;
  static_assert(kWarpRows % 2 == 0, "flush lanes: an even number of rows per warp");
  const int row0 = warp * kWarpRows;
  const MasterRows master = master_rows(p, slot, h, row0);
  // The warp's checkpoint rows head for L2 while the ring stages: their loads below wait on L2, not on DRAM.
  rssm::prefetch_l2(master.data, kWarpRows * MasterRows::kDataBytes);
  if constexpr (MasterRows::kBlockBytes > 0) rssm::prefetch_l2(master.block, kWarpRows * MasterRows::kBlockBytes);
  if constexpr (MasterRows::kScaleBytes > 0) rssm::prefetch_l2(master.scale, kWarpRows * MasterRows::kScaleBytes);
  const int g = h / (p.nheads / p.ngroups);
  const float* coef = p.coef + b * p.s_coef_row + (long long)h * (p.L + 1);
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, b, g);
  const act_t* x_ring = x_ring_at(p, slot, h);
  const act_t* x_cur = static_cast<const act_t*>(p.x) + b * p.s_x_b + h * p.s_x_h;
  __syncthreads();  // the previous head's reads of s_B and s_xs are done
  // B_j in fp32 and s_j x_j, by loads of kEpl columns (B and C rows are aligned to N / 32 elements) and of 4 bytes
  // of x (core/ops/mamba2.py checks both).
  for (int i = threadIdx.x; i < (w + 1) * (N / kEpl); i += rssm::kThreads) {
    const int j = i / (N / kEpl), n = i % (N / kEpl) * kEpl;
    float v[kEpl];
    rssm::load_vec<act_t, kEpl>((j < w ? B_ring + (long long)j * N : B_cur) + n, v);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) s_B[j][n + e] = v[e];
  }
  constexpr int kXElems = sizeof(act_t) < 4 ? 4 / int(sizeof(act_t)) : 1;
  for (int i = threadIdx.x; i < (w + 1) * (P / kXElems); i += rssm::kThreads) {
    const int j = i / (P / kXElems), r = i % (P / kXElems) * kXElems;
    float v[kXElems];
    rssm::load_vec<act_t, kXElems>((j < w ? x_ring + (long long)j * P : x_cur) + r, v);
    const float c = coef[j];
#pragma unroll
    for (int e = 0; e < kXElems; ++e) s_xs[j][r + e] = c * v[e];
  }
  const int pair = lane % FlushLanes::kPairs, col_slot = lane / FlushLanes::kPairs;
  const int c0 = col_slot * FlushLanes::kCols;
  float cv[FlushLanes::kCols];
  const act_t* C = group_vec(p.C, p.s_C_b, p.s_C_g, b, g) + c0;
#pragma unroll
  for (int q = 0; q < FlushLanes::kCols / kEpl; ++q) {
    float v[kEpl];
    rssm::load_vec<act_t, kEpl>(C + kEpl * q, v);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) cv[kEpl * q + e] = v[e];
  }
  const float decay = coef[p.L];
  const float d_h = p.D ? p.D[h] : 0.f;
  const unsigned flushes = SR ? __ldcg(p.flushes + slot) - 1 : 0u;  // the prep kernel counted this write
  const CheckpointRows ckpt = checkpoint_rows(p, slot, h, row0);
  act_t* out = static_cast<act_t*>(p.out) + b * p.s_out_b + h * p.s_out_h + row0;
  const act_t* z = p.z ? static_cast<const act_t*>(p.z) + b * p.s_z_b + h * p.s_z_h + row0 : nullptr;
  __syncthreads();
  for (int r0 = 0; r0 < kWarpRows; r0 += FlushLanes::kPassRows) {
    const int r = min(r0 + 2 * pair, kWarpRows - 2);  // this lane's rows r and r + 1
    float acc[2][FlushLanes::kCols];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      master.template decode<FlushLanes::kCols>(r + k, col_slot, acc[k]);
#pragma unroll
      for (int e = 0; e < FlushLanes::kCols; ++e) acc[k][e] *= decay;
    }
    for (int j = 0; j <= w; ++j) {
      const float2 xs = *reinterpret_cast<const float2*>(&s_xs[j][row0 + r]);
      const float4* bj = reinterpret_cast<const float4*>(&s_B[j][c0]);
#pragma unroll
      for (int q = 0; q < FlushLanes::kCols / 4; ++q) {
        const float4 bv = bj[q];
        const float bq[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[0][4 * q + e] = fmaf(xs.x, bq[e], acc[0][4 * q + e]);
          acc[1][4 * q + e] = fmaf(xs.y, bq[e], acc[1][4 * q + e]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if constexpr (kStored) {
        ckpt.template store<FlushLanes::kCols, FlushLanes::kPairs>(r + k, acc[k], flushes, p.seed, col_slot);
      } else {
        master.template encode<FlushLanes::kCols, FlushLanes::kPairs>(r + k, col_slot, acc[k], nullptr, 0);
      }
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < FlushLanes::kCols; ++e) dot = fmaf(acc[k][e], cv[e], dot);
      dot = rssm::group_sum<FlushLanes::kRowLanes, FlushLanes::kPairs>(dot);
      if (col_slot == 0) {
        const float gate = z ? rssm::siluf(rssm::to_float(z[r + k])) : 1.f;
        out[r + k] = rssm::from_float<act_t>((dot + d_h * rssm::to_float(x_cur[row0 + r + k])) * gate);
      }
    }
  }
}
}  // namespace

// Replay step 3 where the plan keeps flush rows apart (p.flush_apart: the main kernel skips them): each (batch row,
// head) whose row flushes folds its ring and token into a new checkpoint, stores it and writes its outputs
// (flush_head). A flush tile costs the persistent kernel several non-flush ones and holds up the stages behind it;
// here flush heads run side by side on every SM. A programmatic dependent of the main kernel. One CTA per SM at least
// in its launch bounds: without a minimum ptxas gives it too few registers on sm_100 and later (spills).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_replay_flush_kernel(const Mamba2Params p) {
  __shared__ __align__(16) float s_B[rssm::kMaxL][N];
  __shared__ __align__(16) float s_xs[rssm::kMaxL][P];
  rssm::for_each_flush_item(p.step, p.slot_idx, p.pad_slot_id, p.slots, p.batch, p.nheads,
                            [&](int item, int b, int slot, int w) {
                              flush_head(p, b, slot, item - b * p.nheads, w, s_B, s_xs);
                            });
}

#if PT <= P && MASTER_FMT == 0 && READ_FMT == 0 && !SR  // speculative decoding: the persistent verify
namespace {

// One shared-memory stage of the persistent verify for windows of up to kT tokens and rings of R records: the
// checkpoint tile, then what the consumers read of the tile besides it (core/layouts.py mirrors the total, checked
// at compilation). The history's x records are in history order (record j at row j), not ring order.
struct VerifyStageLayout {
  int info, coef, x, z, C, hist, bytes;
};

template <int kT>
__host__ __device__ constexpr VerifyStageLayout verify_stage_layout(int R) {
  VerifyStageLayout l{};
  l.info = kTileBytes;                                          // slot, cursor word, D, tile word
  l.coef = l.info + 16;                                         // VerifyCoef's first (1 + kT)(R + 1) floats
  l.x = l.coef + round16(VerifyCoef::used(R, kT) * 4);          // x of the tile rows, token by token: [kT][PT]
  l.z = l.x + round16(kT * PT * int(sizeof(act_t)));            // z, the same
  l.C = l.z + round16(kT * PT * int(sizeof(act_t)));            // C of the head's group: [kT][N]
  l.hist = l.C + round16(kT * N * int(sizeof(act_t)));          // x of the history records: [R][PT]
  l.bytes = (l.hist + round16(R * PT * int(sizeof(act_t))) + 127) / 128 * 128;
  return l;
}

// Producer warp of the verify (rssm::produce_tiles_claiming_tail): besides slot and cursor word, each tile's D, the
// head's weights, the window's x, z and C, and the x rows of the row's history into its stage; a folding row's
// history B records, in history order, into the fold buffer (every verify plan has one).
template <int kT>
__device__ __forceinline__ void produce_verify(const Mamba2Params& p, rssm::TilePipe& pipe, unsigned char* stage_mem,
                                               int num_tiles, const TileMap& coord) {
  const int lane = threadIdx.x % rssm::kWarpSize;
  const int T = p.window, R = p.L;
  const VerifyStageLayout lay = verify_stage_layout<kT>(R);
  constexpr int kRowBytes = PT * int(sizeof(act_t)), kBBytes = N * int(sizeof(act_t));
  auto state_src = [&](int slot, const TileCoord& c) {
    if (slot == p.pad_slot_id) return static_cast<const void*>(nullptr);
    return static_cast<const void*>(static_cast<const state_t*>(p.state) + slot * p.s_state_slot +
                                    c.head * p.s_state_head + (long long)c.row0 * N);
  };
  int folds = 0;
  unsigned char* fold_buf = stage_mem + (long long)p.stages * p.stage_bytes;
  // The short rows (window tokens' C, x and z, ring records) go as 16-byte chunks over the warp's lanes
  // (rssm::cp_async_pieces): a bulk copy per row cost the producer more than the consumers spend on a tile.
  auto copy_inputs = [&](unsigned char* stage, const TileCoord& c, int slot, int word, unsigned long long*) {
    const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
    if (p.D && lane == 0) rssm::cp_async4(stage + lay.info + 8, p.D + c.head);
    rssm::cp_async_words(stage + lay.coef, p.coef + c.b * p.s_coef_row + (long long)c.head * VerifyCoef::floats(R),
                         VerifyCoef::used(R, T));
    const act_t* C_b = group_vec(p.C, p.s_C_b, p.s_C_g, c.b, c.group);
    rssm::cp_async_pieces<kBBytes>(stage + lay.C, T, [&](int tok) { return C_b + tok * p.s_C_t; });
    const act_t* x_b = static_cast<const act_t*>(p.x) + c.b * p.s_x_b + c.head * p.s_x_h + c.row0;
    rssm::cp_async_pieces<kRowBytes>(stage + lay.x, T, [&](int tok) { return x_b + tok * p.s_x_t; });
    if (p.z) {
      const act_t* z_b = static_cast<const act_t*>(p.z) + c.b * p.s_z_b + c.head * p.s_z_h + c.row0;
      rssm::cp_async_pieces<kRowBytes>(stage + lay.z, T, [&](int tok) { return z_b + tok * p.s_z_t; });
    }
    const act_t* x_ring = x_ring_at(p, slot, c.head) + c.row0;
    rssm::cp_async_pieces<kRowBytes>(stage + lay.hist, cur.count,
                                     [&](int j) { return x_ring + (long long)cur.position(j, R) * P; });
    if (cur.folds_before(T, R)) {
      rssm::fold_buffer_acquire(pipe, folds++);
      const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + c.group * p.s_Br_group;
      rssm::cp_async_pieces<kBBytes>(fold_buf, cur.count,
                                     [&](int j) { return B_ring + (long long)cur.position(j, R) * N; });
      rssm::cp_async_arrive(&pipe.fold_full);
    }
  };
  rssm::produce_tiles_claiming_tail(pipe, stage_mem, p.stages, p.stage_bytes, num_tiles, kTileBytes, p.slot_idx,
                                    p.step, p.pad_slot_id, p.slots, p.tail_start, p.step - 1, coord, state_src,
                                    copy_inputs);
}

// State rows a verify's fold updates at once (registers beside its B columns).
constexpr int kVerifyFoldRows = kRowsPerWarp < 4 ? kRowsPerWarp : 4;

// The verify's row dots: a row's columns over kLanes lanes (kCols each, 64 / kT up to 16, so that every window
// token's C columns stay in 64 registers, and at most N / kT, so that a row has a lane per token), kGroups rows at
// once per warp, a lane's columns in 4-column chunks (rssm::group_chunk_col). The kT dots of a row reduce over its
// lanes by one transposed reduction (rssm::warp_sum_scatter<kT, kLanes>), a quarter of the shuffles a 32-lane row
// needs.
template <int kT>
struct VerifyDots {
  static constexpr int kWide = 64 / kT < 16 ? 64 / kT : 16;
  static constexpr int kCols = kWide < N / kT ? kWide : N / kT, kLanes = N / kCols;
  static constexpr int kGroups = rssm::kWarpSize / kLanes;
  static constexpr int kChunks = kCols / 4, kPasses = (kRowsPerWarp + kGroups - 1) / kGroups;
  static_assert(kCols % 4 == 0 && N % kCols == 0 && rssm::kWarpSize % kLanes == 0 && kT <= kLanes,
                "verify row dots: 4-column chunks, a row's lanes within the warp, kT <= lanes per row");
  __device__ static int col(int c, int i) { return rssm::group_chunk_col<kLanes>(c, i); }
};

// Every window token's S·C_t of this warp's kRowsPerWarp rows (`rows`: the warp's first row in the stage, as stored)
// into dots[r * kT + t] (the warp's own rows' bytes: the dots of row r end within the bytes of rows <= r). `C`: the
// stage's [kT][N] window columns; tokens >= T get zeros.
template <int kT>
__device__ __forceinline__ void verify_row_dots(const state_t* rows, const act_t* C, int T, float* dots) {
  using D = VerifyDots<kT>;
  const int lane = threadIdx.x % rssm::kWarpSize, g = lane / D::kLanes, c = lane % D::kLanes;
  float cv[kT][D::kCols];
#pragma unroll
  for (int tok = 0; tok < kT; ++tok)
#pragma unroll
    for (int i = 0; i < D::kChunks; ++i) {
      float v4[4];
      if (tok < T) {
        rssm::load_vec<act_t, 4>(C + tok * N + D::col(c, i), v4);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v4[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) cv[tok][i * 4 + e] = v4[e];
    }
  constexpr int kAtOnce = D::kPasses < 2 ? D::kPasses : 2;  // passes whose reductions interleave
#pragma unroll
  for (int p0 = 0; p0 < D::kPasses; p0 += kAtOnce) {
    float total[kAtOnce];
#pragma unroll
    for (int q = 0; q < kAtOnce; ++q) {
      const int r = (p0 + q) * D::kGroups + g;
      float part[kT];
#pragma unroll
      for (int tok = 0; tok < kT; ++tok) part[tok] = 0.f;
      if (p0 + q < D::kPasses && r < kRowsPerWarp) {
#pragma unroll
        for (int i = 0; i < D::kChunks; ++i) {
          float v4[4];
          rssm::load_vec<state_t, 4>(rows + r * N + D::col(c, i), v4);
#pragma unroll
          for (int tok = 0; tok < kT; ++tok)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[tok] = fmaf(v4[e], cv[tok][i * 4 + e], part[tok]);
        }
      }
      total[q] = rssm::warp_sum_scatter<kT, D::kLanes>(part);
    }
    __syncwarp();  // every lane has read the rows whose bytes the dots below overwrite
#pragma unroll
    for (int q = 0; q < kAtOnce; ++q) {
      const int r = (p0 + q) * D::kGroups + g;
      if (p0 + q < D::kPasses && r < kRowsPerWarp && c < kT) dots[r * kT + c] = total[q];
    }
  }
}

// One consumer warp's rows of a verify tile (stage complete): every window token's S·C_t of each row, S the
// checkpoint or, for a folding row, S = decay S0 + Σ_{j<count} s_j x_j B_jᵀ (stored, written back into the stage as
// stored, then read from there); then y_t = gate_t (decay_t S·C_t + Σ_l w[t][l] x_{base + l} + D x_t) and the
// window's x records. The dots go into the warp's own rows of the stage's checkpoint tile once those are read.
// Releases the stage.
template <int kT>
__device__ __forceinline__ void verify_tile(const Mamba2Params& p, const TileCoord& c, unsigned char* stage,
                                            rssm::TilePipe& pipe, int s, const act_t* fold_buf, int& folds) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int T = p.window, R = p.L, wrow0 = warp * kRowsPerWarp;
  const VerifyStageLayout lay = verify_stage_layout<kT>(R);
  const int* info_words = reinterpret_cast<const int*>(stage + lay.info);
  const int slot = info_words[0], word = info_words[1];  // word: stale for a pad row (not read then)
  act_t* out = static_cast<act_t*>(p.out) + c.b * p.s_out_b + c.head * p.s_out_h + c.row0 + wrow0;
  if (rssm::skipped_stage_row(slot, word, p.pad_slot_id, p.slots)) {
    rssm::release_stage(pipe, s);
    for (int i = lane; i < T * kRowsPerWarp; i += rssm::kWarpSize)
      out[(i / kRowsPerWarp) * p.s_out_t + i % kRowsPerWarp] = rssm::from_float<act_t>(0.f);
    return;
  }
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  const int count = cur.count;
  const bool fold = cur.folds_before(T, R);
  const float* coef = reinterpret_cast<const float*>(stage + lay.coef);
  const act_t* x_s = reinterpret_cast<const act_t*>(stage + lay.x);
  const act_t* z_s = reinterpret_cast<const act_t*>(stage + lay.z);
  const act_t* hist = reinterpret_cast<const act_t*>(stage + lay.hist);
  state_t* rows = reinterpret_cast<state_t*>(stage) + wrow0 * N;
  float* dots = reinterpret_cast<float*>(stage + wrow0 * N * int(sizeof(state_t)));  // [kRowsPerWarp][kT]
  if (fold) {
    rssm::fold_buffer_wait(pipe, folds);
    const float* fold_w = VerifyCoef::fold(coef, R);
    const float decay = fold_w[R], sj = lane < count ? fold_w[lane] : 0.f;
    state_t* dst = static_cast<state_t*>(p.state) + slot * p.s_state_slot + c.head * p.s_state_head +
                   (long long)(c.row0 + wrow0) * N + lane * kEpl;
#pragma unroll
    for (int r0 = 0; r0 < kRowsPerWarp; r0 += kVerifyFoldRows) {
      float acc[kVerifyFoldRows][kEpl], xs[kVerifyFoldRows];  // xs: s_j x_j[row] on lane j
#pragma unroll
      for (int r = 0; r < kVerifyFoldRows; ++r) {
        if (r0 + r >= kRowsPerWarp) break;
        xs[r] = lane < count ? sj * rssm::to_float(hist[lane * PT + wrow0 + r0 + r]) : 0.f;
        rssm::load_vec<state_t, kEpl>(rows + (r0 + r) * N + lane * kEpl, acc[r]);
#pragma unroll
        for (int e = 0; e < kEpl; ++e) acc[r][e] *= decay;
      }
      for (int j = 0; j < count; ++j) {
        float bv[kEpl];
        rssm::load_vec<act_t, kEpl>(fold_buf + j * N + lane * kEpl, bv);
#pragma unroll
        for (int r = 0; r < kVerifyFoldRows; ++r) {
          if (r0 + r >= kRowsPerWarp) break;
          const float xsr = __shfl_sync(0xffffffffu, xs[r], j);
#pragma unroll
          for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(xsr, bv[e], acc[r][e]);
        }
      }
#pragma unroll
      for (int r = 0; r < kVerifyFoldRows; ++r) {
        if (r0 + r >= kRowsPerWarp) break;
        rssm::store_vec<state_t, kEpl>(dst + (r0 + r) * N, acc[r]);
        rssm::store_vec<state_t, kEpl>(rows + (r0 + r) * N + lane * kEpl, acc[r]);  // as stored, for the dots
      }
    }
    rssm::fold_buffer_release(pipe);  // after its __syncwarp every lane's folded rows are in the stage
    ++folds;
  }
  verify_row_dots<kT>(rows, reinterpret_cast<const act_t*>(stage + lay.C), T, dots);
  __syncwarp();
  // Outputs and the window's x records, a lane per (token, row).
  const int base = fold ? count : 0;
  const rssm::SpecCursor after{fold ? cur.position(count, R) : cur.origin, fold ? 0 : count};
  const float d_h = p.D ? reinterpret_cast<const float*>(stage + lay.info)[2] : 0.f;
  act_t* x_dst = static_cast<act_t*>(p.x_ring) + slot * p.s_xr_slot + c.head * p.s_xr_head + c.row0 + wrow0;
  for (int i = lane; i < T * kRowsPerWarp; i += rssm::kWarpSize) {
    const int tok = i / kRowsPerWarp, r = i % kRowsPerWarp, row = wrow0 + r;
    const float* w = VerifyCoef::w(coef, R, tok);
    // The history's records (warp-uniform bounds), then the window's up to this token, in two independent sums.
    float y = w[R] * dots[r * kT + tok], y2 = 0.f;
    const float* wh = w - base;
    int j = base;
#pragma unroll 2
    for (; j + 1 < count; j += 2) {
      y = fmaf(wh[j], rssm::to_float(hist[j * PT + row]), y);
      y2 = fmaf(wh[j + 1], rssm::to_float(hist[(j + 1) * PT + row]), y2);
    }
    if (j < count) y = fmaf(wh[j], rssm::to_float(hist[j * PT + row]), y);
    const float* ww = w + (count - base);
    for (int t = 0; t <= tok; ++t) y2 = fmaf(ww[t], rssm::to_float(x_s[t * PT + row]), y2);
    y += y2;
    const act_t xt = x_s[tok * PT + row];
    y = fmaf(d_h, rssm::to_float(xt), y);
    if (p.z) y *= rssm::siluf(rssm::to_float(z_s[tok * PT + row]));
    out[tok * p.s_out_t + r] = rssm::from_float<act_t>(y);
    x_dst[(long long)after.position(after.count + tok, R) * P + r] = xt;
  }
  rssm::release_stage(pipe, s);
}

template <int kT>
__device__ __forceinline__ void verify_main(const Mamba2Params& p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  const int num_tiles = p.batch * p.nheads * (P / PT);
  const TileMap coord(p);
  if (p.fold_bytes < fold_buffer_bytes(p.L)) __trap();  // every verify plan has a fold buffer
  rssm::persistent_main<true>(pipe, stage_mem, p.stages, p.stage_bytes, verify_stage_layout<kT>(p.L).bytes,
                              num_tiles, p.tail_start, kTileBytes,
                              [&] { produce_verify<kT>(p, pipe, stage_mem, num_tiles, coord); },
                              [&](int t, unsigned char* stage, int s, const unsigned char* fold_buf, int& folds) {
                                verify_tile<kT>(p, coord(t), stage, pipe, s,
                                                reinterpret_cast<const act_t*>(fold_buf), folds);
                              });
#endif
}

}  // namespace

// Verify step 2, persistent, for windows of up to 2, 4 and 8 tokens (the host takes the smallest that holds T): the
// replay main kernel's schedule (a producer warp streaming checkpoint tiles and their inputs into shared-memory
// stages, a programmatic dependent of the verify prep kernel) over verify tiles. Requires sm_90+.
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, 3)
    mamba2_verify_main_t2_kernel(const Mamba2Params p) { verify_main<2>(p); }
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, 3)
    mamba2_verify_main_t4_kernel(const Mamba2Params p) { verify_main<4>(p); }
extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, 3)
    mamba2_verify_main_t8_kernel(const Mamba2Params p) { verify_main<8>(p); }

#endif

#if PT == P && MASTER_FMT == 0 && READ_FMT == 0 && !SR  // the streaming one-launch replay: plain whole-head modules
namespace {

constexpr int kStreamTileBytes = P * N * int(sizeof(state_t));  // one head's checkpoint: a stage
constexpr int kStreamMaxHeads = 16;  // heads per CTA (core/plans.py FUSED_STREAM_MAX_HEADS mirrors it)
static_assert(kStreamTileBytes % 16 == 0, "a head's checkpoint moves by one bulk copy");
static_assert(P * sizeof(act_t) % 4 == 0, "x rows move by 4-byte async copies");

// The streaming replay's dynamic shared memory: `stages` head checkpoints, then for the CTA's `heads` heads their x
// ring rows j < L - 1 ([heads][L-1][P], the activation dtype) and their Δ rings ([heads][L-1], fp32)
// (core/layouts.py mamba2_stream_records_bytes mirrors the records' part).
struct StreamLayout {
  int x_ring, dt_ring, bytes;
};

__host__ __device__ constexpr StreamLayout stream_layout(int stages, int heads, int L) {
  StreamLayout l{};
  l.x_ring = stages * kStreamTileBytes;
  l.dt_ring = l.x_ring + round16(heads * (L - 1) * P * int(sizeof(act_t)));
  l.bytes = l.dt_ring + round16(heads * (L - 1) * 4);
  return l;
}

__device__ __forceinline__ act_t* out_row(const Mamba2Params& p, int b, int h) {
  return static_cast<act_t*>(p.out) + b * p.s_out_b + h * p.s_out_h;
}

}  // namespace

// One-launch replay streaming whole heads (a `fused` plan with stages): grid (nheads / k, 1, batch); CTA (x, b) takes
// the k = nheads / gridDim.x consecutive heads h0 = x k ... of batch row b, all of one group. Thread 0 brings each
// head's checkpoint into one of `p.stages` shared-memory stages by one bulk copy, `stages` heads ahead of the head in
// work. Beside the first copies every thread copies the records a step can read (the group's B ring, the heads' x and Δ
// rings) to shared memory, before the cursor is known; B_j·C is taken once for the group and every head's weights once.
// Then head by head: a non-flush step y = decay S0·C + Σ_{j<=w} s_j (B_j·C) x_j + D x from the stage, appending x and Δ
// (B by the CTA of the group's first head); a flush S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ from the stage, stored, y =
// S·C + D x. The row's cursor moves when its last CTA arrives. Where the plan says so (p.l2_hints), the CTA first asks
// L2 for the guessed slot's first `stages` heads and its records (rssm::guessed_slot), then waits for the kernel
// before. Plain checkpoints whose head rows are contiguous and 16-byte aligned (the planner checks); requires sm_90+
// (the planner refuses older GPUs).
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_fused_stream_kernel(const Mamba2Params p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stream_mem[];
  __shared__ unsigned long long full[rssm::kMaxStages];
  __shared__ __align__(16) act_t s_B[rssm::kMaxL][N];  // the group's B ring rows, the token's B at row w
  __shared__ __align__(16) float s_xs[rssm::kMaxL][P];  // a flush: s_j x_j of the head's rows
  __shared__ float s_bc[rssm::kMaxL];                   // B_j · C
  __shared__ float s_w[kStreamMaxHeads][rssm::kMaxL];   // per head: s_0 .. s_w
  __shared__ float s_decay[kStreamMaxHeads], s_delta[kStreamMaxHeads];
  __shared__ __align__(16) float s_x[kStreamMaxHeads][P], s_gate[kStreamMaxHeads][P];
  __shared__ OutStage st;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int heads = p.nheads / gridDim.x, h0 = blockIdx.x * heads, b = blockIdx.z;
  const int group = h0 / (p.nheads / p.ngroups);
  const int stages = min(p.stages, heads);
  const StreamLayout lay = stream_layout(p.stages, heads, p.L);
  if (heads > kStreamMaxHeads || stages > rssm::kMaxStages) __trap();  // the planner's bounds
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) rssm::mbar_init(&full[s], 1);
    rssm::mbar_init_fence();
  }
  const int n = p.L - 1;  // ring positions a step can read
  if (p.l2_hints) {  // before the wait: L2 hints for the guessed slot's first heads and records (rssm::guessed_slot)
    const int guess = rssm::guessed_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
    if (guess != p.pad_slot_id) {
      const state_t* first = static_cast<const state_t*>(p.state) + guess * p.s_state_slot + h0 * p.s_state_head;
      for (int s = warp; s < stages; s += rssm::kNumWarps)
        rssm::prefetch_l2(first + s * p.s_state_head, kStreamTileBytes);
      if (warp == 0)
        rssm::prefetch_l2(static_cast<const act_t*>(p.B_ring) + guess * p.s_Br_slot + group * p.s_Br_group,
                          n * N * int(sizeof(act_t)));
      for (int hl = warp; hl < heads; hl += rssm::kNumWarps) {
        rssm::prefetch_l2(x_ring_at(p, guess, h0 + hl), n * P * int(sizeof(act_t)));
        if (lane == 0) rssm::prefetch_line_l2(p.dt_ring + guess * p.s_dtr_slot + (h0 + hl) * p.s_dtr_head);
      }
      if (threadIdx.x == 0) rssm::prefetch_line_l2(p.cursor + guess);
    }
  }
  rssm::wait_previous_grid();
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  __syncthreads();  // the barriers are initialised
  if (slot == p.pad_slot_id) {
    for (int hl = 0; hl < heads; ++hl) zero_pad_output(p, b, h0 + hl, 0);
    return;
  }
  const state_t* ckpt = static_cast<const state_t*>(p.state) + slot * p.s_state_slot + h0 * p.s_state_head;
  if (threadIdx.x == 0)
    for (int s = 0; s < stages; ++s) {
      rssm::mbar_arrive_expect_tx(&full[s], kStreamTileBytes);
      rssm::bulk_load(stream_mem + s * kStreamTileBytes, ckpt + s * p.s_state_head, kStreamTileBytes, &full[s]);
    }
  // The records at every position a step can read (j < L - 1), before the cursor is known.
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + group * p.s_Br_group;
  for (int i = threadIdx.x; i < n * N * int(sizeof(act_t)) / 4; i += rssm::kThreads)
    rssm::cp_async4(reinterpret_cast<unsigned*>(&s_B[0][0]) + i, reinterpret_cast<const unsigned*>(B_ring) + i);
  act_t* x_ring_s = reinterpret_cast<act_t*>(stream_mem + lay.x_ring);  // [heads][n][P]
  float* dt_ring_s = reinterpret_cast<float*>(stream_mem + lay.dt_ring);  // [heads][n]
  constexpr int kRowWords = P * int(sizeof(act_t)) / 4;
  for (int i = threadIdx.x; i < heads * n * kRowWords; i += rssm::kThreads) {
    const int row = i / kRowWords, word = i % kRowWords, hl = row / n, j = row % n;
    rssm::cp_async4(reinterpret_cast<unsigned*>(x_ring_s + row * P) + word,
                    reinterpret_cast<const unsigned*>(x_ring_at(p, slot, h0 + hl) + (long long)j * P) + word);
  }
  for (int i = threadIdx.x; i < heads * n; i += rssm::kThreads)
    rssm::cp_async4(dt_ring_s + i, p.dt_ring + slot * p.s_dtr_slot + (h0 + i / n) * p.s_dtr_head + i % n);
  rssm::cp_async_commit();

  const int cursor = p.cursor[slot];
  const bool bad_cursor = !rssm::cursor_in_ring(cursor, p.L);
  const int w = bad_cursor ? 0 : cursor;
  const bool flush = w >= p.L - 1;
  const int first_id = rssm::preload_row_id(p.slot_idx, b, threadIdx.x);
  // The token's inputs: B (element threadIdx.x + k kThreads), C (this lane's columns), Δ, x and the gate per head.
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, b, group);
  constexpr int kBPerThread = (N + rssm::kThreads - 1) / rssm::kThreads;
  act_t b_cur[kBPerThread];
#pragma unroll
  for (int k = 0; k < kBPerThread; ++k) {
    const int e = threadIdx.x + k * rssm::kThreads;
    if (e < N) b_cur[k] = B_cur[e];
  }
  float cv[kEpl];
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, b, group) + lane * kEpl, cv);
  if (threadIdx.x < heads) s_delta[threadIdx.x] = current_delta(p, b, h0 + threadIdx.x);
  for (int i = threadIdx.x; i < heads * P; i += rssm::kThreads) {
    const int h = h0 + i / P, row = i % P;
    s_x[i / P][row] = rssm::to_float(static_cast<const act_t*>(p.x)[b * p.s_x_b + h * p.s_x_h + row]);
    s_gate[i / P][row] =
        p.z ? rssm::siluf(rssm::to_float(static_cast<const act_t*>(p.z)[b * p.s_z_b + h * p.s_z_h + row])) : 1.f;
  }
  rssm::cp_async_wait_all();
  const bool skip = __syncthreads_or(bad_cursor ||
                                     rssm::earlier_row_has(p.slot_idx, b, slot, threadIdx.x, rssm::kThreads, first_id));
  if (skip) {  // a repeated slot's row or a cursor outside the ring: zero outputs, nothing written
    for (int hl = 0; hl < heads; ++hl) zero_pad_output(p, b, h0 + hl, 0);
    for (int s = 0; s < stages; ++s) rssm::mbar_wait(&full[s], 0);  // no copy outlives the CTA
    return;
  }
#pragma unroll
  for (int k = 0; k < kBPerThread; ++k) {  // entry w: the token (after the staged ring row w)
    const int e = threadIdx.x + k * rssm::kThreads;
    if (e < N) s_B[w][e] = b_cur[k];
  }
  for (int hl = warp; hl < heads; hl += rssm::kNumWarps)  // every head's weights s_0 .. s_w and decay
    stage_fold_weights(lane < w ? dt_ring_s[hl * n + lane] : (lane == w ? s_delta[hl] : 0.f), p.A[h0 + hl], w, lane,
                       s_w[hl], s_decay[hl]);
  __syncthreads();  // s_B row w
  if (!flush) {
    for (int j = warp; j <= w; j += rssm::kNumWarps) {  // B_j · C, once for the group
      float bv[kEpl];
      rssm::load_vec<act_t, kEpl>(&s_B[j][lane * kEpl], bv);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(bv[e], cv[e], dot);
      dot = rssm::warp_sum(dot);
      if (lane == 0) s_bc[j] = dot;
    }
  }
  const int arrived_before = threadIdx.x == 0 ? rssm::cta_arrival(p.arrive, slot) : -1;  // answered at the end
  Tile t{};  // this warp's rows of the head in work: where a flush stores them (store_row), warp and lane
  t.warp = warp;
  t.lane = lane;
  const int r0 = warp * kRowsPerWarp;
  for (int hl = 0; hl < heads; ++hl) {
    const int s = hl % stages, h = h0 + hl;
    const int i = threadIdx.x;
    const float d_h = p.D ? p.D[h] : 0.f;
    if (flush)
      for (int q = i; q < (w + 1) * P; q += rssm::kThreads) {
        const int j = q / P, row = q % P;
        s_xs[j][row] = s_w[hl][j] * (j < w ? rssm::to_float(x_ring_s[(hl * n + j) * P + row]) : s_x[hl][row]);
      }
    rssm::mbar_wait(&full[s], (hl / stages) & 1);
    __syncthreads();  // s_xs (a flush), s_bc and the weights (the first head)
    const auto* rows = reinterpret_cast<const typename RawVec::Raw*>(stream_mem + s * kStreamTileBytes) +
                       (r0 * N + lane * kEpl) / RawVec::kPerChunk;
    RawTile raw;  // this warp's rows of the stage, as the one-launch replay holds its tile
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int c = 0; c < RawVec::kChunks; ++c) raw[r][c] = rows[r * (N / RawVec::kPerChunk) + c];
    if (flush) {
      t.state = static_cast<state_t*>(p.state) + slot * p.s_state_slot + h * p.s_state_head + (long long)r0 * N +
                lane * kEpl;
      fold_staged_rows(p, t, raw, cv, s_B, s_xs, s_decay[hl], w, st);
    } else {
      float cvd[kEpl];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) cvd[e] = s_decay[hl] * cv[e];
      stage_checkpoint_dots(t, raw, cvd, st, t.master);
    }
    __syncthreads();  // every warp has read stage s; the rows' dots are staged
    if (threadIdx.x == 0 && hl + stages < heads) {  // the stage's next head
      rssm::mbar_arrive_expect_tx(&full[s], kStreamTileBytes);
      rssm::bulk_load(stream_mem + s * kStreamTileBytes, ckpt + (hl + stages) * p.s_state_head, kStreamTileBytes,
                      &full[s]);
    }
    if (i < P) {
      const float x = s_x[hl][i];
      float extra = d_h * x;
      if (!flush) {  // Σ_{j<=w} s_j (B_j·C) x_j
        float ring = s_w[hl][w] * s_bc[w] * x;
        for (int j = 0; j < w; ++j)
          ring = fmaf(s_w[hl][j] * s_bc[j], rssm::to_float(x_ring_s[(hl * n + j) * P + i]), ring);
        extra += ring;
        static_cast<act_t*>(p.x_ring)[slot * p.s_xr_slot + h * p.s_xr_head + (long long)w * P + i] =
            rssm::from_float<act_t>(x);
      }
      out_row(p, b, h)[i] = rssm::from_float<act_t>((st.dot[i] + extra) * s_gate[hl][i]);
    }
    if (!flush && i == 0) p.dt_ring[slot * p.s_dtr_slot + h * p.s_dtr_head + w] = s_delta[hl];
  }
  if (!flush && h0 % (p.nheads / p.ngroups) == 0) {  // one B record per group
    act_t* B_dst = static_cast<act_t*>(p.B_ring) + slot * p.s_Br_slot + group * p.s_Br_group + (long long)w * N;
    for (int e = threadIdx.x; e < N; e += rssm::kThreads) B_dst[e] = B_cur[e];
  }
  if (threadIdx.x == 0)
    rssm::advance_if_last(arrived_before, p.cursor, p.arrive, slot, gridDim.x, flush ? 0 : w + 1);
#endif
}

#endif
