// Fused decode-step layers of the reference hybrid decoders (trtllm_replayssm/models): RMSNorm with the residual add,
// gated RMSNorm, the causal depthwise conv1d state update (+ SiLU) and the MLP activations. Each replaces a chain of
// elementwise PyTorch kernels by one launch; the math (fp32, and where the PyTorch reference rounds to act_t) follows
// trtllm_replayssm/reference/layers.py, which is also the CPU path of these ops (ops/layers.py).
//
// Compile-time constants (NVRTC -D): ACT_T (activation / weight C++ type).
#include "replayssm_common.cuh"

using act_t = ACT_T;

namespace {

constexpr int kBlock = 256;  // threads per CTA of the norm kernels (host: ops/layers.py NORM_THREADS)

// Sum of v over the CTA (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  v = rssm::warp_sum(v);
  __syncthreads();  // partial[] may still be read from a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / rssm::kWarpSize;
  v = lane < warps ? partial[lane] : 0.f;
  return rssm::warp_sum(v);
}

__device__ __forceinline__ float rounded(float v) { return rssm::round_through<act_t>(v); }

}  // namespace

// Row r = (outer o, inner i) of x / residual / out starts at o * s_outer + i * s_inner (elements).
struct RmsNormParams {
  const act_t* x;       // [outer, inner, dim]
  act_t* residual;      // nullable, [rows, dim] contiguous: residual += x in place, then the norm of the sum
  const act_t* weight;  // [dim]
  act_t* out;           // [outer, inner, dim]
  long long s_x_outer, s_x_inner, s_out_outer, s_out_inner;
  int inner, dim;
  float eps;
  int unit_offset;      // scale by (1 + weight)
};

// One CTA per row: out = rmsnorm(h) * w with h = x, or h = residual + x (stored back into residual).
extern "C" __global__ void __launch_bounds__(kBlock) rmsnorm_kernel(const RmsNormParams p) {
  const int row = blockIdx.x, o = row / p.inner, i = row % p.inner;
  const act_t* x = p.x + o * p.s_x_outer + i * p.s_x_inner;
  act_t* res = p.residual ? p.residual + (long long)row * p.dim : nullptr;
  act_t* out = p.out + o * p.s_out_outer + i * p.s_out_inner;
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
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {  // re-reads this thread's own elements (L1)
    const float h = rssm::to_float(res ? res[c] : x[c]);
    const float w = rssm::to_float(p.weight[c]) + (p.unit_offset ? 1.f : 0.f);
    out[c] = rssm::from_float<act_t>(h * inv * w);
  }
}

struct GatedNormParams {
  const act_t* x;       // [rows, groups * group_size] (row stride s_x)
  const act_t* z;       // [rows, groups * group_size] (row stride s_z)
  const act_t* weight;  // [groups * group_size]
  act_t* out;           // [rows, groups * group_size] (row stride s_out)
  long long s_x, s_z, s_out;
  int group_size;
  float eps;
  int norm_before_gate;  // 0: norm(x * silu(z)) * w (Mamba-2); 1: norm(x) * w * silu(z) (Qwen3.5 GDN)
  int pad0;
};

// One CTA per (row, group): RMSNorm over the group's channels with a SiLU gate.
extern "C" __global__ void __launch_bounds__(kBlock) gated_rmsnorm_kernel(const GatedNormParams p) {
  const long long row = blockIdx.x;
  const int c0 = blockIdx.y * p.group_size;
  const act_t* x = p.x + row * p.s_x + c0;
  const act_t* z = p.z + row * p.s_z + c0;
  float ss = 0.f;
  for (int c = threadIdx.x; c < p.group_size; c += blockDim.x) {
    float v = rssm::to_float(x[c]);
    if (!p.norm_before_gate) v *= rssm::siluf(rssm::to_float(z[c]));
    ss = fmaf(v, v, ss);
  }
  const float inv = rsqrtf(block_sum(ss) / p.group_size + p.eps);
  act_t* out = p.out + row * p.s_out + c0;
  for (int c = threadIdx.x; c < p.group_size; c += blockDim.x) {
    const float g = rssm::siluf(rssm::to_float(z[c]));
    float v = rssm::to_float(x[c]);
    if (!p.norm_before_gate) v *= g;
    v = v * inv * rssm::to_float(p.weight[c0 + c]);
    out[c] = rssm::from_float<act_t>(p.norm_before_gate ? v * g : v);
  }
}

struct ConvParams {
  const act_t* x;        // [batch, channels] (row stride s_x): this step's conv input
  act_t* conv_state;     // [batch, channels, width - 1] contiguous: the previous width - 1 inputs, oldest first
  const act_t* weight;   // [channels, width] contiguous
  const act_t* bias;     // nullable, [channels]
  act_t* out;            // [batch, channels] (row stride s_out)
  long long s_x, s_out;
  int channels, width;
  int silu, pad0;
};

constexpr int kMaxConvWidth = 8;

// One thread per (row, channel): y = sum_k w_k * window_k + bias (rounded to act_t like the reference), optionally
// SiLU; the state shifts by one input.
extern "C" __global__ void __launch_bounds__(kBlock) conv1d_update_kernel(const ConvParams p) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.channels) return;
  const long long b = blockIdx.y;
  const int hist = p.width - 1;
  act_t* state = p.conv_state + (b * p.channels + c) * hist;
  const act_t* w = p.weight + (long long)c * p.width;
  const act_t x_new = p.x[b * p.s_x + c];
  act_t window[kMaxConvWidth];
#pragma unroll
  for (int k = 0; k < kMaxConvWidth; ++k)
    if (k < hist) window[k] = state[k];
  float y = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxConvWidth; ++k)
    if (k < p.width) y = fmaf(rssm::to_float(w[k]), rssm::to_float(k < hist ? window[k] : x_new), y);
  if (p.bias) y += rssm::to_float(p.bias[c]);
  y = rounded(y);
  if (p.silu) y = rssm::siluf(y);
  p.out[b * p.s_out + c] = rssm::from_float<act_t>(y);
#pragma unroll
  for (int k = 0; k < kMaxConvWidth; ++k)
    if (k < hist) state[k] = k + 1 < hist ? window[k + 1] : x_new;
}

struct ActParams {
  const act_t* a;  // [n] contiguous: the activation's input (SwiGLU: the gate projection)
  const act_t* b;  // [n] contiguous: SwiGLU's up projection (kind 1), else null
  act_t* out;      // [n]
  long long n;
  int kind;        // 0: relu(a)^2; 1: silu(a) * b
  int pad0;
};

// Elementwise MLP activations, rounding where the PyTorch reference rounds (after relu / silu).
extern "C" __global__ void __launch_bounds__(kBlock) mlp_act_kernel(const ActParams p) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const float a = rssm::to_float(p.a[i]);
    float y;
    if (p.kind == 0) {
      const float r = fmaxf(a, 0.f);
      y = r * r;
    } else {
      y = rounded(rssm::siluf(a)) * rssm::to_float(p.b[i]);
    }
    p.out[i] = rssm::from_float<act_t>(y);
  }
}
