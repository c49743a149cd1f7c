// Fused decode-step layers of the reference hybrid decoders (trtllm_replayssm/models): RMSNorm with the residual add,
// gated RMSNorm, the causal depthwise conv1d's speculative window (verify, commit; its decode step:
// conv1d_update.cu), the MLP activations and rotate-half RoPE. Each
// replaces a chain of elementwise PyTorch kernels by one launch; the math (fp32, rounded to act_t where the PyTorch
// reference rounds) follows trtllm_replayssm/reference/layers.py, which is also the CPU path of these ops
// (ops/layers.py). Kernels with a `vec` flag move 16-byte vectors (set by the host when sizes and strides allow) and
// keep a row in registers; otherwise they fall back to one element per access.
//
// Compile-time constants (NVRTC -D): ACT_T (activation / weight C++ type).
#include "replayssm_common.cuh"

using act_t = ACT_T;

namespace {

constexpr int kBlock = 256;                      // most threads per CTA (host: ops/layers.py MAX_THREADS)
constexpr int kVec = 16 / int(sizeof(act_t));    // elements per 16-byte vector (host: ops/layers.py vector_elems)
constexpr int kMaxRowVecs = 4;                   // vectors per thread of a row held in registers

// Sum of v over the CTA (blockDim.x a multiple of 32); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  v = rssm::warp_sum(v);
  if (blockDim.x == rssm::kWarpSize) return v;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / rssm::kWarpSize) ? partial[lane] : 0.f;
  return rssm::warp_sum(v);
}

__device__ __forceinline__ float rounded(float v) { return rssm::round_through<act_t>(v); }

}  // namespace

// Row r = (outer o, inner i) of x / out starts at o * s_outer + i * s_inner (elements); residual rows are dense.
#include "RmsNormParams.h"  // generated from lab/layers/ops.py (the struct's one description)

// One CTA per row: out = rmsnorm(h) * w with h = x, or h = residual + x (stored back into residual).
extern "C" __global__ void __launch_bounds__(kBlock) rmsnorm_kernel(const RmsNormParams p) {
  const int row = blockIdx.x, o = row / p.inner, i = row % p.inner;
  const act_t* x = p.x + o * p.s_x_outer + i * p.s_x_inner;
  act_t* res = p.residual ? p.residual + (long long)row * p.dim : nullptr;
  act_t* out = p.out + o * p.s_out_outer + i * p.s_out_inner;
  const float offset = p.unit_offset ? 1.f : 0.f;
  if (p.vec) {
    const int nvec = p.dim / kVec;
    float h[kMaxRowVecs][kVec], w[kMaxRowVecs][kVec];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxRowVecs; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= nvec) break;
      rssm::load_vec<act_t, kVec>(p.weight + j * kVec, w[k]);  // issued with the row's loads, used after the sum
      rssm::load_vec<act_t, kVec>(x + j * kVec, h[k]);
      if (res) {
        float r[kVec];
        rssm::load_vec<act_t, kVec>(res + j * kVec, r);
#pragma unroll
        for (int e = 0; e < kVec; ++e) h[k][e] = rounded(r[e] + h[k][e]);
        rssm::store_vec<act_t, kVec>(res + j * kVec, h[k]);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) ss = fmaf(h[k][e], h[k][e], ss);
    }
    const float inv = rsqrtf(block_sum(ss) / p.dim + p.eps);
#pragma unroll
    for (int k = 0; k < kMaxRowVecs; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= nvec) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) h[k][e] = h[k][e] * inv * (w[k][e] + offset);
      rssm::store_vec<act_t, kVec>(out + j * kVec, h[k]);
    }
    return;
  }
  float ss = 0.f;
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    float h = rssm::to_float(x[c]);
    if (res) {
      h = rounded(rssm::to_float(res[c]) + h);
      res[c] = rssm::from_float<act_t>(h);
    }
    ss = fmaf(h, h, ss);
  }
  const float inv = rsqrtf(block_sum(ss) / p.dim + p.eps);
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {  // re-reads this thread's own elements
    const float h = rssm::to_float(res ? res[c] : x[c]);
    out[c] = rssm::from_float<act_t>(h * inv * (rssm::to_float(p.weight[c]) + offset));
  }
}

#include "GatedNormParams.h"  // generated from lab/layers/ops.py (the struct's one description)

// The vector path for one (row, group): thread t of n holds vectors t, t + n, ... in registers.
template <bool kWarpReduce>
__device__ __forceinline__ void gated_norm_vec(const GatedNormParams& p, const act_t* x, const act_t* z,
                                               const act_t* weight, act_t* out, int t, int n) {
  const int nvec = p.group_size / kVec;
  float v[kMaxRowVecs][kVec], g[kMaxRowVecs][kVec];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxRowVecs; ++k) {
    const int j = t + k * n;
    if (j >= nvec) break;
    rssm::load_vec<act_t, kVec>(x + j * kVec, v[k]);
    rssm::load_vec<act_t, kVec>(z + j * kVec, g[k]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      g[k][e] = rssm::siluf(g[k][e]);
      if (!p.norm_before_gate) v[k][e] *= g[k][e];
      ss = fmaf(v[k][e], v[k][e], ss);
    }
  }
  const float inv = rsqrtf((kWarpReduce ? rssm::warp_sum(ss) : block_sum(ss)) / p.group_size + p.eps);
#pragma unroll
  for (int k = 0; k < kMaxRowVecs; ++k) {
    const int j = t + k * n;
    if (j >= nvec) break;
    float w[kVec];
    rssm::load_vec<act_t, kVec>(weight + j * kVec, w);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      v[k][e] = v[k][e] * inv * w[e];
      if (p.norm_before_gate) v[k][e] *= g[k][e];
    }
    rssm::store_vec<act_t, kVec>(out + j * kVec, v[k]);
  }
}

// RMSNorm over groups of channels with a SiLU gate: a CTA per (row, group), or a warp per (row, group).
extern "C" __global__ void __launch_bounds__(kBlock) gated_rmsnorm_kernel(const GatedNormParams p) {
  const long long row = blockIdx.x;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int group = p.warp_groups ? blockIdx.y * p.warp_groups + warp : blockIdx.y;
  if (group >= p.groups) return;  // warp-uniform
  const int c0 = group * p.group_size;
  const act_t* weight = p.weight + c0 % p.weight_len;
  const act_t* x = p.x + row * p.s_x + c0;
  const act_t* z = p.z + row * p.s_z + c0;
  act_t* out = p.out + row * p.s_out + c0;
  if (p.warp_groups) {
    gated_norm_vec<true>(p, x, z, weight, out, lane, rssm::kWarpSize);
    return;
  }
  if (p.vec) {
    gated_norm_vec<false>(p, x, z, weight, out, threadIdx.x, blockDim.x);
    return;
  }
  float ss = 0.f;
  for (int c = threadIdx.x; c < p.group_size; c += blockDim.x) {
    float v = rssm::to_float(x[c]);
    if (!p.norm_before_gate) v *= rssm::siluf(rssm::to_float(z[c]));
    ss = fmaf(v, v, ss);
  }
  const float inv = rsqrtf(block_sum(ss) / p.group_size + p.eps);
  for (int c = threadIdx.x; c < p.group_size; c += blockDim.x) {
    const float g = rssm::siluf(rssm::to_float(z[c]));
    float v = rssm::to_float(x[c]);
    if (!p.norm_before_gate) v *= g;
    v = v * inv * rssm::to_float(weight[c]);
    out[c] = rssm::from_float<act_t>(p.norm_before_gate ? v * g : v);
  }
}

#include "ConvWindowParams.h"  // generated from lab/layers/ops.py (the struct's one description)

// Commit of a conv window: the state becomes in[a .. a + W - 1) of the window's inputs `in` ([tap][E] per thread;
// a: the row's accepted count, 1 .. kMaxWindow, a register index known at compile time only per unrolled case).
template <int kHist, int E>
__device__ __forceinline__ void committed_taps(const float (&in)[kHist + rssm::kMaxWindow][E], int a,
                                               float (&taps)[kHist][E]) {
#pragma unroll
  for (int j = 1; j <= rssm::kMaxWindow; ++j) {
    if (j != a) continue;
#pragma unroll
    for (int k = 0; k < kHist; ++k)
#pragma unroll
      for (int e = 0; e < E; ++e) taps[k][e] = in[j + k][e];
  }
}

// A speculative window of the causal depthwise conv1d, the inputs of the window in = [conv_state (W - 1 inputs),
// x_0 .. x_{T-1}]. Verify (p.out set): y_t = sum_k w_k in[t + k] + bias (rounded to act_t like the reference),
// optionally SiLU, the state unchanged. Commit (p.accepted set): the state becomes in[a .. a + W - 1) for the row's
// accepted count a (1 .. T; a row with another count is left as it is). One thread per (row, kVec channels) on the
// vector path (width 4, 16-byte vectors: conv1d_update_kernel's layout), else per (row, channel).
extern "C" __global__ void __launch_bounds__(kBlock) conv1d_window_kernel(const ConvWindowParams p) {
  const int t_idx = blockIdx.x * blockDim.x + threadIdx.x;
  const long long b = blockIdx.y;
  const int T = p.window;
  const long long a = p.accepted ? p.accepted[b] : 0;
  if (p.accepted && (a < 1 || a > T)) return;
  if (p.vec) {
    constexpr int kHist = rssm::kVecConvWidth - 1;
    const int c0 = t_idx * kVec;
    if (c0 >= p.channels) return;
    act_t* state = p.conv_state + (b * p.channels + c0) * kHist;
    float in[kHist + rssm::kMaxWindow][kVec];
    {
      float s[kHist * kVec];  // channel e's taps at s[e kHist ...] (the state's [channel][tap] order)
#pragma unroll
      for (int k = 0; k < kHist; ++k)
        rssm::load_vec<act_t, kVec>(state + k * kVec, reinterpret_cast<float(&)[kVec]>(s[k * kVec]));
#pragma unroll
      for (int k = 0; k < kHist; ++k)
#pragma unroll
        for (int e = 0; e < kVec; ++e) in[k][e] = s[e * kHist + k];
    }
#pragma unroll
    for (int t = 0; t < rssm::kMaxWindow; ++t)
      if (t < T) rssm::load_vec<act_t, kVec>(p.x + b * p.s_x_b + t * p.s_x_t + c0, in[kHist + t]);
    if (p.accepted) {
      float taps[kHist][kVec], s[kHist * kVec];
      committed_taps<kHist, kVec>(in, int(a), taps);
#pragma unroll
      for (int k = 0; k < kHist; ++k)
#pragma unroll
        for (int e = 0; e < kVec; ++e) s[e * kHist + k] = taps[k][e];
#pragma unroll
      for (int k = 0; k < kHist; ++k)
        rssm::store_vec<act_t, kVec>(state + k * kVec, reinterpret_cast<float(&)[kVec]>(s[k * kVec]));
      return;
    }
    float w[rssm::kVecConvWidth * kVec], bias[kVec] = {};
#pragma unroll
    for (int k = 0; k < rssm::kVecConvWidth; ++k)
      rssm::load_vec<act_t, kVec>(p.weight + (long long)c0 * rssm::kVecConvWidth + k * kVec,
                                  reinterpret_cast<float(&)[kVec]>(w[k * kVec]));
    if (p.bias) rssm::load_vec<act_t, kVec>(p.bias + c0, bias);
#pragma unroll
    for (int t = 0; t < rssm::kMaxWindow; ++t) {
      if (t >= T) break;
      float y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {  // channel c0 + e: weights w[e width ...]
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < rssm::kVecConvWidth; ++k) acc = fmaf(w[e * rssm::kVecConvWidth + k], in[t + k][e], acc);
        acc = rounded(acc + bias[e]);
        y[e] = p.silu ? rssm::siluf(acc) : acc;
      }
      rssm::store_vec<act_t, kVec>(p.out + (b * T + t) * p.channels + c0, y);
    }
    return;
  }
  const int c = t_idx;
  if (c >= p.channels) return;
  const int hist = p.width - 1;
  act_t* state = p.conv_state + (b * p.channels + c) * hist;
  float in[rssm::kMaxConvWidth - 1 + rssm::kMaxWindow][1];
#pragma unroll
  for (int k = 0; k < rssm::kMaxConvWidth - 1; ++k)
    if (k < hist) in[k][0] = rssm::to_float(state[k]);
#pragma unroll
  for (int t = 0; t < rssm::kMaxWindow; ++t)
    if (t < T) in[hist + t][0] = rssm::to_float(p.x[b * p.s_x_b + t * p.s_x_t + c]);
  if (p.accepted) {
    float taps[rssm::kMaxConvWidth - 1][1];
    committed_taps<rssm::kMaxConvWidth - 1, 1>(in, int(a), taps);
#pragma unroll
    for (int k = 0; k < rssm::kMaxConvWidth - 1; ++k)
      if (k < hist) state[k] = rssm::from_float<act_t>(taps[k][0]);
    return;
  }
  float w[rssm::kMaxConvWidth];
#pragma unroll
  for (int k = 0; k < rssm::kMaxConvWidth; ++k) w[k] = k < p.width ? rssm::to_float(p.weight[(long long)c * p.width + k]) : 0.f;
  const float bias = p.bias ? rssm::to_float(p.bias[c]) : 0.f;
#pragma unroll
  for (int t = 0; t < rssm::kMaxWindow; ++t) {
    if (t >= T) break;
    float y = 0.f;
#pragma unroll
    for (int k = 0; k < rssm::kMaxConvWidth; ++k)
      if (k < p.width) y = fmaf(w[k], in[t + k][0], y);
    y = rounded(y + bias);
    p.out[(b * T + t) * p.channels + c] = rssm::from_float<act_t>(p.silu ? rssm::siluf(y) : y);
  }
}

#include "ActParams.h"  // generated from lab/layers/ops.py (the struct's one description)

__device__ __forceinline__ float mlp_act(float a, float b, int kind) {
  if (kind == 0) {
    const float r = fmaxf(a, 0.f);
    return r * r;
  }
  return rounded(rssm::siluf(a)) * b;  // the reference rounds silu(a) before the product
}

// Elementwise MLP activations (grid-stride over rows x cols).
extern "C" __global__ void __launch_bounds__(kBlock) mlp_act_kernel(const ActParams p) {
  const long long n = (long long)p.rows * p.cols, stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    const long long r = i / p.cols, c = i % p.cols;
    if (p.vec) {
      float a[kVec], b[kVec];
      rssm::load_vec<act_t, kVec>(p.a + (r * p.s_a + c) * kVec, a);
      if (p.kind == 1) rssm::load_vec<act_t, kVec>(p.b + (r * p.s_b + c) * kVec, b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) a[e] = mlp_act(a[e], p.kind == 1 ? b[e] : 0.f, p.kind);
      rssm::store_vec<act_t, kVec>(p.out + i * kVec, a);
    } else {
      const float b = p.b ? rssm::to_float(p.b[r * p.s_b + c]) : 0.f;
      p.out[i] = rssm::from_float<act_t>(mlp_act(rssm::to_float(p.a[r * p.s_a + c]), b, p.kind));
    }
  }
}

#include "RopeParams.h"  // generated from lab/layers/ops.py (the struct's one description)

// One CTA per (row, head), a thread per channel: rotate-half RoPE on the first rotary_dim channels (angle
// pos * theta^(-i / half) in fp32 as the reference, reduced to [-pi, pi] in double), the rest copied.
extern "C" __global__ void __launch_bounds__(kBlock) rope_kernel(const RopeParams p) {
  const int row = blockIdx.x / p.heads, head = blockIdx.x % p.heads, c = threadIdx.x;
  if (c >= p.head_dim) return;
  const act_t* x = p.x + row * p.s_x_row + head * p.s_x_head;
  act_t* out = p.out + ((long long)row * p.heads + head) * p.head_dim;
  if (c >= p.rotary_dim) {
    out[c] = x[c];
    return;
  }
  const int half = p.rotary_dim / 2, i = c % half;
  const float inv = float(pow(double(p.theta), double(-(float(i) / float(half)))));
  const double ang = double(float(p.pos[row]) * inv);
  constexpr double kTwoPi = 6.283185307179586;
  const float r = float(ang - kTwoPi * rint(ang / kTwoPi));  // reduced to [-pi, pi] in double, then fp32 sin/cos
  float sn, cs;
  sincosf(r, &sn, &cs);
  const float x1 = rssm::to_float(x[i]), x2 = rssm::to_float(x[i + half]);
  const float y = c < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
  out[c] = rssm::from_float<act_t>(y);
}

#include "AttnParams.h"  // generated from lab/layers/ops.py (the struct's one description)

constexpr int kAttnMaxLanesElems = 8;  // head_dim / 32 (head_dim <= 256)

// GQA attention of `tokens` consecutive tokens per row over a static KV cache (1: a decode step, T: a speculative
// window), a CTA per (key/value head, batch row): appends token t's key and value at position pos + t, then query t
// attends over the positions up to pos + t: scores q·k (rounded to act_t, then scaled, as the reference's matmul +
// float), softmax in fp32 over the attended positions (probabilities rounded to act_t), then probabilities · V (fp32
// accumulation), optionally gated. window 0: positions 0..pos + t, position u in slot u; window W > 0: positions
// max(0, pos + t - W + 1)..pos + t of a ring (position u in slot u % max_len, W <= max_len; the host sizes a window's
// ring so that its last token's keys do not overwrite a position its first token attends). The CTA's positions are
// the union of its tokens' ranges, index i at position first + i. Dynamic shared memory: the group's queries
// [tokens][rep][head_dim] and scores [tokens][rep][span] in fp32 (span: the union's length, at most max_len). A row
// whose pos is negative, whose last token lies past the cache without a window, or whose union is longer than the
// ring writes nothing to the cache and NaN outputs (the host cannot check device positions without a sync).
extern "C" __global__ void __launch_bounds__(rssm::kThreads) attention_decode_kernel(const AttnParams p) {
  extern __shared__ float attn_smem[];
  const int kvh = blockIdx.x, b = blockIdx.y, rep = p.heads / p.kv_heads, hd = p.head_dim, T = p.tokens;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const int nwarps = blockDim.x / rssm::kWarpSize, rows = T * rep;  // query row qr = t rep + r
  const long long pos = p.pos[b], last = pos + T - 1;
  const bool ring = p.window > 0;  // token t attends positions lo(t) .. pos + t; the union starts at lo(0)
  auto out_at = [&](int t, int head) { return p.out + (((long long)b * T + t) * p.heads + head) * hd; };
  auto lo = [&](int t) { return ring && pos + t + 1 > p.window ? pos + t + 1 - p.window : 0ll; };
  const long long first = lo(0);
  const int span = int(last - first + 1);
  if (pos < 0 || (!ring && last >= p.max_len) || span > p.max_len) {  // nothing written outside the cache, NaN outputs
    for (int i = threadIdx.x; i < rows * hd; i += blockDim.x)
      out_at(i / (rep * hd), kvh * rep + i / hd % rep)[i % hd] = rssm::from_float<act_t>(__int_as_float(0x7fc00000));
    return;
  }
  float* q_s = attn_smem;               // [rows][hd]
  float* s_s = attn_smem + rows * hd;   // [rows][span]
  const long long cache_row = ((long long)b * p.kv_heads + kvh) * p.max_len;
  act_t* k_cache = p.k_cache + cache_row * hd;
  act_t* v_cache = p.v_cache + cache_row * hd;
  auto slot_of = [&](long long position) { return ring ? position % p.max_len : position; };
  for (int i = threadIdx.x; i < T * hd; i += blockDim.x) {
    const int t = i / hd, d = i % hd;
    const long long slot = slot_of(pos + t);
    k_cache[slot * hd + d] = p.k_new[b * p.s_k_b + t * p.s_k_t + kvh * p.s_k_h + d];
    v_cache[slot * hd + d] = p.v_new[b * p.s_v_b + t * p.s_v_t + kvh * p.s_v_h + d];
  }
  for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {
    const int qr = i / hd, t = qr / rep, r = qr % rep;
    q_s[i] = rssm::to_float(p.q[b * p.s_q_b + t * p.s_q_t + (long long)(kvh * rep + r) * p.s_q_h + i % hd]);
  }
  __syncthreads();  // the appended keys/values and the queries are visible to the CTA

  const int per_lane = hd / rssm::kWarpSize;
  for (int u = warp; u < span; u += nwarps) {  // a warp per position of the union: lane holds head_dim / 32 channels
    const long long position = first + u, slot = slot_of(position);
    float kv[kAttnMaxLanesElems];
#pragma unroll
    for (int e = 0; e < kAttnMaxLanesElems; ++e)
      if (e < per_lane) kv[e] = rssm::to_float(k_cache[slot * hd + e * rssm::kWarpSize + lane]);
    for (int qr = 0; qr < rows; ++qr) {
      const int t = qr / rep;
      if (position < lo(t) || position > pos + t) continue;  // outside token t's range (never read)
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kAttnMaxLanesElems; ++e)
        if (e < per_lane) dot = fmaf(q_s[qr * hd + e * rssm::kWarpSize + lane], kv[e], dot);
      dot = rssm::warp_sum(dot);
      if (lane == 0) s_s[qr * span + u] = rounded(dot) * p.scale;
    }
  }
  __syncthreads();
  for (int qr = warp; qr < rows; qr += nwarps) {  // a warp per query row: softmax over its token's positions
    const int t = qr / rep, u0 = int(lo(t) - first), u1 = int(pos + t - first) + 1;
    float* s = s_s + qr * span;
    float m = -__int_as_float(0x7f800000);  // -inf
    for (int u = u0 + lane; u < u1; u += rssm::kWarpSize) m = fmaxf(m, s[u]);
#pragma unroll
    for (int o = rssm::kWarpSize / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int u = u0 + lane; u < u1; u += rssm::kWarpSize) {
      const float e = expf(s[u] - m);
      s[u] = e;
      sum += e;
    }
    const float inv = 1.f / rssm::warp_sum(sum);
    for (int u = u0 + lane; u < u1; u += rssm::kWarpSize) s[u] = rounded(s[u] * inv);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {  // a thread per (row, channel): o = sum_u p_u v_u
    const int qr = i / hd, d = i % hd, t = qr / rep, head = kvh * rep + qr % rep;  // (V rows re-read from L1)
    const int u0 = int(lo(t) - first), u1 = int(pos + t - first) + 1;
    const float* probs = s_s + qr * span;
    float acc = 0.f;
    long long slot = slot_of(first + u0);
    for (int u = u0; u < u1; ++u, slot = slot + 1 < p.max_len ? slot + 1 : 0)
      acc = fmaf(probs[u], rssm::to_float(v_cache[slot * hd + d]), acc);
    float o = rounded(acc);
    if (p.gate)
      o *= rounded(rssm::sigmoidf(
          rssm::to_float(p.gate[b * p.s_g_b + t * p.s_g_t + (long long)head * p.s_g_h + d])));
    out_at(t, head)[d] = rssm::from_float<act_t>(o);
  }
}
