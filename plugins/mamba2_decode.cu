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
static_assert(N % rssm::kWarpSize == 0, "d_state must be a multiple of 32");
static_assert(PT % rssm::kNumWarps == 0 && P % PT == 0 && PT <= rssm::kThreads,
              "row tile must divide head_dim, be a multiple of 4 and at most 128");

// The state tile stays in registers in its storage format while its loads are in flight (half the registers for
// 16-bit states); rows are widened to fp32 one at a time when used.
using RawVec = rssm::VecTraits<state_t, kEpl>;
using RawTile = typename RawVec::Raw[kRowsPerWarp][RawVec::kChunks];

// Per-row output staging: the warps reduce S·C per row, thread i < PT finishes row i (coalesced stores).
struct __align__(16) OutStage {
  float dot[PT];    // Σ_n S[row, n] C[n]
  float extra[PT];  // D x (+ ring terms of a non-flush replay step)
  float gate[PT];   // silu(z) or 1
  float x[PT];      // current x
};

struct Tile {
  int b, slot, head, group, row0, warp, lane;
  state_t* state;  // this lane's first element of this warp's rows
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

__device__ __forceinline__ void load_raw(const Tile& t, RawTile& raw) {
  const auto* src = reinterpret_cast<const typename RawVec::Raw*>(t.state);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < RawVec::kChunks; ++c) {
      if constexpr (RawVec::kChunk == 16) raw[r][c] = __ldcs(src + r * (N / RawVec::kPerChunk) + c);
      else raw[r][c] = src[r * (N / RawVec::kPerChunk) + c];
    }
}

__device__ __forceinline__ void unpack_row(const RawTile& raw, int r, float (&v)[kEpl]) {
  static_assert(RawVec::kChunk >= 4, "raw chunks must hold whole 32-bit words");
#pragma unroll
  for (int c = 0; c < RawVec::kChunks; ++c)
#pragma unroll
    for (int i = 0; i < RawVec::kPerChunk; ++i) v[c * RawVec::kPerChunk + i] = rssm::raw_elem<state_t>(raw[r][c], i);
}

__device__ __forceinline__ const act_t* group_vec(const void* base, long long sb, long long sg, int b, int g) {
  return static_cast<const act_t*>(base) + b * sb + g * sg;
}

__device__ __forceinline__ const act_t* x_of(const Mamba2Params& p, const Tile& t) {
  return static_cast<const act_t*>(p.x) + t.b * p.s_x_b + t.head * p.s_x_h;
}

// Thread i < PT stages row i's x, D x (+ Σ_{j<=w} coef_j x_j when `coef` is given) and its gate.
__device__ __forceinline__ void stage_extras(const Mamba2Params& p, const Tile& t, OutStage& st, const float* coef,
                                             int w) {
  const int i = threadIdx.x;
  if (i >= PT) return;
  const int row = t.row0 + i;
  const float x = rssm::to_float(x_of(p, t)[row]);
  float extra = p.D ? p.D[t.head] * x : 0.f;
  if (coef) {
    const act_t* x_ring = static_cast<const act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head + row;
    extra = fmaf(coef[w], x, extra);
#pragma unroll
    for (int j = 0; j < rssm::kMaxL; ++j)
      if (j < w) extra = fmaf(coef[j], rssm::to_float(x_ring[(long long)j * P]), extra);
  }
  st.x[i] = x;
  st.extra[i] = extra;
  st.gate[i] = p.z ? rssm::siluf(rssm::to_float(static_cast<const act_t*>(p.z)[t.b * p.s_z_b + t.head * p.s_z_h + row]))
                   : 1.f;
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

// y[row] = (scale · S·C + extra) · gate for the CTA's rows.
__device__ __forceinline__ void finish_output(const Mamba2Params& p, const Tile& t, float scale, const OutStage& st) {
  __syncthreads();
  const int i = threadIdx.x;
  if (i < PT) {
    const float y = fmaf(scale, st.dot[i], st.extra[i]) * st.gate[i];
    static_cast<act_t*>(p.out)[t.b * p.s_out_b + t.head * p.s_out_h + t.row0 + i] = rssm::from_float<act_t>(y);
  }
}

__device__ __forceinline__ void store_row(const Tile& t, int r, const float (&v)[kEpl]) {
  rssm::store_vec<state_t, kEpl>(t.state + r * N, v);
}

// One recurrence step on the tile (the baseline update): S = exp(A Δ) S + Δ x Bᵀ, stored; S·C staged.
__device__ __forceinline__ void single_step_rows(const Mamba2Params& p, const Tile& t, const RawTile& raw,
                                                 OutStage& st) {
  float bv[kEpl], cv[kEpl];
  rssm::load_vec<act_t, kEpl>(group_vec(p.B, p.s_B_b, p.s_B_g, t.b, t.group) + t.lane * kEpl, bv);
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
  const float delta = current_delta(p, t.b, t.head);
  const float decay = __expf(p.A[t.head] * delta);
  stage_extras(p, t, st, nullptr, 0);
  __syncthreads();  // st.x ready
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v[kEpl];
    unpack_row(raw, r, v);
    const float u = delta * st.x[t.warp * kRowsPerWarp + r];
#pragma unroll
    for (int e = 0; e < kEpl; ++e) v[e] = fmaf(decay, v[e], u * bv[e]);
    store_row(t, r, v);
    stage_row_dot(t, r, v, cv, st);
  }
}

// Fold ring entries 0..w-1 plus the current token (entry w): S = decay S + Σ_j s_j x_j B_jᵀ; stores S, stages S·C
// and D x. `s` holds s_0..s_w (shared or global). Every thread of the CTA calls it (it synchronises).
__device__ __forceinline__ void fold_rows(const Mamba2Params& p, const Tile& t, const RawTile& raw, const float* s,
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
  stage_extras(p, t, st, nullptr, 0);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v[kEpl];
    unpack_row(raw, r, v);
#pragma unroll
    for (int e = 0; e < kEpl; ++e) v[e] *= decay;
    for (int j = 0; j <= w; ++j) {
      const float xs = s_xs[j][t.warp * kRowsPerWarp + r];
      float bv[kEpl];
      rssm::load_vec<act_t, kEpl>(&s_B[j][t.lane * kEpl], bv);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) v[e] = fmaf(xs, bv[e], v[e]);
    }
    store_row(t, r, v);
    stage_row_dot(t, r, v, cv, st);
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
  RawTile raw;
  load_raw(t, raw);
  __shared__ OutStage st;
  single_step_rows(p, t, raw, st);
  finish_output(p, t, 1.f, st);
}

// Adaptive small-batch mode: every row flushes. With an empty ring (the steady state) this is the baseline step;
// a row that still holds ring entries (after a switch from replay) folds them first and resets its cursor.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_flush_decode_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  RawTile raw;
  load_raw(t, raw);
  const int w = p.cursor[t.slot];
  __shared__ OutStage st;
  if (w == 0) {
    single_step_rows(p, t, raw, st);
  } else {
    __shared__ float s_w[rssm::kMaxL];
    __shared__ float s_decay;
    if (t.warp == 0) {
      const float* dt_ring = p.dt_ring + t.slot * p.s_dtr_slot + t.head * p.s_dtr_head;
      const float d = t.lane < w ? dt_ring[t.lane] : (t.lane == w ? current_delta(p, t.b, t.head) : 0.f);
      float decay;
      const float s = decay_weights(d, p.A[t.head], decay);
      if (t.lane <= w) s_w[t.lane] = s;
      if (t.lane == 0) s_decay = decay;
    }
    __syncthreads();
    if (threadIdx.x == 0) rssm::arrive_and_advance(p.cursor, p.arrive, t.slot, gridDim.x * p.nheads, 0);
    fold_rows(p, t, raw, s_w, s_decay, w, st);
  }
  finish_output(p, t, 1.f, st);
}

// Replay step 1, grid (batch, ngroups), one warp per head of the group (4..16 warps): per (row, group) the B·C
// products, per head the decay weights into the per-slot scratch; appends Δ (per head) and B (per group) for
// non-flush rows; advances the cursor. Lets the main kernel launch at once (programmatic dependent launch).
extern "C" __global__ void __launch_bounds__(512) mamba2_replay_prep_kernel(const Mamba2Params p) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int b = blockIdx.x, g = blockIdx.y;
  const int slot = p.slot_idx[b];
  if (slot == p.pad_slot_id) return;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int nwarps = blockDim.x / rssm::kWarpSize;
  const int w = p.cursor[slot];
  const bool flush = p.force_flush || w >= p.L - 1;
  const int heads_per_group = p.nheads / p.ngroups;
  const act_t* B_ring = static_cast<const act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group;
  const act_t* B_cur = group_vec(p.B, p.s_B_b, p.s_B_g, b, g);

  __shared__ float s_bc[rssm::kMaxL];
  if (!flush) {
    float cv[kEpl];
    rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, b, g) + lane * kEpl, cv);
    for (int j = warp; j <= w; j += nwarps) {
      float bv[kEpl];
      rssm::load_vec<act_t, kEpl>((j < w ? B_ring + (long long)j * N : B_cur) + lane * kEpl, bv);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) dot = fmaf(bv[e], cv[e], dot);
      dot = rssm::warp_sum(dot);
      if (lane == 0) s_bc[j] = dot;
    }
    act_t* B_dst = static_cast<act_t*>(p.B_ring) + slot * p.s_Br_slot + g * p.s_Br_group + (long long)w * N;
    for (int i = threadIdx.x; i < N; i += blockDim.x) B_dst[i] = B_cur[i];
  }
  __syncthreads();  // s_bc ready; every thread has read the cursor

  for (int hh = warp; hh < heads_per_group; hh += nwarps) {
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
extern "C" __global__ void __launch_bounds__(rssm::kThreads) mamba2_replay_main_kernel(const Mamba2Params p) {
  Tile t;
  if (!setup_tile(p, t)) return;
  // Launched as a programmatic dependent of the prep kernel: the CTA is resident and has its slot while the prep
  // kernel finishes; waiting before the state loads measured faster than waiting after them (the wait stalls on
  // outstanding loads).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  RawTile raw;
  load_raw(t, raw);
  const int info = p.step[t.slot];
  const bool flush = info < 0;
  const int w = flush ? -info - 1 : info;
  const float* coef = p.coef + t.slot * p.s_coef_slot + (long long)t.head * (p.L + 1);
  const float decay = coef[p.L];
  __shared__ OutStage st;
  if (flush) {
    fold_rows(p, t, raw, coef, decay, w, st);
    finish_output(p, t, 1.f, st);
    return;
  }
  // y = decay (S0·C) + Σ_{j<=w} coef_j x_j + D x: ring terms per row (thread i), S0·C per row (warps).
  stage_extras(p, t, st, coef, w);
  float cv[kEpl];
  rssm::load_vec<act_t, kEpl>(group_vec(p.C, p.s_C_b, p.s_C_g, t.b, t.group) + t.lane * kEpl, cv);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v[kEpl];
    unpack_row(raw, r, v);
    stage_row_dot(t, r, v, cv, st);
  }
  finish_output(p, t, decay, st);
  if (threadIdx.x < PT) {
    act_t* x_dst = static_cast<act_t*>(p.x_ring) + t.slot * p.s_xr_slot + t.head * p.s_xr_head + (long long)w * P;
    x_dst[t.row0 + threadIdx.x] = rssm::from_float<act_t>(st.x[threadIdx.x]);
  }
}
