// One decode step of a causal depthwise conv1d (+ SiLU) on a pool of conv states: the reference decoders' conv and the
// one the TensorRT-LLM module runs right before its GDN and KDA decode steps (core/ops/conv.py). Row b's state is
// the pool's slot slot_ids[b] (or b), its width - 1 previous inputs, oldest first, shifted by this step's input.
//
// The kernel lets the next kernel on the stream launch as soon as every CTA has started
// (griddepcontrol.launch_dependents): a state kernel launched as its programmatic dependent reads its slot id and
// asks L2 for its state lines while the conv runs, and waits for the conv's outputs (griddepcontrol.wait) before it
// reads them. Nothing here reads what a dependent writes.
//
// Compile-time constants (NVRTC -D): ACT_T (activation / weight / conv state C++ type).
#include "replayssm_common.cuh"

using act_t = ACT_T;

namespace {

constexpr int kBlock = 256;                    // threads per CTA (host: core/ops/conv.py THREADS)
constexpr int kVec = 16 / int(sizeof(act_t));  // elements per 16-byte vector (host: core/ops/conv.py vector_elems)

}  // namespace

#include "ConvParams.h"  // generated from core/ops/conv.py (the struct's one description)

namespace {

// The sum of channel c's taps starts at its bias with p.round_once (TensorRT-LLM's causal_conv1d_update: bias, then
// the taps oldest first, SiLU as y / (1 + e^-y), one rounding when stored), else at zero, the bias added after and
// the sum rounded to act_t before the SiLU (the reference decoders' PyTorch order).
__device__ __forceinline__ float conv_start(const ConvParams& p, int c) {
  return p.round_once && p.bias ? rssm::to_float(p.bias[c]) : 0.f;
}

__device__ __forceinline__ float conv_output(float y, const ConvParams& p, int c) {
  if (p.round_once) return p.silu ? y / (1.f + expf(-y)) : y;
  if (p.bias) y += rssm::to_float(p.bias[c]);
  y = rssm::round_through<act_t>(y);
  return p.silu ? rssm::siluf(y) : y;
}

}  // namespace

// One thread per (row, channel) or, vec, per (row, kVec channels). A row whose slot id is p.pad_slot_id or outside the
// pool is skipped: neither its output nor any state is written.
extern "C" __global__ void __launch_bounds__(kBlock) conv1d_update_kernel(const ConvParams p) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const long long b = blockIdx.y;
  long long slot = b;
  if (p.slot_ids) {
    slot = p.slot_ids[b];
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) return;
  }
  act_t* const row_state = p.conv_state + slot * p.s_state;
  if (p.vec) {
    constexpr int kHist = rssm::kVecConvWidth - 1;
    const int c0 = t * kVec;
    if (c0 >= p.channels) return;
    act_t* state = row_state + (long long)c0 * kHist;
    float s[kHist * kVec], w[rssm::kVecConvWidth * kVec], xn[kVec], y[kVec];
#pragma unroll
    for (int k = 0; k < kHist; ++k)
      rssm::load_vec<act_t, kVec>(state + k * kVec, reinterpret_cast<float(&)[kVec]>(s[k * kVec]));
#pragma unroll
    for (int k = 0; k < rssm::kVecConvWidth; ++k)
      rssm::load_vec<act_t, kVec>(p.weight + (long long)c0 * rssm::kVecConvWidth + k * kVec,
                                  reinterpret_cast<float(&)[kVec]>(w[k * kVec]));
    rssm::load_vec<act_t, kVec>(p.x + b * p.s_x + c0, xn);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {  // channel c0 + e: state s[e*kHist .. +kHist), weights w[e*width .. +width)
      float acc = conv_start(p, c0 + e);
#pragma unroll
      for (int k = 0; k < kHist; ++k) acc = fmaf(w[e * rssm::kVecConvWidth + k], s[e * kHist + k], acc);
      acc = fmaf(w[e * rssm::kVecConvWidth + kHist], xn[e], acc);
      y[e] = conv_output(acc, p, c0 + e);
    }
    rssm::store_vec<act_t, kVec>(p.out + b * p.s_out + c0, y);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
#pragma unroll
      for (int k = 0; k < kHist; ++k) s[e * kHist + k] = k + 1 < kHist ? s[e * kHist + k + 1] : xn[e];
    }
#pragma unroll
    for (int k = 0; k < kHist; ++k)
      rssm::store_vec<act_t, kVec>(state + k * kVec, reinterpret_cast<float(&)[kVec]>(s[k * kVec]));
    return;
  }
  const int c = t;
  if (c >= p.channels) return;
  const int hist = p.width - 1;
  act_t* state = row_state + (long long)c * hist;
  const act_t* w = p.weight + (long long)c * p.width;
  const act_t x_new = p.x[b * p.s_x + c];
  act_t window[rssm::kMaxConvWidth];
#pragma unroll
  for (int k = 0; k < rssm::kMaxConvWidth; ++k)
    if (k < hist) window[k] = state[k];
  float y = conv_start(p, c);
#pragma unroll
  for (int k = 0; k < rssm::kMaxConvWidth; ++k)
    if (k < p.width) y = fmaf(rssm::to_float(w[k]), rssm::to_float(k < hist ? window[k] : x_new), y);
  p.out[b * p.s_out + c] = rssm::from_float<act_t>(conv_output(y, p, c));
#pragma unroll
  for (int k = 0; k < rssm::kMaxConvWidth; ++k)
    if (k < hist) state[k] = k + 1 < hist ? window[k + 1] : x_new;
}
