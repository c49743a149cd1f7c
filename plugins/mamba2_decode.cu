// Mamba-2 single-token decode: the baseline state update and the ReplaySSM replay decode.
//
// Compile-time constants (NVRTC -D): P (head_dim), N (d_state), PT (state rows per CTA), STATE_T, ACT_T.
// Grid: (P / PT, nheads, batch); 128 threads. Each warp owns PT/4 rows of the (P x N) state tile of one head; each lane
// owns N/32 consecutive columns. Row p of the state is touched by exactly one warp, so the whole update is row-local.
//
// Replay (per row at cursor w, per head, with Δ_j from the ring for j < w and Δ_w of the current token):
//   ex_j = Σ_{j<i<=w} Δ_i,  tot = Σ_{i<=w} Δ_i,  s_j = Δ_j exp(A ex_j),  decay = exp(A tot)
//   non-flush: y = decay (S0 · C) + Σ_{j<=w} s_j (B_j · C) x_j + D x  ; append (x, Δ, B) at ring position w
//   flush:     S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ ; store S ; y = S · C + D x
#include "replayssm_common.cuh"

#ifndef P
#error "define P (head_dim)"
#endif

using state_t = STATE_T;
using act_t = ACT_T;

// Kernel parameters (one by-value struct; mirrored by trtllm_replayssm/ops/mamba2.py:_Mamba2Params).
struct Mamba2Params {
  void* state;            // [slots, H, P, N]
  void* x_ring;           // [slots, H, L, P]   (replay only)
  float* dt_ring;         // [slots, H, L]      (replay only)
  void* B_ring;           // [slots, G, L, N]   (replay only)
  int* cursor;            // [slots]            (replay only)
  int* arrive;            // [slots]            (replay only)
  const void* x;          // [b, H, P]
  const void* dt;         // [b, H]  (act dtype or fp32, see dt_is_f32)
  const float* A;         // [H]
  const void* B;          // [b, G, N]
  const void* C;          // [b, G, N]
  const float* D;         // [H] or null
  const void* z;          // [b, H, P] or null
  const float* dt_bias;   // [H] or null
  const int* slot_idx;    // [b]
  void* out;              // [b, H, P]
  long long s_state_slot, s_state_head;
  long long s_xr_slot, s_xr_head;
  long long s_dtr_slot, s_dtr_head;
  long long s_Br_slot, s_Br_group;
  long long s_x_b, s_x_h, s_dt_b, s_dt_h, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_out_b, s_out_h;
  int nheads, ngroups, L, pad_slot_id;
  int dt_softplus, dt_is_f32, force_flush, pad0;
};

namespace {

constexpr int kEpl = N / rssm::kWarpSize;     // state columns per lane
constexpr int kRowsPerWarp = PT / rssm::kNumWarps;
constexpr int kChunkL = 16;                     // ring entries staged in shared memory per flush chunk
static_assert(N % rssm::kWarpSize == 0, "d_state must be a multiple of 32");
static_assert(PT % rssm::kNumWarps == 0 && P % PT == 0, "row tile must divide head_dim and be a multiple of 4");



struct RowContext {
  int slot, head, group, row0;  // row0: first state row of this CTA's tile
};

__device__ __forceinline__ bool setup_row(const Mamba2Params& p, RowContext& ctx) {
  const int b = blockIdx.z;
  ctx.slot = p.slot_idx[b];
  if (ctx.slot == p.pad_slot_id) return false;
  ctx.head = blockIdx.y;
  ctx.group = ctx.head / (p.nheads / p.ngroups);
  ctx.row0 = blockIdx.x * PT;
  return true;
}

__device__ __forceinline__ float current_delta(const Mamba2Params& p, int b, int h) {
  const long long off = b * p.s_dt_b + h * p.s_dt_h;
  float dt = p.dt_is_f32 ? static_cast<const float*>(p.dt)[off] : rssm::to_float(static_cast<const act_t*>(p.dt)[off]);
  if (p.dt_bias) dt += p.dt_bias[h];
  return p.dt_softplus ? rssm::softplus_thr20(dt) : dt;
}

// Loads this warp's rows of the state tile (fp32 registers), streaming (read-once) loads.
__device__ __forceinline__ void load_state_tile(const state_t* __restrict__ tile, int warp, int lane,
                                                float (&acc)[kRowsPerWarp][kEpl]) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    rssm::load_vec<state_t, kEpl, true>(tile + (warp * kRowsPerWarp + r) * N + lane * kEpl, acc[r]);
}

__device__ __forceinline__ void store_state_tile(state_t* __restrict__ tile, int warp, int lane,
                                                 const float (&acc)[kRowsPerWarp][kEpl]) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) rssm::store_vec<state_t, kEpl>(tile + (warp * kRowsPerWarp + r) * N + lane * kEpl, acc[r]);
}

// y for this warp's rows = Σ_n acc[r][n] C[n] (+ per-row extra), then D skip and z gate; lane 0 stores.
__device__ __forceinline__ void finish_output(const Mamba2Params& p, const RowContext& ctx, int b, int warp, int lane,
                                              float (&partial)[kRowsPerWarp], const float (&x_rows)[kRowsPerWarp]) {
  act_t* out = static_cast<act_t*>(p.out) + b * p.s_out_b + ctx.head * p.s_out_h + ctx.row0 + warp * kRowsPerWarp;
  const act_t* z = p.z ? static_cast<const act_t*>(p.z) + b * p.s_z_b + ctx.head * p.s_z_h + ctx.row0 + warp * kRowsPerWarp
                       : nullptr;
  const float d = p.D ? p.D[ctx.head] : 0.f;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) partial[r] = rssm::warp_sum(partial[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float y = partial[r] + d * x_rows[r];
      if (z) y *= rssm::siluf(rssm::to_float(z[r]));
      out[r] = rssm::from_float<act_t>(y);
    }
  }
}

__device__ __forceinline__ void load_x_rows(const Mamba2Params& p, const RowContext& ctx, int b, int warp,
                                            float (&x_rows)[kRowsPerWarp]) {
  const act_t* x = static_cast<const act_t*>(p.x) + b * p.s_x_b + ctx.head * p.s_x_h + ctx.row0 + warp * kRowsPerWarp;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) x_rows[r] = rssm::to_float(x[r]);
}

}  // namespace

// Baseline: S = exp(A Δ) S + Δ x Bᵀ ; y = S C + D x (⊙ silu z). Reads and writes the whole state every step.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_state_update_kernel(const Mamba2Params p) {
  RowContext ctx;
  if (!setup_row(p, ctx)) return;
  const int b = blockIdx.z, warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  state_t* tile = static_cast<state_t*>(p.state) + ctx.slot * p.s_state_slot + ctx.head * p.s_state_head + ctx.row0 * N;

  float acc[kRowsPerWarp][kEpl];
  load_state_tile(tile, warp, lane, acc);

  float bv[kEpl], cv[kEpl], x_rows[kRowsPerWarp];
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.B) + b * p.s_B_b + ctx.group * p.s_B_g + lane * kEpl, bv);
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.C) + b * p.s_C_b + ctx.group * p.s_C_g + lane * kEpl, cv);
  load_x_rows(p, ctx, b, warp, x_rows);
  const float delta = current_delta(p, b, ctx.head);
  const float decay = __expf(p.A[ctx.head] * delta);

  float partial[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float u = delta * x_rows[r];
    partial[r] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      acc[r][e] = fmaf(decay, acc[r][e], u * bv[e]);
      partial[r] = fmaf(acc[r][e], cv[e], partial[r]);
    }
  }
  store_state_tile(tile, warp, lane, acc);
  finish_output(p, ctx, b, warp, lane, partial, x_rows);
}

// Replay decode: rows at their own cursors in one launch; flush rows fold the ring, the others never write the state.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_replay_decode_kernel(const Mamba2Params p) {
  RowContext ctx;
  if (!setup_row(p, ctx)) return;
  const int b = blockIdx.z, warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int head = ctx.head;
  state_t* tile = static_cast<state_t*>(p.state) + ctx.slot * p.s_state_slot + head * p.s_state_head + ctx.row0 * N;

  // Issue the big state loads first; everything below overlaps with them.
  float acc[kRowsPerWarp][kEpl];
  load_state_tile(tile, warp, lane, acc);

  const int w = p.cursor[ctx.slot];
  const bool flush = p.force_flush || w >= p.L - 1;

  __shared__ float s_coef[rssm::kMaxL];   // non-flush: s_j (B_j·C); flush: s_j
  __shared__ float s_decay;
  __shared__ float s_Bt[kChunkL][N];      // flush: B_j staged as fp32
  __shared__ float s_xs[kChunkL][PT];     // flush: s_j x_j[row] staged

  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + ctx.slot * p.s_Br_slot + ctx.group * p.s_Br_group;
  const act_t* x_ring = static_cast<const act_t*>(p.x_ring) + ctx.slot * p.s_xr_slot + head * p.s_xr_head;
  const act_t* B_cur = static_cast<const act_t*>(p.B) + b * p.s_B_b + ctx.group * p.s_B_g;
  const act_t* x_cur = static_cast<const act_t*>(p.x) + b * p.s_x_b + head * p.s_x_h;

  float cv[kEpl], x_rows[kRowsPerWarp];
  rssm::load_vec<act_t, kEpl>(static_cast<const act_t*>(p.C) + b * p.s_C_b + ctx.group * p.s_C_g + lane * kEpl, cv);
  load_x_rows(p, ctx, b, warp, x_rows);
  const float delta_w = current_delta(p, b, head);

  // Warp 0: decay weights s_j from the Δ history (suffix sums, no cancellation).
  if (warp == 0) {
    const float* dt_ring = p.dt_ring + ctx.slot * p.s_dtr_slot + head * p.s_dtr_head;
    const float d = lane < w ? dt_ring[lane] : (lane == w ? delta_w : 0.f);
    const float incl = rssm::warp_suffix_sum(d);                       // Σ_{i>=lane} Δ_i
    const float excl = __shfl_down_sync(0xffffffffu, incl, 1);          // Σ_{i>lane} Δ_i
    const float a = p.A[head];
    if (lane <= w) s_coef[lane] = d * __expf(a * (lane == 31 ? 0.f : excl));
    if (lane == 0) s_decay = __expf(a * incl);
  }
  __syncthreads();  // all threads have read the cursor; s_coef / s_decay ready
  if (threadIdx.x == 0)
    rssm::arrive_and_advance(p.cursor, p.arrive, ctx.slot, gridDim.x * p.nheads, flush ? 0 : w + 1);
  const float decay = s_decay;

  if (!flush) {
    // bc_j = B_j · C for j <= w (one warp per j, strided), folded into s_coef.
#pragma unroll
    for (int k = 0; k < rssm::kMaxL / rssm::kNumWarps; ++k) {
      const int j = warp + k * rssm::kNumWarps;
      if (j <= w) {
        float bv[kEpl];
        rssm::load_vec<act_t, kEpl>((j < w ? B_ring + (long long)j * N : B_cur) + lane * kEpl, bv);
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) dot = fmaf(bv[e], cv[e], dot);
        dot = rssm::warp_sum(dot);
        if (lane == 0) s_coef[j] *= dot;
      }
    }
    __syncthreads();
    // y = decay (S0·C) + Σ_j coef_j x_j ; lane j supplies the ring term of entry j.
    const float coef = lane <= w ? s_coef[lane] : 0.f;
    float partial[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = ctx.row0 + warp * kRowsPerWarp + r;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(acc[r][e], cv[e], dot);
      float xj = 0.f;
      if (lane < w) xj = rssm::to_float(x_ring[(long long)lane * P + row]);
      else if (lane == w) xj = x_rows[r];
      partial[r] = fmaf(decay, dot, coef * xj);
    }
    finish_output(p, ctx, b, warp, lane, partial, x_rows);

    // Append the current token's record at ring position w.
    act_t* x_dst = static_cast<act_t*>(p.x_ring) + ctx.slot * p.s_xr_slot + head * p.s_xr_head + (long long)w * P + ctx.row0;
    for (int i = threadIdx.x; i < PT; i += rssm::kThreads) x_dst[i] = x_cur[ctx.row0 + i];
    if (blockIdx.x == 0 && threadIdx.x == 0) p.dt_ring[ctx.slot * p.s_dtr_slot + head * p.s_dtr_head + w] = delta_w;
    if (blockIdx.x == 0 && head % (p.nheads / p.ngroups) == 0) {
      act_t* B_dst = static_cast<act_t*>(p.B_ring) + ctx.slot * p.s_Br_slot + ctx.group * p.s_Br_group + (long long)w * N;
      for (int i = threadIdx.x; i < N; i += rssm::kThreads) B_dst[i] = B_cur[i];
    }
    return;
  }

  // Flush: S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ, in chunks of kChunkL ring entries staged in shared memory.
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] *= decay;
  for (int j0 = 0; j0 <= w; j0 += kChunkL) {
    const int count = min(kChunkL, w + 1 - j0);
    __syncthreads();  // previous chunk consumed
    for (int i = threadIdx.x; i < count * N; i += rssm::kThreads) {
      const int j = j0 + i / N, n = i % N;
      s_Bt[i / N][n] = rssm::to_float(j < w ? B_ring[(long long)j * N + n] : B_cur[n]);
    }
    for (int i = threadIdx.x; i < count * PT; i += rssm::kThreads) {
      const int j = j0 + i / PT, row = ctx.row0 + i % PT;
      const float xj = rssm::to_float(j < w ? x_ring[(long long)j * P + row] : x_cur[row]);
      s_xs[i / PT][i % PT] = s_coef[j] * xj;
    }
    __syncthreads();
    for (int jj = 0; jj < count; ++jj) {
      float bv[kEpl];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) bv[e] = s_Bt[jj][lane * kEpl + e];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float xs = s_xs[jj][warp * kRowsPerWarp + r];
#pragma unroll
        for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(xs, bv[e], acc[r][e]);
      }
    }
  }
  store_state_tile(tile, warp, lane, acc);
  float partial[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    partial[r] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) partial[r] = fmaf(acc[r][e], cv[e], partial[r]);
  }
  finish_output(p, ctx, b, warp, lane, partial, x_rows);
}
