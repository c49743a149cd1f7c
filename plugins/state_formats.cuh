// Checkpoint storage formats of the decode kernels: plain fp32/fp16/bf16 rows, FP8 E4M3 rows with an fp32 scale per
// row, and NVFP4 rows (E2M1 codes two per byte, an E4M3 scale per 16 elements, an fp32 second-level scale per row),
// with round-to-nearest-even and the stochastic rounding of trtllm_replayssm/core/quant.py (the contract these
// functions reproduce bit for bit: same scales, same uniforms, same rounding rule). Row and second-level scales are
// powers of two, so encoding needs no division outside stochastic rounding. Compiled with NVRTC.
#pragma once

#include "replayssm_common.cuh"

namespace rssm {

enum : int { kFmtPlain = 0, kFmtFp8 = 1, kFmtNvfp4 = 2 };
constexpr int kNvfp4Block = 16;          // elements per E4M3 block scale
constexpr float kE4m3Max = 448.f;
constexpr float kE2m1Max = 6.f;
constexpr unsigned int kInfBits = 0x7f800000u;  // magnitudes at or above these fp32 bits are Inf or NaN

// ---------------------------------------------------------------------------------------------- exact division
// RN(1 / b), ties to even, for a normal b > 0 whose reciprocal is normal (the reciprocals of FP8 row scales and,
// under stochastic rounding, of NVFP4 block scales, as torch's), without the slow-path call of IEEE division (which
// gives a kernel a stack frame) and without a branch (a warp's rows encoded together overlap: Rows::encode_rows).
// An approximation within one ulp, one Newton step with fp32 fmas (the residual 1 - b·q is exact), which keeps it
// within one ulp, then exact tests against the midpoints to both neighbours: b times a midpoint (24 x 25 bits) is
// exact in fp64, and the fp64 fma's rounded 1 - b·mid has the sign of the exact one.
__device__ __forceinline__ float rcp_rn(float b) {
  const float approx = __fdividef(1.f, b);
  const float q = fmaf(fmaf(-b, approx, 1.f), approx, approx);
  const float up = __uint_as_float(__float_as_uint(q) + 1u), down = __uint_as_float(__float_as_uint(q) - 1u);
  const double B = b;
  const double r_up = fma(-B, 0.5 * (double(q) + double(up)), 1.0);      // 1 / b above the midpoint to `up`: > 0
  const double r_down = fma(-B, 0.5 * (double(q) + double(down)), 1.0);  // below the one to `down`: < 0
  const bool odd = __float_as_uint(q) & 1u;                               // a tie goes to the even neighbour
  return r_up > 0.0 || (r_up == 0.0 && odd) ? up : r_down < 0.0 || (r_down == 0.0 && odd) ? down : q;
}

// ---------------------------------------------------------------------------------------------- E4M3 (sm_89+ cvt)
// The two E4M3 codes in half `hi` of `word` (0: bits 0..15, 1: bits 16..31; code 0 in the low byte) as an fp16 pair
// (exact: E4M3 values are fp16 values); the conversion reads the half in place.
__device__ __forceinline__ __half2 e4m3x2_to_half2(unsigned int word, int hi) {
  unsigned int h2;
  if (hi)
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h2) : "r"(word));
  else
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h2) : "r"(word));
  return *reinterpret_cast<__half2*>(&h2);
}

__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned int word, int hi) {
  return __half22float2(e4m3x2_to_half2(word, hi));
}

__device__ __forceinline__ float e4m3_to_float(unsigned int code) { return e4m3x2_to_float2(code & 0xffu, 0).x; }

// Round to nearest even; finite values and ±Inf beyond ±448 saturate, NaN stays NaN (quant.e4m3_round).
__device__ __forceinline__ unsigned int float_to_e4m3(float v) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.f), "f"(v));
  return pair & 0xffu;
}

// Two floats to E4M3 codes (a in the low byte), as float_to_e4m3.
__device__ __forceinline__ unsigned int float2_to_e4m3x2(float a, float b) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(b), "f"(a));
  return pair;
}

// ---------------------------------------------------------------------------------------------- E2M1
// The magnitude of E2M1 code c (0..7).
__device__ __forceinline__ float e2m1_magnitude(int c) {
  const int e = c >> 1, m = c & 1;
  return e == 0 ? 0.5f * m : __int_as_float((e + 126) << 23 | m << 22);
}

// Eight E2M1 codes (a 32-bit word, code 0 in the low nibble) as bytes whose value in an fp16's high byte is the
// code's value times 2^-14, subnormals included (the code's sign in bit 7, its exponent and mantissa in bits 1..3,
// the fp16's sign bit and bits 9..11); callers fold 2^14 (kE2m1Unscale) into their scale. Byte k of `even` holds
// code 2k, byte k of `odd` code 2k + 1. `pair(a, d)` puts codes a and a + d (d even) in an fp16x2 by one byte
// permute; `first_pair()` codes 0 and 1 of a word holding only those. Seven integer instructions for the word.
struct E2m1Bytes {
  unsigned int even, odd;
  __device__ __forceinline__ explicit E2m1Bytes(unsigned int w)
      : even(((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u)), odd(((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u)) {}
  __device__ __forceinline__ __half2 pair(int a, int d) const {
    return as_half2(__byte_perm(a % 2 ? odd : even, 0u, 0x0404u | (a / 2) << 4 | (a + d) / 2 << 12));
  }
  __device__ __forceinline__ __half2 first_pair() const {
    return as_half2(__byte_perm(even, odd, 0x4101u));  // byte 1 of `even` is zero: the low bytes
  }

 private:
  __device__ __forceinline__ static __half2 as_half2(unsigned int h) { return *reinterpret_cast<const __half2*>(&h); }
};
constexpr float kE2m1Unscale = 16384.f;  // 2^14

// ---------------------------------------------------------------------------------------------- power-of-two scales
constexpr float kScaleFloor = 0x1p-100f;  // quant.SCALE_FLOOR: amax below it gets scale 1
// The least power of two s with amax <= top · s, and 1 / s (quant.pow2_scale); both 1 for amax below 2^-100 or not
// finite. kTopBits: top's fp32 bits.
template <unsigned int kTopBits>
__device__ __forceinline__ void pow2_scale(float amax, float& s, float& inv) {
  const bool scaled = amax >= kScaleFloor && amax <= 3.40282347e38f;  // selects, not a branch (encode_rows)
  const unsigned int bits = __float_as_uint(amax);
  const int k = scaled ? int(bits >> 23) - int(kTopBits >> 23) + ((bits & 0x7fffffu) > (kTopBits & 0x7fffffu)) : 0;
  s = __uint_as_float(unsigned(k + 127) << 23);
  inv = __uint_as_float(unsigned(127 - k) << 23);
}
constexpr unsigned int kNvfp4TopBits = 0x45280000u;  // 6 · 448 = 2688
constexpr float kSixth = 1.f / 6.f;                  // fp32's 1/6 (quant.quantize_nvfp4)
constexpr float kInv448 = 1.f / 448.f;               // fp32's 1/448 (quant.quantize_fp8_rows)
// Rows a batched encode (Rows::encode_rows) reduces together: more rows overlap more reductions but hold more
// registers (H100, batch 8: a whole 16-row warp tile at once made Super's NVFP4 flush step 8% slower, groups of 2 made
// GDN/KDA's 4-6% slower than groups of 4; docs/decisions.md, a warp's stored rows encoded together).
constexpr int kEncodeGroup = 4;
// The most rows a warp encodes in groups (CheckpointRows::store_rows): the GDN/KDA whole-head module's state kernels
// (32 rows per warp, never launched by the planner) spill 8-48 B with groups of 4.
constexpr int kEncodeGroupMaxRows = 20;

// The E2M1 code of |x| / d rounded to nearest from the exact quotient, ties to the even code, saturating at 6, NaN
// giving 0 (quant.e2m1_codes_of_quotient): a bisection over the midpoints between neighbours times d, `t` holding
// them as {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} · d (exact products). The sign is left to the caller.
__device__ __forceinline__ unsigned int e2m1_quotient_code(float a, const float (&t)[7]) {
  const bool hi = a >= t[3];                        // 1.75: a tie goes up to code 4
  const bool mid = a >= (hi ? t[5] : t[1]);         // 3.5 / 0.75: ties up to codes 6 / 2
  const bool low = a > (hi ? (mid ? t[6] : t[4]) : (mid ? t[2] : t[0]));  // 5 / 2.5 / 1.25 / 0.25: ties down
  return (hi ? 4u : 0u) | (mid ? 2u : 0u) | (low ? 1u : 0u);
}

// Round |v| (NaN read as 0) to the nearest E2M1 magnitude, ties to the even code, saturating at 6; the sign of v
// (-0 included) in bit 3 (quant.e2m1_codes).
__device__ __forceinline__ unsigned int float_to_e2m1(float v) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
  unsigned short pair;
  asm("{\n .reg .b8 c;\n cvt.rn.satfinite.e2m1x2.f32 c, %1, %2;\n cvt.u16.u8 %0, c;\n}"
      : "=h"(pair) : "f"(0.f), "f"(v == v ? v : 0.f));
  return pair & 0xfu;
#else
  const float a = fminf(fabsf(v == v ? v : 0.f), kE2m1Max);
  const unsigned int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                            (a > 5.f);
  return code | (signbit(v) && v == v ? 8u : 0u);
#endif
}

// ---------------------------------------------------------------------------------------------- stochastic rounding
// Random123's Philox4x32-10.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    const unsigned int hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// One checkpoint write's random stream (quant.sr_uniforms): key (slot, flush count), the layer's seed, the stream
// (0: master or plain checkpoint, 1: read copy).
struct SrKey {
  unsigned int slot, flushes, stream, seed;
};

// The uniforms of elements e0 .. e0 + E - 1 of the slot's checkpoint (C-order indices).
template <int E>
__device__ __forceinline__ void sr_uniforms(const SrKey& key, long long e0, float (&u)[E]) {
  uint4 words = make_uint4(0, 0, 0, 0);
  long long q_have = -1;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const long long e = e0 + i, q = e >> 2;
    if (q != q_have) {
      words = philox4x32_10(make_uint4(static_cast<unsigned int>(q), static_cast<unsigned int>(q >> 32), key.stream,
                                       key.seed),
                            make_uint2(key.slot, key.flushes));
      q_have = q;
    }
    const int k = static_cast<int>(e & 3);
    const unsigned int w = k == 0 ? words.x : k == 1 ? words.y : k == 2 ? words.z : words.w;
    u[i] = static_cast<float>(w >> 8) * 5.9604644775390625e-8f;  // 2^-24
  }
}

// Stochastic rounding of v to a value of T's format (FMT_KIND below): ±hi with probability (|v| - lo) / (hi - lo),
// else ±lo (lo, hi the representable neighbours of |v|); values beyond the finite range and NaN are returned as they
// are (the round-to-nearest encoder then saturates or keeps them). The result is representable: encoding it to
// nearest is exact.
enum : int { kSrFp16 = 0, kSrBf16 = 1, kSrE4m3 = 2, kSrE2m1 = 3 };

template <int KIND> __device__ __forceinline__ int sr_code(float a);
template <int KIND> __device__ __forceinline__ float sr_value(int code);
template <> __device__ __forceinline__ int sr_code<kSrFp16>(float a) { return __half_as_ushort(__float2half_rn(a)); }
template <> __device__ __forceinline__ float sr_value<kSrFp16>(int c) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(c)));
}
template <> __device__ __forceinline__ int sr_code<kSrBf16>(float a) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(a));
}
template <> __device__ __forceinline__ float sr_value<kSrBf16>(int c) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(c)));
}
template <> __device__ __forceinline__ int sr_code<kSrE4m3>(float a) { return float_to_e4m3(a); }
template <> __device__ __forceinline__ float sr_value<kSrE4m3>(int c) { return e4m3_to_float(c); }
template <> __device__ __forceinline__ int sr_code<kSrE2m1>(float a) { return float_to_e2m1(a) & 7; }
template <> __device__ __forceinline__ float sr_value<kSrE2m1>(int c) { return e2m1_magnitude(min(c, 7)); }

template <int KIND> __device__ __forceinline__ float sr_top() {
  return KIND == kSrFp16 ? 65504.f : KIND == kSrBf16 ? 3.3895313892515355e38f : KIND == kSrE4m3 ? kE4m3Max
                                                                                                   : kE2m1Max;
}

// The stochastic-rounding kind of a 16-bit state element type.
template <typename T> struct SrKind;
template <> struct SrKind<__half> { static constexpr int value = kSrFp16; };
template <> struct SrKind<__nv_bfloat16> { static constexpr int value = kSrBf16; };

template <int KIND>
__device__ __forceinline__ float round_stochastic(float v, float u) {
  const float a = fabsf(v);
  if (!(a <= sr_top<KIND>())) return v;
  int code = sr_code<KIND>(a);
  if (sr_value<KIND>(code) > a) --code;
  const float lo = sr_value<KIND>(code);
  if (!(a > lo)) return copysignf(lo, v);
  const float hi = sr_value<KIND>(code + 1);
  const float p = (a - lo) * __uint_as_float((254u << 23) - __float_as_uint(hi - lo));  // / 2^k, exactly
  return copysignf(u < p ? hi : lo, v);
}

// ---------------------------------------------------------------------------------------------- rows of a checkpoint
// Rows of one (slot, head) checkpoint, or of a stage tile, in format FMT with C columns: `data` the first row's
// codes (T elements for plain rows), `block` its E4M3 block scales (NVFP4), `scale` its fp32 row scale (FP8,
// NVFP4); row r follows at r * kDataBytes, r * kBlockBytes, r. A warp holds a row: lane l its E = C / 32 consecutive
// columns l * E ...
// The block lane layout of a row of C columns: a lane holds kCols = 16 consecutive columns (an NVFP4 block), kRowLanes
// = C / 16 lanes per row, kPassRows = 32 / kRowLanes rows on a warp at once. With Rows::decode/encode (EL = kCols,
// kStride = kPassRows) the lanes of a row are interleaved with the other rows' (lane = block · kPassRows + row).
template <int C>
struct BlockLanes {
  static constexpr int kCols = 16;
  static constexpr int kRowLanes = C / kCols;
  static constexpr int kPassRows = kWarpSize / kRowLanes;
  static_assert(C % kCols == 0 && kWarpSize % kRowLanes == 0, "block lanes: rows of 32, 64, ... 512 columns");
};

template <int FMT, typename T, int C>
struct Rows {
  static constexpr int E = C / kWarpSize;
  static constexpr int kDataBytes = FMT == kFmtPlain ? C * int(sizeof(T)) : FMT == kFmtFp8 ? C : C / 2;
  static constexpr int kBlockBytes = FMT == kFmtNvfp4 ? C / kNvfp4Block : 0;
  static constexpr int kScaleBytes = FMT == kFmtPlain ? 0 : 4;
  static constexpr int kRowBytes = kDataBytes + kBlockBytes + kScaleBytes;  // formats.StateFormat.row_bytes
  static constexpr int kLaneBytes = kDataBytes / kWarpSize;
  static_assert(C % kWarpSize == 0, "columns must be a multiple of 32");
  static_assert(FMT != kFmtNvfp4 || (E % 2 == 0 && kNvfp4Block % E == 0),
                "NVFP4 rows need an even number of columns per lane dividing 16 (64, 128, 256 or 512 columns)");

  // Lane layouts of decode and encode: a row's C columns over C / EL lanes, each holding EL consecutive columns, its
  // `slot` (columns slot · EL ...); the lanes of one row differ in the lane bits kStride ... kStride · C / EL / 2
  // only. The default (EL = E, kStride = 1) is a row per warp, lane l holding slot l; EL = 16 and kStride =
  // 32 / (C / 16) put 32 / (C / 16) rows on a warp, a lane per 16-column block (lane = slot · kStride + row).
  template <int EL>
  static constexpr int kLaneBytesOf = kDataBytes * EL / C;

  unsigned char* data;
  unsigned char* block;
  float* scale;

  // A tile of `rows` rows stored contiguously part by part (a shared-memory stage): codes, block scales, row scales.
  __device__ __forceinline__ static Rows tile(void* base, int rows) {
    auto* b = static_cast<unsigned char*>(base);
    return {b, b + rows * kDataBytes, reinterpret_cast<float*>(b + rows * (kDataBytes + kBlockBytes))};
  }

  __device__ __forceinline__ Rows offset(int rows) const {
    return {data + (long long)rows * kDataBytes, block + rows * kBlockBytes, scale + rows};
  }

  // Warp-collective: asks L2 for the lines of rows 0 .. rows-1 (codes; block and row scales of quantized rows).
  __device__ __forceinline__ void prefetch_l2(int rows) const {
    rssm::prefetch_l2(data, rows * kDataBytes);
    if constexpr (FMT != kFmtPlain) {
      if (threadIdx.x % kWarpSize == 0) rssm::prefetch_line_l2(scale);
      if constexpr (kBlockBytes > 0) rssm::prefetch_l2(block, rows * kBlockBytes);
    }
  }

  // A lane's stored bytes of one row (slot `slot`, EL columns) in registers: the codes or plain values as words and,
  // for quantized rows, the row scale and the NVFP4 block-scale code. fetch() issues the loads and decode(Fetched)
  // converts them, so a loop over rows can keep the loads of the next rows in flight while it works on one.
  template <int EL = E>
  struct Fetched {
    unsigned int w[(kLaneBytesOf<EL> + 3) / 4];
    float row_scale;
    unsigned int block_code;
  };

  template <int EL = E>
  __device__ __forceinline__ Fetched<EL> fetch(int r, int slot) const {
    Fetched<EL> f;
    load_codes<kLaneBytesOf<EL>>(data + (long long)r * kDataBytes + slot * kLaneBytesOf<EL>, f.w);
    f.row_scale = FMT == kFmtPlain ? 1.f : scale[r];
    f.block_code = FMT == kFmtNvfp4 ? block[r * kBlockBytes + slot * EL / kNvfp4Block] : 0u;
    return f;
  }

  template <int EL = E>
  __device__ __forceinline__ void decode(const Fetched<EL>& f, float (&v)[EL]) const {
    if constexpr (FMT == kFmtPlain) {
      constexpr int kPerWord = 4 / int(sizeof(T));
#pragma unroll
      for (int i = 0; i < EL; ++i) v[i] = word_elem<T>(f.w[i / kPerWord], i % kPerWord);
    } else {
      const float s = unit_values(f, v);
#pragma unroll
      for (int i = 0; i < EL; ++i) v[i] *= s;
    }
  }

  // Row r's values of slot `slot` (EL columns; the default layout: slot = lane), decoded to float.
  template <int EL = E>
  __device__ __forceinline__ void decode(int r, int slot, float (&v)[EL]) const {
    decode<EL>(fetch<EL>(r, slot), v);
  }

  // This lane's part of row r · c (its E columns): the products of the codes' values and c, summed, times the
  // lane's scale once.
  __device__ __forceinline__ float dot(int r, int lane, const float (&c)[E]) const {
    const Fetched<E> f = fetch<E>(r, lane);
    float v[E];
    float s = 1.f;
    if constexpr (FMT == kFmtPlain) decode<E>(f, v);
    else s = unit_values(f, v);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < E; ++i) acc = fmaf(v[i], c[i], acc);
    return acc * s;
  }

  // The largest magnitude of the lane's values as fp32 bits (unsigned order is float order; NaN above Inf).
  template <int EL>
  __device__ __forceinline__ static unsigned int lane_max_magnitude(const float (&v)[EL]) {
    unsigned int m = 0u;
#pragma unroll
    for (int i = 0; i < EL; ++i) m = max(m, __float_as_uint(v[i]) & 0x7fffffffu);
    return m;
  }

  // Row r from this lane's float values (slot `slot` of the lane layout EL, kStride above): FMT's codes, rounded to
  // nearest or, with `sr` (key, and e0 the C-order index of the lane's first element in the slot's checkpoint),
  // stochastically; every lane of the warp calls it (the row and block maxima are reductions over lane groups).
  template <int EL = E, int kStride = 1>
  __device__ __forceinline__ void encode(int r, int slot, const float (&v)[EL], const SrKey* sr, long long e0) const {
    const float(&rows)[1][EL] = *reinterpret_cast<const float(*)[1][EL]>(&v);
    encode_rows<1, EL, kStride>(r, slot, rows, sr, e0);
  }

  // encode() of rows r0 .. r0 + kR - 1 (v[i]: row r0 + i, whose first element is e0 + i · C), kGroup rows at a time:
  // a group's maxima are reduced together (their shuffles independent, one vote for a non-finite value in any of its
  // rows), then each row's codes are formed without a branch, so that a warp's rows overlap instead of queueing
  // behind each other's reductions.
  // kGroup 1: one row at a time, each behind a vote (FP8 included), which keeps the compiler from interleaving rows.
  template <int kR, int EL = E, int kStride = 1, int kGroup = kEncodeGroup>
  __device__ __forceinline__ void encode_rows(int r0, int slot, const float (&v)[kR][EL], const SrKey* sr,
                                              long long e0) const {
    constexpr int kG = kR < kGroup ? kR : kGroup;
    encode_group<kG, EL, kStride, kGroup == 1>(r0, slot, *reinterpret_cast<const float(*)[kG][EL]>(&v[0]), sr, e0);
    if constexpr (kR > kG)
      encode_rows<kR - kG, EL, kStride, kGroup>(r0 + kG, slot, *reinterpret_cast<const float(*)[kR - kG][EL]>(&v[kG]),
                                                sr, e0 + (long long)kG * C);
  }

 private:
  // One group of encode_rows: the rows' maxima first, then each row's codes (kFenced: FP8 rows behind a vote too).
  template <int kR, int EL, int kStride, bool kFenced>
  __device__ __forceinline__ void encode_group(int r0, int slot, const float (&v)[kR][EL], const SrKey* sr,
                                               long long e0) const {
    constexpr int kRowLanes = C / EL;
    static_assert(C % EL == 0 && kRowLanes * kStride <= kWarpSize, "a row's lanes lie in one warp");
    if constexpr (FMT == kFmtPlain) {
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        float y[EL];
#pragma unroll
        for (int k = 0; k < EL; ++k) y[k] = v[i][k];
        if constexpr (sizeof(T) == 2) {
          if (sr) {
            float u[EL];
            sr_uniforms<EL>(*sr, e0 + (long long)i * C, u);
#pragma unroll
            for (int k = 0; k < EL; ++k) y[k] = round_stochastic<SrKind<T>::value>(y[k], u[k]);
          }
        }
        store_vec<T, EL>(reinterpret_cast<T*>(row_codes<EL>(r0 + i, slot)), y);
      }
    } else if constexpr (FMT == kFmtFp8) {
      unsigned int mag[kR];
      bool any_bad = false;
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        mag[i] = group_max<kRowLanes, kStride>(lane_max_magnitude(v[i]));
        any_bad |= mag[i] >= kInfBits;
      }
      // Fenced: a branch on a vote, as NVFP4 has. Without one the compiler interleaves every row of a warp's tile,
      // and tiles of more than kEncodeGroupMaxRows rows or stochastically rounded ones spill.
      if (kFenced && !__any_sync(0xffffffffu, any_bad)) {
#pragma unroll
        for (int i = 0; i < kR; ++i) encode_fp8_row<EL, false>(r0 + i, slot, v[i], mag[i], sr, e0 + (long long)i * C);
      } else {
#pragma unroll
        for (int i = 0; i < kR; ++i) encode_fp8_row<EL, true>(r0 + i, slot, v[i], mag[i], sr, e0 + (long long)i * C);
      }
    } else {
      constexpr int kBlockLanes = kNvfp4Block / EL;
      unsigned int bmag[kR];
      float amax[kR];
      bool any_bad = false;
#pragma unroll
      for (int i = 0; i < kR; ++i) bmag[i] = group_max<kBlockLanes, kStride>(lane_max_magnitude(v[i]));
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const unsigned int mag = group_max<kRowLanes, kStride>(bmag[i]);
        amax[i] = __uint_as_float(mag);
        any_bad |= mag >= kInfBits;
      }
      if (__any_sync(0xffffffffu, any_bad)) {  // the second-level scale takes the row's finite elements only
#pragma unroll
        for (int i = 0; i < kR; ++i) {
          float a = 0.f;
#pragma unroll
          for (int k = 0; k < EL; ++k) a = isfinite(v[i][k]) ? fmaxf(a, fabsf(v[i][k])) : a;
          a = group_max<kRowLanes, kStride>(a);
          if (__float_as_uint(amax[i]) >= kInfBits) amax[i] = a;
        }
      }
#pragma unroll
      for (int i = 0; i < kR; ++i)
        encode_nvfp4_row<EL>(r0 + i, slot, v[i], bmag[i], amax[i], sr, e0 + (long long)i * C);
    }
  }

  // Where row r's codes of slot `slot` (EL columns per slot) start.
  template <int EL>
  __device__ __forceinline__ unsigned char* row_codes(int r, int slot) const {
    return data + (long long)r * kDataBytes + slot * kLaneBytesOf<EL>;
  }

  // Row r's FP8 codes and row scale from the lane's values and the row's largest magnitude (`mag`: fp32 bits);
  // kMayBeBad: some row of the warp's group holds a NaN or an Inf.
  template <int EL, bool kMayBeBad>
  __device__ __forceinline__ void encode_fp8_row(int r, int slot, const float (&v)[EL], unsigned int mag,
                                                 const SrKey* sr, long long e0) const {
    const bool bad = kMayBeBad && mag >= kInfBits;  // a NaN or an Inf in the row
    const float amax = __uint_as_float(mag);
    const float s = !bad && amax >= kScaleFloor ? amax * kInv448 : 1.f;
    const float inv = rcp_rn(s);  // quant.quantize_fp8_rows: x times the rounded reciprocal
    float u[EL];
    if (sr) sr_uniforms<EL>(*sr, e0, u);
    float z[EL];
#pragma unroll
    for (int i = 0; i < EL; ++i) {
      z[i] = bad ? 0.f : v[i] * inv;
      if (sr) z[i] = round_stochastic<kSrE4m3>(z[i], u[i]);
    }
    unsigned int w[(EL + 3) / 4] = {};
#pragma unroll
    for (int i = 0; i < EL; i += 2)
      w[i / 4] |= float2_to_e4m3x2(z[i], i + 1 < EL ? z[i + 1] : 0.f) << (8 * (i % 4));
    store_codes<kLaneBytesOf<EL>>(row_codes<EL>(r, slot), w);
    if (slot == 0) scale[r] = bad ? __int_as_float(0x7fc00000) : s;
  }

  // Row r's NVFP4 codes, block scale and second-level scale from the lane's values, its block's largest magnitude
  // (`bmag`: fp32 bits, NaN above Inf) and the row's largest finite one (`amax`).
  template <int EL>
  __device__ __forceinline__ void encode_nvfp4_row(int r, int slot, const float (&v)[EL], unsigned int bmag,
                                                   float amax, const SrKey* sr, long long e0) const {
    static_assert(EL % 2 == 0 && kNvfp4Block % EL == 0, "NVFP4: an even number of columns per lane dividing 16");
    constexpr int kBlockLanes = kNvfp4Block / EL;
    const bool bad = bmag >= kInfBits;  // a NaN or an Inf in the block
    float g, inv_g;
    pow2_scale<kNvfp4TopBits>(amax, g, inv_g);
    const float bamax = __uint_as_float(bmag);
    const unsigned int bcode = float_to_e4m3(bad ? __int_as_float(0x7fc00000) : bamax * (inv_g * kSixth));
    const float b = e4m3_to_float(bcode);
    const bool live = b > 0.f && !bad;
    unsigned int w[(EL / 2 + 3) / 4] = {};
    if (sr) {
      float u[EL];
      sr_uniforms<EL>(*sr, e0, u);
      const float inv = live ? rcp_rn(b) * inv_g : 0.f;  // quant.quantize_nvfp4: RN(1 / b) / g, exact scaling
#pragma unroll
      for (int i = 0; i < EL; ++i)
        w[i / 8] |= float_to_e2m1(round_stochastic<kSrE2m1>(live ? v[i] * inv : 0.f, u[i])) << (4 * (i % 8));
    } else {  // codes of a dead block (zero scale, or a NaN or an Inf in it) are formed, then dropped: no branch
      const float d = b * g;  // exact: g is a power of two
      const float t[7] = {0.25f * d, 0.75f * d, 1.25f * d, 1.75f * d, 2.5f * d, 3.5f * d, 5.f * d};
#pragma unroll
      for (int i = 0; i < EL; ++i) {
        const unsigned int code = e2m1_quotient_code(fabsf(v[i]), t) | (__float_as_uint(v[i]) >> 31 << 3);
        w[i / 8] |= live ? code << (4 * (i % 8)) : 0u;
      }
    }
    store_codes<kLaneBytesOf<EL>>(row_codes<EL>(r, slot), w);
    if (slot % kBlockLanes == 0) block[r * kBlockBytes + slot / kBlockLanes] = static_cast<unsigned char>(bcode);
    if (slot == 0) scale[r] = g;
  }

  // A lane's fetched codes as values in units of the returned scale: FP8 the E4M3 values (scale: the row's), NVFP4
  // the E2M1 values times 2^-14 (scale: block scale times second-level scale times 2^14).
  template <int EL>
  __device__ __forceinline__ static float unit_values(const Fetched<EL>& f, float (&v)[EL]) {
    if constexpr (FMT == kFmtFp8) {
#pragma unroll
      for (int i = 0; i < EL; i += 2) {
        const float2 p = e4m3x2_to_float2(f.w[i / 4], i % 4 / 2);
        v[i] = p.x;
        if (i + 1 < EL) v[i + 1] = p.y;
      }
      return f.row_scale;
    } else {
      if constexpr (EL % 4 == 0) {
        constexpr int kWordCodes = EL < 8 ? EL : 8, kHalf = kWordCodes / 2;  // codes per word; pairs (i, i + kHalf)
#pragma unroll
        for (int j = 0; j < EL / kWordCodes; ++j) {
          const E2m1Bytes bytes(f.w[j]);
#pragma unroll
          for (int i = 0; i < kHalf; ++i) {
            const float2 p = __half22float2(bytes.pair(i, kHalf));
            v[j * kWordCodes + i] = p.x;
            v[j * kWordCodes + i + kHalf] = p.y;
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < EL; i += 2) {
          const float2 p = __half22float2(E2m1Bytes((f.w[i / 8] >> (8 * ((i / 2) % 4))) & 0xffu).first_pair());
          v[i] = p.x;
          v[i + 1] = p.y;
        }
      }
      return e4m3_to_float(f.block_code) * kE2m1Unscale * f.row_scale;
    }
  }

  // The lane's LB code bytes as 32-bit words (1, 2, 4, 8 or a multiple of 16 bytes; one load where aligned).
  template <int LB = kLaneBytes, int W>
  __device__ __forceinline__ static void load_codes(const unsigned char* src, unsigned int (&w)[W]) {
    if constexpr (LB == 1) w[0] = *src;
    else if constexpr (LB == 2) w[0] = *reinterpret_cast<const unsigned short*>(src);
    else if constexpr (LB == 4) w[0] = *reinterpret_cast<const unsigned int*>(src);
    else if constexpr (LB == 8) {
      const uint2 r = *reinterpret_cast<const uint2*>(src);
      w[0] = r.x;
      w[1] = r.y;
    } else {
#pragma unroll
      for (int c = 0; c < LB / 16; ++c) {
        const uint4 r = reinterpret_cast<const uint4*>(src)[c];
        w[4 * c] = r.x;
        w[4 * c + 1] = r.y;
        w[4 * c + 2] = r.z;
        w[4 * c + 3] = r.w;
      }
    }
  }

  template <int LB = kLaneBytes, int W>
  __device__ __forceinline__ static void store_codes(unsigned char* dst, const unsigned int (&w)[W]) {
    if constexpr (LB == 1) *dst = static_cast<unsigned char>(w[0]);
    else if constexpr (LB == 2) *reinterpret_cast<unsigned short*>(dst) = static_cast<unsigned short>(w[0]);
    else if constexpr (LB == 4) *reinterpret_cast<unsigned int*>(dst) = w[0];
    else if constexpr (LB == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    else {
#pragma unroll
      for (int c = 0; c < LB / 16; ++c)
        reinterpret_cast<uint4*>(dst)[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
    }
  }
};

// ---------------------------------------------------------------------------------------------- quantized row dots
// Dots of FP8 or NVFP4 rows (FMT) with NV vectors (a non-flush step's S·C; S·xq and S·xk) from fp16x2 products. Lane
// l takes 16 columns, block l % kLanes, of row q · kRowsPerPass + l / kLanes in pass q (NVFP4: 8 code bytes and one
// block scale; FP8: 16 code bytes); the kLanes = C / 16 lanes of a row sum its dots (`dots`). E4M3 values and E2M1
// values times 2^-14 (E2m1Bytes) are exact in fp16; each vector is scaled by a warp-wide power of two that puts its
// largest magnitude in [2^kTopExp, 2^(kTopExp + 1)) and rounded to fp16, so that the 8 products a half of a lane's
// fp16x2 sum adds stay far below 2^15 (E4M3: at most 448 · 2^4, E2M1: 6 · 2^-14 · 2^15) while the vector's values stay
// normal down to 2^-28 (FP8: 2^-17) of its largest; the lane widens its two halves and applies its block scale in
// fp32, the row scale and 2^(kValueExp - shift) apply to the row sums.
// FMT: kFmtFp8 or kFmtNvfp4 (the plain modules name the type in discarded code only).
template <int FMT, int C, int NV = 1>
struct QuantRowDots {
  static constexpr int kCols = BlockLanes<C>::kCols;          // columns per lane and row (an NVFP4 block)
  static constexpr int kLanes = BlockLanes<C>::kRowLanes;      // lanes per row (here a row's lanes are adjacent)
  static constexpr int kRowsPerPass = BlockLanes<C>::kPassRows;
  static constexpr int kTopExp = FMT == kFmtNvfp4 ? 14 : 3;
  static constexpr int kValueExp = FMT == kFmtNvfp4 ? 14 : 0;  // decoded values: the codes' times 2^-kValueExp
  // The lane's columns of vector v times 2^shift as fp16 pairs in the order the codes decode: NVFP4 word j, pair i
  // -> (x_{8j+i}, x_{8j+i+4}) (c[v][4 j + i]); FP8 -> (x_{2k}, x_{2k+1}) (c[v][k]).
  __half2 c[NV][8];
  float unscale[NV];  // 2^(kValueExp - shift)

  // From the vectors' values, `value(v, col)` the value of column col of vector v; warp-collective. The C / 2 column
  // pairs are spread over the warp, kOwnPairs a lane (lane l: pairs l · kOwnPairs ... mod C / 2; pair k of block b is
  // pair 8 b + k), so every column's value is read, scaled and rounded once (twice with 32 columns); each lane then
  // takes its block's 8 pairs from their lanes by shuffles (the same values as when every lane built its block).
  template <class F>
  __device__ __forceinline__ void init(F&& value) {
    constexpr int kPairs = kLanes * 8;                                      // C / 2
    constexpr int kOwnPairs = kPairs >= kWarpSize ? kPairs / kWarpSize : 1;  // pair k's register: k % kOwnPairs
    static_assert(8 % kOwnPairs == 0, "quantized row dots: at most 512 columns");
    const int lane = threadIdx.x % kWarpSize;
    float own[NV][kOwnPairs][2];
#pragma unroll
    for (int o = 0; o < kOwnPairs; ++o) {
      const int pair = (lane * kOwnPairs + o) % kPairs, b = pair / 8, k = pair % 8;
      const int a = b * kCols + (FMT == kFmtNvfp4 ? 8 * (k / 4) + k % 4 : 2 * k);
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        own[v][o][0] = value(v, a);
        own[v][o][1] = value(v, a + (FMT == kFmtNvfp4 ? 4 : 1));
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      unsigned int m = 0u;
#pragma unroll
      for (int o = 0; o < kOwnPairs; ++o)
        m = max(m, max(__float_as_uint(own[v][o][0]) & 0x7fffffffu, __float_as_uint(own[v][o][1]) & 0x7fffffffu));
      m = __reduce_max_sync(0xffffffffu, m);
      // a zero, Inf or NaN maximum keeps the values (non-finite inputs are not hidden)
      const int shift = m == 0u || m >= kInfBits ? 0 : min(max(kTopExp - (int(m >> 23) - 127), -100), 100);
      const float up = __uint_as_float(unsigned(127 + shift) << 23);
      unscale[v] = __uint_as_float(unsigned(127 + kValueExp - shift) << 23);
      unsigned int packed[kOwnPairs];
#pragma unroll
      for (int o = 0; o < kOwnPairs; ++o) {
        const __half2 h = __floats2half2_rn(own[v][o][0] * up, own[v][o][1] * up);
        packed[o] = *reinterpret_cast<const unsigned int*>(&h);
      }
      const int first = lane % kLanes * 8;  // this lane's block's first pair
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const unsigned int h = __shfl_sync(0xffffffffu, packed[k % kOwnPairs], (first + k) / kOwnPairs);
        c[v][k] = *reinterpret_cast<const __half2*>(&h);
      }
    }
  }

  // Eight E2M1 codes (a 32-bit word, code 0 in the low nibble) times c[v][4 j ...] summed into acc[v]: pair i holds
  // codes i and i + 4 (E2m1Bytes, values times 2^-14).
  __device__ __forceinline__ void e2m1_products(unsigned int w, int j, __half2 (&acc)[NV]) const {
    const E2m1Bytes bytes(w);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = bytes.pair(i, 4);
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[v] = __hfma2(h, c[v][4 * j + i], acc[v]);
    }
  }

  // This lane's parts of row r's dots (its columns), times the block scale (NVFP4); the row scale and `unscale` apply
  // to the sums. R: Rows<FMT, T, C> (generic, so that a call discarded in another format's kernel type-checks).
  template <class R>
  __device__ __forceinline__ void parts(const R& rows, int r, int lane, float (&out)[NV]) const {
    const int b = lane % kLanes;
    __half2 acc[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[v] = __float2half2_rn(0.f);
    float bs = 1.f;
    if constexpr (FMT == kFmtNvfp4) {
      const uint2 w = *reinterpret_cast<const uint2*>(rows.data + r * R::kDataBytes + b * 8);
      e2m1_products(w.x, 0, acc);
      e2m1_products(w.y, 1, acc);
      bs = e4m3_to_float(rows.block[r * R::kBlockBytes + b]);
    } else {
      const uint4 w = *reinterpret_cast<const uint4*>(rows.data + r * R::kDataBytes + b * kCols);
      const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const __half2 h = e4m3x2_to_half2(words[k / 2], k % 2);
#pragma unroll
        for (int v = 0; v < NV; ++v) acc[v] = __hfma2(h, c[v][k], acc[v]);
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float2 f = __half22float2(acc[v]);
      out[v] = (f.x + f.y) * bs;
    }
  }

  // Rows 0 .. kRows - 1 of `rows` (a multiple of kRowsPerPass): lane r < kRows gets row r's dots in out[v]. The
  // passes' lane parts are summed by one transposed reduction per vector (rssm::warp_sum_scatter over the kLanes lanes
  // of a row, the passes padded with zeros to a power of two): lane kLanes · i + j then holds row j · kRowsPerPass + i.
  template <int kRows, class R>  // R: as parts
  __device__ __forceinline__ void dots(const R& rows, int lane, float (&out)[NV]) const {
    static_assert(kRows % kRowsPerPass == 0 && kRows <= kWarpSize, "quantized row dots: whole passes of rows");
    constexpr int kPasses = kRows / kRowsPerPass;
    constexpr int kSlots = kPasses <= 1 ? 1 : kPasses <= 2 ? 2 : kPasses <= 4 ? 4 : kPasses <= 8 ? 8 : kPasses <= 16
                                                                                                       ? 16 : 32;
    float sums[NV][kSlots];
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      float sum[NV] = {};
      if (q < kPasses) parts(rows, q * kRowsPerPass + lane / kLanes, lane, sum);
#pragma unroll
      for (int v = 0; v < NV; ++v) sums[v][q] = sum[v];
    }
    const int holder = kLanes * (lane % kRowsPerPass) + (lane / kRowsPerPass) % kSlots;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float row_sum = __shfl_sync(0xffffffffu, warp_sum_scatter<kSlots, kLanes>(sums[v]), holder);
      out[v] = lane < kRows ? row_sum : 0.f;
    }
    const float rs = lane < kRows ? rows.scale[lane] : 0.f;
#pragma unroll
    for (int v = 0; v < NV; ++v) out[v] *= rs * unscale[v];
  }
};

// The checkpoint rows of one (slot, head) from row0 on that a flush writes: the master (format MASTER) and, in dual
// mode (READ != kFmtPlain), the read copy; R rows per head of C columns. `store` writes row row0 + r from this lane's
// fp32 values: the master and the read copy from the same values, rounded to nearest or (kSr) stochastically with the
// slot's streams of write `flushes` (core/checkpoint.py, the write rule). Warp-collective.
template <int MASTER, int READ, bool kSr, typename T, int R, int C>
struct CheckpointRows {
  Rows<MASTER, T, C> master;
  Rows<READ != kFmtPlain ? READ : MASTER, T, C> read;  // dual mode only
  int slot, head, row0;

  // (EL, kStride, col_slot: the lane layout of Rows::encode; by default a row per warp, col_slot = lane.)
  template <int EL = C / kWarpSize, int kStride = 1>
  __device__ __forceinline__ void store(int r, const float (&v)[EL], unsigned flushes, int seed,
                                        int col_slot = threadIdx.x % kWarpSize) const {
    store_group<1, EL, kStride, kEncodeGroup>(r, *reinterpret_cast<const float(*)[1][EL]>(&v), flushes, seed, col_slot);
  }

  // store() of rows r0 .. r0 + kR - 1, encoded kEncodeGroup at a time (Rows::encode_rows: their reductions overlap);
  // one at a time, each behind a vote, under stochastic rounding and for more than kEncodeGroupMaxRows rows (their
  // groups' encodes spill beside the rows).
  template <int kR, int EL = C / kWarpSize, int kStride = 1>
  __device__ __forceinline__ void store_rows(int r0, const float (&v)[kR][EL], unsigned flushes, int seed,
                                             int col_slot = threadIdx.x % kWarpSize) const {
    if constexpr (kSr || kR > kEncodeGroupMaxRows) {
#pragma unroll
      for (int r = 0; r < kR; ++r)  // a row's master and read copy, then the next row's
        store_group<1, EL, kStride, 1>(r0 + r, *reinterpret_cast<const float(*)[1][EL]>(&v[r]), flushes, seed,
                                       col_slot);
    } else {
      store_group<kR, EL, kStride, kEncodeGroup>(r0, v, flushes, seed, col_slot);
    }
  }

 private:
  template <int kR, int EL, int kStride, int kGroup>
  __device__ __forceinline__ void store_group(int r0, const float (&v)[kR][EL], unsigned flushes, int seed,
                                              int col_slot) const {
    const long long e0 = ((long long)head * R + row0 + r0) * C + col_slot * EL;
    const SrKey master_key{static_cast<unsigned>(slot), flushes, 0u, static_cast<unsigned>(seed)};
    constexpr bool kMasterSr = kSr && !(MASTER == kFmtPlain && sizeof(T) == 4);  // fp32: exact
    master.template encode_rows<kR, EL, kStride, kGroup>(r0, col_slot, v, kMasterSr ? &master_key : nullptr, e0);
    if constexpr (READ != kFmtPlain) {
      const SrKey read_key{static_cast<unsigned>(slot), flushes, 1u, static_cast<unsigned>(seed)};
      read.template encode_rows<kR, EL, kStride, kGroup>(r0, col_slot, v, kSr ? &read_key : nullptr, e0);
    }
  }
};

}  // namespace rssm
