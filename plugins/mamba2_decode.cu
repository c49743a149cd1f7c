// Mamba-2 single-token decode: baseline state update, ReplaySSM replay decode (prep + main), and flush decode.
//
// Compile-time constants (NVRTC -D): P (head_dim), N (d_state), PT (state rows per CTA), STATE_T, ACT_T.
// State kernels run grid (P / PT, nheads, batch) with 128 threads: each warp owns PT/4 rows of one head's (P x N) state
// tile, each lane N/32 consecutive columns, so every update is row-local and the state is read exactly once.
//
// Replay, for a row at cursor w (Δ_j from the ring for j < w, Δ_w of the current token):
//   ex_j = Σ_{j<i<=w} Δ_i,  tot = Σ_{i<=w} Δ_i,  s_j = Δ_j exp(A ex_j),  decay = exp(A tot)
//   non-flush: y = decay (S0 · C) + Σ_{j<=w} s_j (B_j · C) x_j + D x ; append (x, Δ, B) at ring position w
//   flush:     S = decay S0 + Σ_{j<=w} s_j x_j B_jᵀ ; store S ; y = S · C + D x
// The replay is two launches: `prep` (grid (batch, ngroups)) computes the per-head weights into a per-slot scratch,
// appends Δ/B, advances the cursor; `main` streams the state tile with a short dependency chain (bandwidth bound).
// `flush_decode` (adaptive small-batch mode) is the baseline step with a fold of any pending ring entries.
#include "replayssm_common.cuh"

using state_t = STATE_T;
using act_t = ACT_T;

// Kernel parameters (one by-value struct; mirrored by trtllm_replayssm/ops/mamba2.py:_Mamba2Params).
struct Mamba2Params {
  void* state;            // [slots, H, P, N]
  void* x_ring;           // [slots, H, L, P]
  float* dt_ring;         // [slots, H, L]
  void* B_ring;           // [slots, G, L, N]
  int* cursor;            // [slots]
  int* arrive;            // [slots]
  float* coef;            // [slots, H, L + 1] scratch: weights of the step (index L: decay)
  int* step;              // [slots] scratch: w of the step, or -(w + 1) for a flush
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
  long long s_coef_slot;
  long long s_x_b, s_x_h, s_dt_b, s_dt_h, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_out_b, s_out_h;
  int nheads, ngroups, L, pad_slot_id;
  int dt_softplus, dt_is_f32, force_flush, pad0;
};

namespace {

constexpr int kEpl = N / rssm::kWarpSize;     // state columns per lane
constexpr int kRowsPerWarp = PT / rssm::kNumWarps;
constexpr int kChunkL = 16;                     // ring entries staged in shared memory per fold chunk
static_assert(N % rssm::kWarpSize == 0, "d_state must be a multiple of 32");
static_assert(PT % rssm::kNumWarps == 0 && P % PT == 0, "row tile must divide head_dim and be a multiple of 4");

using StateTile = float[kRowsPerWarp][kEpl];

struct Tile {
  int b, slot, head, group, row0, warp, lane;
  state_t* state;  // first element of this CTA's rows
};

__device__ __forceinline__ bool setup_tile(const Mamba2Params& p, Tile& t) {
  t.b = blockIdx.z;
  t.slot = p.slot_idx[t.b];
  if (t.slot == p.pad_slot_id) return false;
  t.head = blockIdx.y;
  t.group = t.head / (p.nheads / p.ngroups);
  t.row0 = blockIdx.x * PT;
  t.warp = threadIdx.x / rssm::kWarpSize;
  t.lane = threadIdx.x % rssm::kWarpSize;
  t.state = static_cast<state_t*>(p.state) + t.slot * p.s_state_slot + t.head * p.s_state_head +
            (long long)(t.row0 + t.warp * kRowsPerWarp) * N + t.lane * kEpl;
  return true;
}

__device__ __forceinline__ float current_delta(const Mamba2Params& p, int b, int h) {
  const long long off = b * p.s_dt_b + h * p.s_dt_h;
  float dt = p.dt_is_f32 ? static_cast<const float*>(p.dt)[off] : rssm::to_float(static_cast<const act_t*>(p.dt)[off]);
  if (p.dt_bias) dt += p.dt_bias[h];
  return p.dt_softplus ? rssm::softplus_thr20(dt) : dt;
}

__device__ __forceinline__ void load_state(const Tile& t, StateTile& acc) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) rssm::load_vec<state_t, kEpl, true>(t.state + r * N, acc[r]);
}

__device__ __forceinline__ void store_state(const Tile& t, const StateTile& acc) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) rssm::store_vec<state_t, kEpl>(t.state + r * N, acc[r]);
}

__device__ __forceinline__ const act_t* group_vec(const Mamba2Params& p, const void* base, long long sb, long long sg,
                                                  int b, int g) {
  return static_cast<const act_t*>(base) + b * sb + g * sg;
}

__device__ __forceinline__ void load_x_rows(const Mamba2Params& p, const Tile& t, float (&x_rows)[kRowsPerWarp]) {
  const act_t* x = static_cast<const act_t*>(p.x) + t.b * p.s_x_b + t.head * p.s_x_h + t.row0 + t.warp * kRowsPerWarp;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) x_rows[r] = rssm::to_float(x[r]);
}

// partial[r] holds this lane's share of row r's output; reduce, add D x, gate with silu(z), lane 0 stores.
__device__ __forceinline__ void finish_output(const Mamba2Params& p, const Tile& t, float (&partial)[kRowsPerWarp],
                                              const float (&x_rows)[kRowsPerWarp]) {
  const long long rows = t.row0 + t.warp * kRowsPerWarp;
  act_t* out = static_cast<act_t*>(p.out) + t.b * p.s_out_b + t.head * p.s_out_h + rows;
  const act_t* z = p.z ? static_cast<const act_t*>(p.z) + t.b * p.s_z_b + t.head * p.s_z_h + rows : nullptr;
  const float d = p.D ? p.D[t.head] : 0.f;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) partial[r] = rssm::warp_sum(partial[r]);
  if (t.lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float y = partial[r] + d * x_rows[r];
      if (z) y *= rssm::siluf(rssm::to_float(z[r]));
      out[r] = rssm::from_float<act_t>(y);
    }
  }
}

// y = S · C for the (updated) tile in registers.
__device__ __forceinline__ void output_from_state(const Mamba2Params& p, const Tile& t, const StateTile& acc,
                                                  const float (&cv)[kEpl], const float (&x_rows)[kRowsPerWarp]) {
  float partial[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    partial[r] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) partial[r] = fmaf(acc[r][e], cv[e], partial[r]);
  }
  finish_output(p, t, partial, x_rows);
}

// One recurrence step on the tile: S = exp(A Δ) S + Δ x Bᵀ (the baseline update; also a fold with an empty ring).
__device__ __forceinline__ void single_step(StateTile& acc, float decay, float delta, const float (&bv)[kEpl],
                                            const float (&x_rows)[kRowsPerWarp]) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float u = delta * x_rows[r];
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(decay, acc[r][e], u * bv[e]);
  }
}

// Fold ring entries 0..w-1 plus the current token (entry w) into the tile: S = decay S + Σ_j s_j x_j B_jᵀ.
// `s` points to the weights s_0..s_w (shared or global). All threads of the CTA must call it (it synchronises).
__device__ __forceinline__ void fold_ring(const Mamba2Params& p, const Tile& t, StateTile& acc, const float* s,
                                          float decay, int w) {
  __shared__ float s_B[kChunkL][N];
  __shared__ float s_xs[kChunkL][PT];
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + t.slot * p.s_Br_slot + t.group * p.s_Br_group;
  const act_t* x_ring = static_cast<const act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head;
  const act_t* B_cur = group_vec(p, p.B, p.s_B_b, p.s_B_g, t.b, t.group);
  const act_t* x_cur = static_cast<const act_t*>(p.x) + t.b * p.s_x_b + t.head * p.s_x_h;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[r][e] *= decay;
  for (int j0 = 0; j0 <= w; j0 += kChunkL) {
    const int count = min(kChunkL, w + 1 - j0);
    __syncthreads();  // the previous chunk is consumed
    for (int i = threadIdx.x; i < count * N; i += rssm::kThreads) {
      const int j = j0 + i / N, n = i % N;
      s_B[i / N][n] = rssm::to_float(j < w ? B_ring[(long long)j * N + n] : B_cur[n]);
    }
    for (int i = threadIdx.x; i < count * PT; i += rssm::kThreads) {
      const int j = j0 + i / PT, row = t.row0 + i % PT;
      s_xs[i / PT][i % PT] = s[j] * rssm::to_float(j < w ? x_ring[(long long)j * P + row] : x_cur[row]);
    }
    __syncthreads();
    for (int jj = 0; jj < count; ++jj) {
      float bv[kEpl];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) bv[e] = s_B[jj][t.lane * kEpl + e];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float xs = s_xs[jj][t.warp * kRowsPerWarp + r];
#pragma unroll
        for (int e = 0; e < kEpl; ++e) acc[r][e] = fmaf(xs, bv[e], acc[r][e]);
      }
    }
  }
}

// Warp-collective: weights of ring entries 0..w (lane j) for one head; returns s_lane, sets decay on every lane.
__device__ __forceinline__ float decay_weights(float delta_lane, float a, float& decay) {
  const float incl = rssm::warp_suffix_sum(delta_lane);                 // Σ_{i>=lane} Δ_i
  const float excl = __shfl_down_sync(0xffffffffu, incl, 1);            // Σ_{i>lane} Δ_i (lane 31: own, fixed below)
  decay = __expf(a * __shfl_sync(0xffffffffu, incl, 0));
  const int lane = threadIdx.x % rssm::kWarpSize;
  return delta_lane * __expf(a * (lane == rssm::kWarpSize - 1 ? 0.f : excl));
}

}  // namespace

// Baseline: S = exp(A Δ) S + Δ x Bᵀ ; y = S C + D x (⊙ silu z). Reads and writes the whole state every step.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_state_update_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  StateTile acc;
  load_state(t, acc);
  float bv[kEpl], cv[kEpl], x_rows[kRowsPerWarp];
  rssm::load_vec<act_t, kEpl>(group_vec(p, p.B, p.s_B_b, p.s_B_g, t.b, t.group) + t.lane * kEpl, bv);
  rssm::load_vec<act_t, kEpl>(group_vec(p, p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  load_x_rows(p, t, x_rows);
  const float delta = current_delta(p, t.b, t.head);
  single_step(acc, __expf(p.A[t.head] * delta), delta, bv, x_rows);
  store_state(t, acc);
  output_from_state(p, t, acc, cv, x_rows);
}

// Adaptive small-batch mode: every row flushes. With an empty ring (the steady state) this is the baseline step;
// a row that still holds ring entries (after a switch from replay) folds them first and resets its cursor.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_flush_decode_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  StateTile acc;
  load_state(t, acc);
  const int w = p.cursor[t.slot];
  float bv[kEpl], cv[kEpl], x_rows[kRowsPerWarp];
  rssm::load_vec<act_t, kEpl>(group_vec(p, p.B, p.s_B_b, p.s_B_g, t.b, t.group) + t.lane * kEpl, bv);
  rssm::load_vec<act_t, kEpl>(group_vec(p, p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  load_x_rows(p, t, x_rows);
  const float delta = current_delta(p, t.b, t.head);
  if (w == 0) {
    single_step(acc, __expf(p.A[t.head] * delta), delta, bv, x_rows);
  } else {
    __shared__ float s_w[rssm::kMaxL];
    __shared__ float s_decay;
    if (t.warp == 0) {
      const float* dt_ring = p.dt_ring + t.slot * p.s_dtr_slot + t.head * p.s_dtr_head;
      const float d = t.lane < w ? dt_ring[t.lane] : (t.lane == w ? delta : 0.f);
      float decay;
      const float s = decay_weights(d, p.A[t.head], decay);
      if (t.lane <= w) s_w[t.lane] = s;
      if (t.lane == 0) s_decay = decay;
    }
    __syncthreads();
    if (threadIdx.x == 0) rssm::arrive_and_advance(p.cursor, p.arrive, t.slot, gridDim.x * p.nheads, 0);
    fold_ring(p, t, acc, s_w, s_decay, w);
  }
  store_state(t, acc);
  output_from_state(p, t, acc, cv, x_rows);
}

// Replay step 1, grid (batch, ngroups): per (row, group) the B·C products, per head the decay weights into the
// per-slot scratch; appends Δ (per head) and B (per group) for non-flush rows; advances the cursor.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_replay_prep_kernel(const Mamba2Params p) {
  const int b = blockIdx.x, g = blockIdx.y;
  const int slot = p.slot_idx[b];
  if (slot == p.pad_slot_id) return;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int w = p.cursor[slot];
  const bool flush = p.force_flush || w >= p.L - 1;
  const int heads_per_group = p.nheads / p.ngroups;
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  const act_t* B_cur = group_vec(p, p.B, p.s_B_b, p.s_B_g, b, g);

  __shared__ float s_bc[rssm::kMaxL];
  if (!flush) {
    float cv[kEpl];
    rssm::load_vec<act_t, kEpl>(group_vec(p, p.C, p.s_C_b, p.s_C_g, b, g) + lane * kEpl, cv);
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
        if (lane == 0) s_bc[j] = dot;
      }
    }
    act_t* B_dst = static_cast<act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group + (long long)w * N;
    for (int i = threadIdx.x; i < N; i += rssm::kThreads) B_dst[i] = B_cur[i];
  }
  __syncthreads();  // s_bc ready; every thread has read the cursor

  for (int hh = warp; hh < heads_per_group; hh += rssm::kNumWarps) {
    const int h = g * heads_per_group + hh;
    float* dt_ring = p.dt_ring + slot * p.s_dtr_slot + h * p.s_dtr_head;
    const float delta_w = current_delta(p, b, h);
    const float d = lane < w ? dt_ring[lane] : (lane == w ? delta_w : 0.f);
    float decay;
    const float s = decay_weights(d, p.A[h], decay);
    float* coef = p.coef + slot * p.s_coef_slot + (long long)h * (p.L + 1);
    if (lane <= w) coef[lane] = flush ? s : s * s_bc[lane];
    if (lane == 0) {
      coef[p.L] = decay;
      if (!flush) dt_ring[w] = delta_w;
    }
  }
  if (threadIdx.x == 0) {
    if (g == 0) p.step[slot] = flush ? -(w + 1) : w;
    rssm::arrive_and_advance(p.cursor, p.arrive, slot, p.ngroups, flush ? 0 : w + 1);
  }
}

// Replay step 2, grid (P / PT, nheads, batch): non-flush rows read the checkpoint tile and never write it;
// flush rows fold the ring into a new checkpoint. Appends x for non-flush rows.
extern "C" __global__ void __launch_bounds__(rssm::kThreads, 1) mamba2_replay_main_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  StateTile acc;
  load_state(t, acc);
  const int info = p.step[t.slot];
  const bool flush = info < 0;
  const int w = flush ? -info - 1 : info;
  const float* coef = p.coef + t.slot * p.s_coef_slot + (long long)t.head * (p.L + 1);
  const float decay = coef[p.L];
  float cv[kEpl], x_rows[kRowsPerWarp];
  rssm::load_vec<act_t, kEpl>(group_vec(p, p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  load_x_rows(p, t, x_rows);

  if (flush) {
    fold_ring(p, t, acc, coef, decay, w);
    store_state(t, acc);
    output_from_state(p, t, acc, cv, x_rows);
    return;
  }
  // y = decay (S0·C) + Σ_{j<=w} coef_j x_j ; lane j supplies ring entry j (lane w: the current token).
  const act_t* x_ring = static_cast<const act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head;
  const int rows = t.row0 + t.warp * kRowsPerWarp;
  float xj[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    xj[r] = t.lane < w ? rssm::to_float(x_ring[(long long)t.lane * P + rows + r]) : (t.lane == w ? x_rows[r] : 0.f);
  const float c = t.lane <= w ? coef[t.lane] : 0.f;
  float partial[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) dot = fmaf(acc[r][e], cv[e], dot);
    partial[r] = fmaf(decay, dot, c * xj[r]);
  }
  finish_output(p, t, partial, x_rows);
  act_t* x_dst = static_cast<act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head + (long long)w * P + t.row0;
  const act_t* x_cur = static_cast<const act_t*>(p.x) + t.b * p.s_x_b + t.head * p.s_x_h + t.row0;
  for (int i = threadIdx.x; i < PT; i += rssm::kThreads) x_dst[i] = x_cur[i];
}
