// Shared device helpers for the ReplaySSM decode kernels: dtype codecs, vector loads/stores, warp reductions and
// scans, softplus/decay math, and the in-launch cursor advance. Compiled with NVRTC (no host code here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rssm {

constexpr int kWarpSize = 32;
constexpr int kNumWarps = 4;  // every decode kernel runs 4 warps per CTA (host side: core/limits.py NUM_WARPS)
constexpr int kThreads = kWarpSize * kNumWarps;
constexpr int kMaxL = 32;     // ring length limit: one ring entry per lane in the warp scans
constexpr int kMaxWindow = 8; // tokens per speculative verify window (T = 1 + drafts)
constexpr int kMaxConvWidth = 8;  // causal conv1d taps (host side: core/ops/conv.py MAX_CONV_WIDTH)
constexpr int kVecConvWidth = 4;  // the conv kernels' vector path's width (every supported model's conv)

template <bool kCond, class A, class B> struct Conditional { using type = A; };
template <class A, class B> struct Conditional<false, A, B> { using type = B; };
template <bool kCond, class A, class B> using conditional_t = typename Conditional<kCond, A, B>::type;

// ---------------------------------------------------------------------------------------------- dtype codecs
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Rounds a float through T (what a value becomes once stored in a T buffer).
template <typename T> __device__ __forceinline__ float round_through(float v) { return to_float(from_float<T>(v)); }

// ---------------------------------------------------------------------------------------------- vector access
// Raw vector type moving BYTES bytes in one instruction (BYTES in {2, 4, 8, 16}).
template <int BYTES> struct RawVec;
template <> struct RawVec<1> { using type = unsigned char; };
template <> struct RawVec<2> { using type = unsigned short; };
template <> struct RawVec<4> { using type = unsigned int; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<16> { using type = uint4; };

template <typename T, int E> struct VecTraits {
  static constexpr int kBytes = E * int(sizeof(T));
  static constexpr int kChunk = kBytes >= 16 ? 16 : kBytes;  // bytes per instruction
  static constexpr int kChunks = kBytes / kChunk;
  static constexpr int kPerChunk = kChunk / int(sizeof(T));
  using Raw = typename RawVec<kChunk>::type;
  static_assert(kBytes % kChunk == 0, "vector size must be a multiple of the access width");
};

// Loads E consecutive T (aligned to E*sizeof(T), or 16 B) and widens them to float.
template <typename T, int E, bool kStreaming = false>
__device__ __forceinline__ void load_vec(const T* __restrict__ src, float (&dst)[E]) {
  using VT = VecTraits<T, E>;
  const auto* raw = reinterpret_cast<const typename VT::Raw*>(src);
#pragma unroll
  for (int c = 0; c < VT::kChunks; ++c) {
    typename VT::Raw chunk;
    if constexpr (kStreaming && VT::kChunk == 16) {
      chunk = __ldcs(raw + c);
    } else {
      chunk = raw[c];
    }
    const T* elems = reinterpret_cast<const T*>(&chunk);
#pragma unroll
    for (int i = 0; i < VT::kPerChunk; ++i) dst[c * VT::kPerChunk + i] = to_float(elems[i]);
  }
}

// Widens element i of a raw vector register (the words of a 4/8/16-byte load) with bit operations only, so the
// register array never has its address taken (which can push it to local memory).
template <typename T> __device__ __forceinline__ float word_elem(unsigned int word, int i);
template <> __device__ __forceinline__ float word_elem<float>(unsigned int word, int) { return __uint_as_float(word); }
template <> __device__ __forceinline__ float word_elem<__half>(unsigned int word, int i) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(i ? word >> 16 : word & 0xffffu)));
}
template <> __device__ __forceinline__ float word_elem<__nv_bfloat16>(unsigned int word, int i) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(i ? word >> 16 : word & 0xffffu)));
}
__device__ __forceinline__ unsigned int raw_word(const uint4& r, int k) { return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w; }
__device__ __forceinline__ unsigned int raw_word(const uint2& r, int k) { return k == 0 ? r.x : r.y; }
__device__ __forceinline__ unsigned int raw_word(unsigned int r, int) { return r; }

// Element i of a raw chunk holding elements of T (T of 2 or 4 bytes; chunks of at least 4 bytes).
template <typename T, typename Raw>
__device__ __forceinline__ float raw_elem(const Raw& raw, int i) {
  constexpr int kPerWord = 4 / int(sizeof(T));
  return word_elem<T>(raw_word(raw, i / kPerWord), i % kPerWord);
}

// E consecutive T held as the raw registers of their loads: load_raw issues the loads, unpack widens them later, so a
// batch of loads is in flight before the first value is used (load_vec widens at once).
template <typename T, int E> struct RawVecOf {
  typename VecTraits<T, E>::Raw chunk[VecTraits<T, E>::kChunks];
};

template <typename T, int E>
__device__ __forceinline__ void load_raw(const T* __restrict__ src, RawVecOf<T, E>& dst) {
  const auto* raw = reinterpret_cast<const typename VecTraits<T, E>::Raw*>(src);
#pragma unroll
  for (int c = 0; c < VecTraits<T, E>::kChunks; ++c) dst.chunk[c] = raw[c];
}

template <typename T, int E>
__device__ __forceinline__ void unpack(const RawVecOf<T, E>& src, float (&dst)[E]) {
  using VT = VecTraits<T, E>;
#pragma unroll
  for (int c = 0; c < VT::kChunks; ++c)
#pragma unroll
    for (int i = 0; i < VT::kPerChunk; ++i) dst[c * VT::kPerChunk + i] = raw_elem<T>(src.chunk[c], i);
}

// The 32-bit word of 4 / sizeof(T) consecutive floats narrowed to T, by bit operations (no local array whose address
// is taken, which can push it to local memory).
__device__ __forceinline__ unsigned int bits16(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned int bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <typename T>
__device__ __forceinline__ unsigned int narrow_word(const float* v) {
  if constexpr (sizeof(T) == 4) return __float_as_uint(v[0]);
  else return bits16(from_float<T>(v[0])) | bits16(from_float<T>(v[1])) << 16;
}

// Narrows E floats to T and stores them (same alignment rule as load_vec). kGlobal (dst in global memory): every
// 16- and 8-byte chunk is one vector store instruction; plain stores of fp32 rows may reach the SASS as four scalar
// stores (docs/decisions.md, vector state stores).
template <typename T, int E, bool kGlobal = false>
__device__ __forceinline__ void store_vec(T* __restrict__ dst, const float (&src)[E]) {
  using VT = VecTraits<T, E>;
  using Raw = typename VT::Raw;
  constexpr int kWord = 4 / int(sizeof(T));  // elements per 32-bit word
  auto* raw = reinterpret_cast<Raw*>(dst);
#pragma unroll
  for (int c = 0; c < VT::kChunks; ++c) {
    const float* v = src + c * VT::kPerChunk;
    if constexpr (sizeof(Raw) == 16) {
      const uint4 chunk = make_uint4(narrow_word<T>(v), narrow_word<T>(v + kWord), narrow_word<T>(v + 2 * kWord),
                                     narrow_word<T>(v + 3 * kWord));
      if constexpr (kGlobal)
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(raw + c), "r"(chunk.x), "r"(chunk.y),
                     "r"(chunk.z), "r"(chunk.w));
      else raw[c] = chunk;
    } else if constexpr (sizeof(Raw) == 8) {
      const uint2 chunk = make_uint2(narrow_word<T>(v), narrow_word<T>(v + kWord));
      if constexpr (kGlobal) asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(raw + c), "r"(chunk.x), "r"(chunk.y));
      else raw[c] = chunk;
    } else if constexpr (sizeof(Raw) == 4) {
      raw[c] = narrow_word<T>(v);
    } else {
      dst[c * VT::kPerChunk] = from_float<T>(v[0]);  // one 16-bit element
    }
  }
}

// ---------------------------------------------------------------------------------------------- warp collectives
// `op` over a group of kLanes lanes (a power of two): the lanes that differ from this one in the lane bits
// kStride ... kStride · kLanes / 2 only (kLanes = 32, kStride = 1: the warp). Every lane of the warp calls it.
template <int kLanes, int kStride = 1, typename V, typename Op>
__device__ __forceinline__ V group_reduce(V v, Op op) {
  static_assert((kLanes & (kLanes - 1)) == 0 && kLanes * kStride <= kWarpSize, "lane groups within the warp");
#pragma unroll
  for (int m = kStride * kLanes / 2; m >= kStride; m /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

template <int kLanes, int kStride = 1>
__device__ __forceinline__ float group_sum(float v) {
  return group_reduce<kLanes, kStride>(v, [](float a, float b) { return a + b; });
}

__device__ __forceinline__ float warp_sum(float v) { return group_sum<kWarpSize>(v); }

template <int kLanes, int kStride = 1>
__device__ __forceinline__ float group_max(float v) {
  return group_reduce<kLanes, kStride>(v, [](float a, float b) { return fmaxf(a, b); });
}

template <int kLanes, int kStride = 1>
__device__ __forceinline__ unsigned int group_max(unsigned int v) {
  if constexpr (kLanes == kWarpSize) return __reduce_max_sync(0xffffffffu, v);
  else return group_reduce<kLanes, kStride>(v, [](unsigned int a, unsigned int b) { return max(a, b); });
}

// Transposed warp reduction of kValues per-lane partial sums (a power of two <= 32): lane l returns the sum over its
// group of kLanes lanes (aligned, a power of two from kValues to 32; default the warp) of v[l % kValues] (v is
// clobbered). Each halving step trades half of the values with the partner lane (kValues - 1 shuffles in all,
// independent within a step), then a butterfly over the lane bits from kValues up to kLanes: instead of
// log2(kLanes) kValues shuffles for kValues group sums. (Template parameters here avoid the kernels' one-letter
// macros.)
template <int kValues, int kLanes = kWarpSize>
__device__ __forceinline__ float warp_sum_scatter(float (&v)[kValues]) {
  static_assert(kValues >= 1 && kValues <= kLanes && kLanes <= kWarpSize && (kValues & (kValues - 1)) == 0 &&
                    (kLanes & (kLanes - 1)) == 0,
                "kValues and kLanes must be powers of two, kValues <= kLanes <= 32");
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int step = 1; step < kValues; step *= 2) {
    const int m = kValues / (2 * step);
    const bool upper = lane & m;  // keeps the values [m, 2m) of its range, the partner lane [0, m)
#pragma unroll
    for (int i = 0; i < m; ++i) {
      const float send = upper ? v[i] : v[i + m];
      v[i] = (upper ? v[i + m] : v[i]) + __shfl_xor_sync(0xffffffffu, send, m);
    }
  }
  float total = v[0];
#pragma unroll
  for (int m = kValues; m < kLanes; m *= 2) total += __shfl_xor_sync(0xffffffffu, total, m);
  return total;
}

// A row's columns spread over a group of kLanes lanes in 4-column chunks: lane c's i-th chunk starts at this column
// (chunks kLanes * 4 apart, so that a quarter-warp's 16-byte loads of a row are contiguous).
template <int kLanes>
__device__ __forceinline__ int group_chunk_col(int c, int i) {
  return i * kLanes * 4 + c * 4;
}

// Inclusive suffix sum over lanes: lane j gets sum_{i >= j} v_i.
__device__ __forceinline__ float warp_suffix_sum(float v) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int off = 1; off < kWarpSize; off <<= 1) {
    const float other = __shfl_down_sync(0xffffffffu, v, off);
    if (lane + off < kWarpSize) v += other;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------- decay math
// softplus with the threshold used by Mamba-2 / GDN reference code (identity above 20).
__device__ __forceinline__ float softplus_thr20(float v) { return v > 20.f ? v : log1pf(__expf(v)); }
__device__ __forceinline__ float sigmoidf(float v) { return 1.f / (1.f + __expf(-v)); }
__device__ __forceinline__ float siluf(float v) { return v * sigmoidf(v); }

// n / d for 0 <= n < 2^31 by a multiply-high and a shift (1 <= d < 2^31): the tile coordinates of the persistent
// kernels, where a division by a runtime head count cost ~25 dependent instructions per tile. The constructor (one
// 64-bit division) runs once per thread.
struct FastDiv {
  unsigned m, s;
  __device__ explicit FastDiv(unsigned d) : m(0), s(0) {
    while ((1u << s) < d) ++s;
    m = static_cast<unsigned>((1ull << 32) * ((1ull << s) - d) / d + 1);
  }
  __device__ __forceinline__ int operator()(int n) const {
    return static_cast<int>((__umulhi(static_cast<unsigned>(n), m) + static_cast<unsigned>(n)) >> s);
  }
};

// ---------------------------------------------------------------------------------------------- rows a step skips
// The row contract of every kernel (docs/design.md, "Rows a step skips"): a row whose slot id is pad_slot_id, outside
// [0, slots), repeats the id of an earlier row of the batch, or (replay kernels) whose slot's cursor is outside
// [0, L) writes zero outputs and touches no slot: no state, ring, cursor or counter write, no read outside a slot.

// A prep kernel's step word for a row it skips (flush steps are -(w + 1) < 0, others w < L <= kMaxL).
constexpr int kSkipStep = 0x7fffffff;

// A slot id, or pad_slot_id when it is outside [0, slots) (read as a pad row from here on); row_slot: row b's.
__device__ __forceinline__ int checked_slot(int id, int pad_slot_id, int slots) {
  return static_cast<unsigned>(id) < static_cast<unsigned>(slots) ? id : pad_slot_id;
}

__device__ __forceinline__ int row_slot(const int* slot_idx, int b, int pad_slot_id, int slots) {
  return checked_slot(slot_idx[b], pad_slot_id, slots);
}

// Prefetch of the line holding `src` into L2: a hint for global loads to come (a persistent producer's for a flush
// tile's fold; a programmatic state kernel's before its wait).
__device__ __forceinline__ void prefetch_line_l2(const void* src) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
}

// Warp-collective prefetch_line_l2 of `bytes` from `src` (one 128-byte line per lane and pass).
__device__ __forceinline__ void prefetch_l2(const void* src, int bytes) {
  for (int off = (threadIdx.x % kWarpSize) * 128; off < bytes; off += kWarpSize * 128)
    prefetch_line_l2(static_cast<const char*>(src) + off);
}

// Programmatic state kernels (the baseline, flush and one-launch replay kernels; LaunchPlan.programmatic): launched
// as programmatic dependents of the kernel before them, they may start while it runs. Until `griddepcontrol.wait`
// they use nothing that kernel may write: `guessed_slot` reads row b's slot id around L1 (it may be stale or torn;
// checked_slot bounds it) only to ask L2 for the lines the CTA will load from that slot, hints that a wrong guess
// merely wastes. Then `wait_previous_grid` waits for the kernel before (its writes are visible after the wait) and
// lets the next kernel launch (only after the wait, so that at most one grid waits). Launched plainly, the wait
// returns at once.
__device__ __forceinline__ int guessed_slot(const int* slot_idx, int b, int pad_slot_id, int slots) {
  return checked_slot(__ldcg(slot_idx + b), pad_slot_id, slots);
}

__device__ __forceinline__ void wait_previous_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ bool cursor_in_ring(int w, int L) {
  return static_cast<unsigned>(w) < static_cast<unsigned>(L);
}

// The repeated-slot test, in two parts so that its one load per thread for batches up to `stride` rows overlaps the
// caller's other loads: preload_row_id early (row `first`'s id), earlier_row_has where the answer is needed (this
// thread's share: rows first, first + stride, ... < b; the caller reduces it over the warp with __any_sync or over
// the CTA with __syncthreads_or, never a CTA barrier right after state loads: it would wait for them).
__device__ __forceinline__ int preload_row_id(const int* slot_idx, int b, int first) {
  return first < b ? slot_idx[first] : 0;
}

__device__ __forceinline__ bool earlier_row_has(const int* slot_idx, int b, int slot, int first, int stride,
                                                int first_id) {
  bool found = first < b && first_id == slot;
  for (int i = first + stride; i < b; i += stride) found |= slot_idx[i] == slot;
  return found;
}

// Whether a stage's (slot, step) words, as the producer copied them, name a row the consumers skip.
__device__ __forceinline__ bool skipped_stage_row(int slot, int step, int pad_slot_id, int slots) {
  return slot == pad_slot_id || static_cast<unsigned>(slot) >= static_cast<unsigned>(slots) || step == kSkipStep;
}

// ---------------------------------------------------------------------------------------------- cursor advance
// An arrival is made once per CTA (or warp) by one thread after every thread of it has read `cursor[slot]` (i.e. after
// a __syncthreads / __syncwarp that follows the read). The arrival that comes last among `ctas_per_slot` writes the new
// cursor (and, given `flushes`, counts the slot's checkpoint write) and re-arms the counter, so every reader of the
// row sees the old cursor and the next launch sees the new one.
// No fence: the only readers of what this launch writes (cursor, counter, ring entries) are later launches, ordered by
// the kernel boundary (or griddepcontrol.wait). CUDA-graph safe, no host sync.
// The arrival alone (one thread per CTA): how many of the slot's CTAs arrived before this one. A kernel with work
// after its arrival keeps the answer and passes it to advance_if_last at its end, so that the atomic's round trip
// overlaps the work instead of holding up the arriving warp.
__device__ __forceinline__ int cta_arrival(int* __restrict__ arrive, int slot) { return atomicAdd(arrive + slot, 1); }

// The last arrival (`before` == ctas_per_slot - 1) writes the new cursor, counts the slot's checkpoint write (given
// `flushes`) and re-arms the counter.
__device__ __forceinline__ void advance_if_last(int before, int* __restrict__ cursor, int* __restrict__ arrive,
                                                int slot, int ctas_per_slot, int new_cursor, int* flushes = nullptr) {
  if (before == ctas_per_slot - 1) {
    cursor[slot] = new_cursor;
    if (flushes) flushes[slot] += 1;
    arrive[slot] = 0;
  }
}

__device__ __forceinline__ void arrive_and_advance(int* __restrict__ cursor, int* __restrict__ arrive, int slot,
                                                   int ctas_per_slot, int new_cursor, int* flushes = nullptr) {
  advance_if_last(cta_arrival(arrive, slot), cursor, arrive, slot, ctas_per_slot, new_cursor, flushes);
}

// ---------------------------------------------------------------------------------------------- speculative cursor
// The cursor word of a speculatively decoded slot (trtllm_replayssm/core/spec_cursor.py, the one description of the
// rule): `count` committed ring records from ring position `origin`, word = origin | count << 8. A verify of T tokens
// folds the history first when count + 2T > R (ring length R), then writes the window at the positions after it.
struct SpecCursor {
  int origin, count;
  __device__ static SpecCursor of(int word) { return {word & 0xff, word >> 8}; }
  __device__ int word() const { return origin | count << 8; }
  __device__ bool valid(int window, int ring_len) const {
    return count >= 0 && origin < ring_len && count + window <= ring_len;
  }
  __device__ bool folds_before(int window, int ring_len) const { return count + 2 * window > ring_len; }
  __device__ int position(int j, int ring_len) const {  // ring position of history record j (0: the oldest)
    const int q = origin + j;
    return q < ring_len ? q : q - ring_len;
  }
};

// ---------------------------------------------------------------------------------------------- tile streaming
// Persistent replay kernels stream state tiles through a ring of shared-memory stages: one producer warp issues bulk
// async copies (sm_90+: cp.async.bulk completing on an mbarrier), the consumer warps wait on a stage's `full` barrier,
// read it, and arrive on its `empty` barrier so the producer can refill it. A CTA's i-th tile goes into stage
// i % stages. Two schedules: produce_tiles / consume_tiles assign every tile round-robin (t = blockIdx.x + i *
// gridDim.x); the `_claiming_tail` pair does so for tiles t < tail_start (a multiple of gridDim.x) and has the CTAs
// done with their share claim the rest (the tail) one at a time from a counter, so the CTAs of SMs that stream faster
// take more of them (H200: the CTAs of a static schedule end up to ~30% apart). Each kernel instantiates one of them.
constexpr int kMaxStages = 8;
constexpr int kTileWord = 3;  // stage info words: slot, step, (the kernel's own), claimed tile (-1: no more)

__device__ __forceinline__ int* stage_tile_word(unsigned char* stage, int tile_bytes) {
  return reinterpret_cast<int*>(stage + tile_bytes) + kTileWord;
}

struct TilePipe {
  unsigned long long full[kMaxStages];   // producer arrive (+ transaction bytes) -> consumers may read the stage
  unsigned long long empty[kMaxStages];  // one arrive per consumer warp -> producer may refill the stage
  unsigned long long fold_full, fold_empty;  // the fold buffer (see fold_buffer_* below), same protocol
};

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes this thread's barrier initialisations visible to the async proxy (bulk copies) before the CTA synchronises.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Thread 0 initialises `bar` for `count` arrivals, visible to bulk copies; every thread of the CTA calls it (it
// synchronises).
__device__ __forceinline__ void mbar_init_cta(unsigned long long* bar, unsigned count) {
  if (threadIdx.x == 0) {
    mbar_init(bar, count);
    mbar_init_fence();
  }
  __syncthreads();
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// More transaction bytes for the current phase of `bar` (issued before the bulk copies that bring them).
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// Producer warp, a tile input: `bytes` from `src` into `dst` by one bulk copy from lane 0 completing on the stage's
// `full` barrier, where both addresses are 16-byte aligned and `bytes` a multiple of 16; returns false (nothing
// issued) otherwise, and the caller copies by words. Warp-uniform arguments.
__device__ __forceinline__ bool bulk_copy_input(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  if (((reinterpret_cast<unsigned long long>(src) | smem_addr(dst) | bytes) & 15u) != 0) return false;
  if (bytes != 0 && threadIdx.x % kWarpSize == 0) {
    mbar_expect_tx(bar, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
  }
  return true;
}

// Bulk copy of `bytes` (multiple of 16, both addresses 16-byte aligned) global -> shared, completing on `bar`;
// L2 evict-first (the state is read once per step).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// Bulk-copy issue helpers for the producer warp.
// Arrive on a stage's `full` barrier from lane 0: with the transaction bytes of a bulk copy that follows, or plainly.
__device__ __forceinline__ void stage_state_copy(TilePipe& pipe, int s, unsigned char* dst, const void* src,
                                                 unsigned bytes) {
  if (threadIdx.x % kWarpSize != 0) return;
  if (src == nullptr) {
    mbar_arrive(&pipe.full[s]);
  } else {
    mbar_arrive_expect_tx(&pipe.full[s], bytes);
    bulk_load(dst, src, bytes, &pipe.full[s]);
  }
}

// A checkpoint tile stored in parts (codes, block scales, row scales: plugins/state_formats.cuh), copied into
// consecutive bytes of the stage; src[0] null for a pad row. Every part a multiple of 16 bytes, 16-byte aligned.
struct TileParts {
  const void* src[3];
  unsigned bytes[3];
};

__device__ __forceinline__ void stage_state_copy(TilePipe& pipe, int s, unsigned char* dst, const TileParts& parts,
                                                 unsigned bytes) {
  if (threadIdx.x % kWarpSize != 0) return;
  if (parts.src[0] == nullptr) {
    mbar_arrive(&pipe.full[s]);
    return;
  }
  mbar_arrive_expect_tx(&pipe.full[s], bytes);
  unsigned off = 0;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    if (parts.bytes[i] == 0) continue;
    bulk_load(dst + off, parts.src[i], parts.bytes[i], &pipe.full[s]);
    off += parts.bytes[i];
  }
}

// 4-byte async copy global -> shared (both 4-byte aligned), tracked by the issuing thread's cp.async arrive below.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// `words` 4-byte words from src to dst, spread over the calling warp's lanes.
__device__ __forceinline__ void cp_async_words(void* dst, const void* src, int words) {
  for (int i = threadIdx.x % kWarpSize; i < words; i += kWarpSize)
    cp_async4(static_cast<unsigned*>(dst) + i, static_cast<const unsigned*>(src) + i);
}

// 16-byte async copy global -> shared (both 16-byte aligned), cached in L2 only; completes like cp_async4.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// `pieces` pieces of kPieceBytes (a multiple of 4) from src_of(i) into dst + i * kPieceBytes, spread over the calling
// warp's lanes in 16-byte chunks (4-byte words where kPieceBytes is no multiple of 16, or a chunk's addresses are not
// 16-byte aligned): one warp instruction moves up to 512 bytes of short rows from scattered places (ring records,
// window tokens), where a bulk copy per row costs the producer ~50 instructions. Completes like cp_async4.
template <int kPieceBytes, class SrcOf>
__device__ __forceinline__ void cp_async_pieces(unsigned char* dst, int pieces, SrcOf src_of) {
  static_assert(kPieceBytes % 4 == 0, "pieces of whole words");
  constexpr int kChunk = kPieceBytes % 16 == 0 ? 16 : 4, kChunks = kPieceBytes / kChunk;
  for (int q = threadIdx.x % kWarpSize; q < pieces * kChunks; q += kWarpSize) {
    const int i = q / kChunks, k = q - i * kChunks;
    const unsigned char* src = static_cast<const unsigned char*>(static_cast<const void*>(src_of(i))) + k * kChunk;
    unsigned char* d = dst + i * kPieceBytes + k * kChunk;
    if (kChunk == 16 && ((reinterpret_cast<unsigned long long>(src) | smem_addr(d)) & 15u) == 0) {
      cp_async16(d, src);
    } else {
#pragma unroll
      for (int w = 0; w < kChunk / 4; ++w) cp_async4(d + 4 * w, src + 4 * w);
    }
  }
}

// Prefetch of the line holding `src` into L1 (no register result: a later load of it hits L1).
__device__ __forceinline__ void prefetch_l1(const void* src) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(src));
}

// Commits this thread's cp.async copies issued so far as a group; cp_async_wait_all waits until all have landed.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Every producer lane: the stage's `full` barrier counts this lane's arrival once its prior cp.async copies landed.
__device__ __forceinline__ void cp_async_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Thread 0 initialises the stage barriers; every thread of the CTA must call it (it synchronises). A stage's `full`
// barrier completes on lane 0's arrival (with the state copy's bytes) plus one cp.async arrival per producer lane.
__device__ __forceinline__ void pipe_init(TilePipe& pipe, int stages, int consumer_warps) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&pipe.full[s], 1 + kWarpSize);
      mbar_init(&pipe.empty[s], consumer_warps);
    }
    mbar_init(&pipe.fold_full, kWarpSize);
    mbar_init(&pipe.fold_empty, consumer_warps);
    mbar_init_fence();
  }
  __syncthreads();
}

// Consumer warp: done reading stage s (one arrive per warp).
__device__ __forceinline__ void release_stage(TilePipe& pipe, int s) {
  __syncwarp();
  if (threadIdx.x % kWarpSize == 0) mbar_arrive(&pipe.empty[s]);
}

// Checkpoint tiles a producer copies before `griddepcontrol.wait`, while the prep kernel still runs (prep never writes
// the state): the latency-bound prep is the step's critical path and this traffic slows it. H200, batch 256: one tile
// beat two and none (Qwen3.5-4B fp32 150.7 -> 149.9 us, Nemotron-3-Nano-4B bf16 230.4 -> 222.6;
// docs/decisions.md, preloaded tiles).
constexpr int kPreloadTiles = 1;

// Producer, before `griddepcontrol.wait`: the checkpoint copies of the CTA's first round-robin tiles below `end`
// into stages 0, 1, ... (at most kPreloadTiles and `stages`); `slot_lane`: lane k holds the k-th tile's slot.
// Returns how many were issued.
template <class CoordFn, class StateSrcFn>
__device__ __forceinline__ int preload_states(TilePipe& pipe, unsigned char* stage_mem, int stages, int stage_bytes,
                                              int end, int tile_bytes, int slot_lane, CoordFn& coord,
                                              StateSrcFn& state_src) {
  int i = 0;
  for (; i < kPreloadTiles && i < stages && blockIdx.x + i * gridDim.x < end; ++i) {
    const auto c = coord(blockIdx.x + i * gridDim.x);
    const int slot = __shfl_sync(0xffffffffu, slot_lane, i);
    stage_state_copy(pipe, i, stage_mem + (long long)i * stage_bytes, state_src(slot, c), tile_bytes);
  }
  return i;
}

// Producer: after a tile's checkpoint copy into stage s, its slot and step into the stage's info words and, for a
// row the step does not skip, `copy_inputs(stage, c, slot, info, full)`, all completing on the stage's `full` barrier
// (async copies, or bulk copies from lane 0 that add their bytes to `full`: bulk_copy_input).
// `slot`: rssm::row_slot's (pad_slot_id for an id outside the pool); the consumers test the copied words with
// skipped_stage_row.
template <class Coord, class InputsFn>
__device__ __forceinline__ void stage_tile_inputs(TilePipe& pipe, int s, unsigned char* stage, int tile_bytes,
                                                  const int* slot_idx, const int* step, int pad_slot_id,
                                                  const Coord& c, int slot, int info, InputsFn& copy_inputs) {
  if (threadIdx.x % kWarpSize == 0) {
    cp_async4(stage + tile_bytes, slot_idx + c.b);
    if (slot != pad_slot_id) cp_async4(stage + tile_bytes + 4, step + c.b);
  }
  if (slot != pad_slot_id && info != kSkipStep) copy_inputs(stage, c, slot, info, &pipe.full[s]);
  cp_async_arrive(&pipe.full[s]);
}

// The stage of a CTA's i-th tile, i % stages, and the parity of its use, (i / stages) & 1, advanced one tile at a time
// (a division by the runtime stage count cost each producer and consumer ~40 instructions per tile).
struct StageCursor {
  int i = 0, s = 0, round = 0;
  __device__ __forceinline__ void next(int stages) {
    ++i;
    if (++s == stages) s = 0, ++round;
  }
  // Producer: wait until the consumers released the stage's previous use.
  __device__ __forceinline__ void wait_empty(TilePipe& pipe) const {
    if (round > 0) mbar_wait(&pipe.empty[s], (round - 1) & 1);
  }
  __device__ __forceinline__ void wait_full(TilePipe& pipe) const { mbar_wait(&pipe.full[s], round & 1); }
};

// The persistent replay kernels' schedule. Producer warp: the checkpoint tile of each of the CTA's tiles by one bulk
// copy into its stage (the first kPreloadTiles before the prep kernel has finished, preload_states), then,
// after `griddepcontrol.wait`, the tile's slot and step into the stage's first words (`info`, right after the
// checkpoint tile) and, for a non-pad row, `copy_inputs(stage, c, slot, info, full)` (async copies of everything else),
// all completing on the stage's `full` barrier. Slots and steps of 32 tiles are loaded at once (one lane each).
// `coord(t)`: tile t's coordinates (batch row `.b`); `state_src(slot, c)`: its checkpoint tile.
template <class CoordFn, class StateSrcFn, class InputsFn>
__device__ __forceinline__ void produce_tiles(TilePipe& pipe, unsigned char* stage_mem, int stages, int stage_bytes,
                                              int num_tiles, int tile_bytes, const int* slot_idx, const int* step,
                                              int pad_slot_id, int slots, CoordFn coord, StateSrcFn state_src,
                                              InputsFn copy_inputs) {
  const int lane = threadIdx.x % kWarpSize, stride = gridDim.x;
  auto lane_slot = [&](int base) {
    const int t = base + lane * stride;
    return t < num_tiles ? row_slot(slot_idx, coord(t).b, pad_slot_id, slots) : pad_slot_id;
  };
  int slot_lane = lane_slot(blockIdx.x);
  const int preloaded =
      preload_states(pipe, stage_mem, stages, stage_bytes, num_tiles, tile_bytes, slot_lane, coord, state_src);
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the prep kernel's scratch and ring appends
  StageCursor at;
  for (int base = blockIdx.x; base < num_tiles; base += kWarpSize * stride) {
    if (base != blockIdx.x) slot_lane = lane_slot(base);
    const int t_lane = base + lane * stride;
    const int step_lane = t_lane < num_tiles ? step[coord(t_lane).b] : 0;
    for (int k = 0; k < kWarpSize && base + k * stride < num_tiles; ++k, at.next(stages)) {
      const auto c = coord(base + k * stride);
      const int slot = __shfl_sync(0xffffffffu, slot_lane, k);
      const int info = __shfl_sync(0xffffffffu, step_lane, k);
      unsigned char* stage = stage_mem + (long long)at.s * stage_bytes;
      if (at.i >= preloaded) {
        at.wait_empty(pipe);
        stage_state_copy(pipe, at.s, stage, state_src(slot, c), tile_bytes);
      }
      stage_tile_inputs(pipe, at.s, stage, tile_bytes, slot_idx, step, pad_slot_id, c, slot, info, copy_inputs);
    }
  }
}

// Consumer warps: each of the CTA's tiles once its stage is full: `tile(t, stage, s)` (which releases stage s).
template <class TileFn>
__device__ __forceinline__ void consume_tiles(TilePipe& pipe, unsigned char* stage_mem, int stages, int stage_bytes,
                                              int num_tiles, TileFn tile) {
  StageCursor at;
  for (int t = blockIdx.x; t < num_tiles; t += gridDim.x, at.next(stages)) {
    at.wait_full(pipe);
    tile(t, stage_mem + (long long)at.s * stage_bytes, at.s);
  }
}

// produce_tiles with a claimed tail: tiles t < tail_start are the CTA's round-robin share as there; the rest are
// claimed from `*claims` (zeroed by the prep kernel), each claim made one tile ahead; a claimed tile's index goes into
// its stage's tile word, and a last stage with -1 there ends the consumers' loop (consume_tiles_claiming_tail). With
// `flush_rows_apart` a tile whose step word marks a flush (< 0) is left to another kernel: its stage gets the slot and
// step words only (a preloaded one keeps its state copy), and the consumers skip it.
template <class CoordFn, class StateSrcFn, class InputsFn>
__device__ __forceinline__ void produce_tiles_claiming_tail(TilePipe& pipe, unsigned char* stage_mem, int stages,
                                                            int stage_bytes, int num_tiles, int tile_bytes,
                                                            const int* slot_idx, const int* step, int pad_slot_id,
                                                            int slots, int tail_start, int* claims, CoordFn coord,
                                                            StateSrcFn state_src, InputsFn copy_inputs,
                                                            bool flush_rows_apart = false) {
  const int lane = threadIdx.x % kWarpSize, stride = gridDim.x;
  const int static_end = min(tail_start, num_tiles);
  auto lane_slot = [&](int base) {
    const int t = base + lane * stride;
    return t < static_end ? row_slot(slot_idx, coord(t).b, pad_slot_id, slots) : pad_slot_id;
  };
  int slot_lane = lane_slot(blockIdx.x), step_lane = 0;
  const int preloaded =
      preload_states(pipe, stage_mem, stages, stage_bytes, static_end, tile_bytes, slot_lane, coord, state_src);
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the prep kernel's scratch, ring appends and claim counter
  const int statics = blockIdx.x < static_end ? (static_end - blockIdx.x + stride - 1) / stride : 0;
  // Claims run one tile ahead: while a claimed tile's copies are issued, the next claim's tile is known and its row's
  // slot id and step word are in flight (raw: checked where used), and the claim after it is out.
  int claim = 0;                                     // lane 0: the claim in flight
  int next_t = num_tiles, next_id = 0, next_step = 0;  // the next claimed tile, its row's slot id and step word
  auto take_claim = [&] {
    next_t = tail_start + __shfl_sync(0xffffffffu, claim, 0);
    if (next_t < num_tiles) {
      const int b = coord(next_t).b;
      next_id = slot_idx[b];
      next_step = step[b];  // every row has one (b < batch); a pad row's is stale and unused
    }
    claim = lane == 0 ? atomicAdd(claims, 1) : 0;
  };
  StageCursor at;
  for (;; at.next(stages)) {  // one call site of copy_inputs: the kernels inline it
    int t = blockIdx.x + at.i * stride, slot, info;
    const bool claimed = t >= static_end;
    if (!claimed) {
      const int k = at.i % kWarpSize;
      if (k == 0) {
        if (at.i > 0) slot_lane = lane_slot(t);
        const int t_lane = t + lane * stride;
        step_lane = t_lane < static_end ? step[coord(t_lane).b] : 0;
      }
      slot = __shfl_sync(0xffffffffu, slot_lane, k);
      info = __shfl_sync(0xffffffffu, step_lane, k);
    } else {
      if (static_end == num_tiles) return;
      if (at.i == statics) {  // the CTA's first claim
        claim = lane == 0 ? atomicAdd(claims, 1) : 0;
        take_claim();
      }
      t = next_t;
      if (t >= num_tiles) break;
      slot = checked_slot(next_id, pad_slot_id, slots);
      info = slot == pad_slot_id ? 0 : next_step;
      take_claim();
    }
    const auto c = coord(t);
    unsigned char* stage = stage_mem + (long long)at.s * stage_bytes;
    const bool apart = flush_rows_apart && info < 0;  // a flush row another kernel folds: slot and step words only
    if (at.i >= preloaded) {
      at.wait_empty(pipe);
      if (claimed && lane == 0) *stage_tile_word(stage, tile_bytes) = t;  // published by the arrive below
      stage_state_copy(pipe, at.s, stage, apart ? decltype(state_src(slot, c)){} : state_src(slot, c), tile_bytes);
    }
    stage_tile_inputs(pipe, at.s, stage, tile_bytes, slot_idx, step, pad_slot_id, c, slot, apart ? kSkipStep : info,
                      copy_inputs);
  }
  at.wait_empty(pipe);  // no tile left: a stage with tile index -1
  unsigned char* last = stage_mem + (long long)at.s * stage_bytes;
  if (lane == 0) {
    *stage_tile_word(last, tile_bytes) = -1;
    mbar_arrive(&pipe.full[at.s]);
  }
  cp_async_arrive(&pipe.full[at.s]);
}

// Programmatic dependent launches: a replay step's prep and main kernels are each launched as programmatic dependents
// of the kernel before them on the stream and wait for it (`griddepcontrol.wait`) before touching anything it writes.
// The main kernels never trigger their dependents early: prep CTAs of the next step resident beside a running main
// kernel made it ~30% slower (H200; docs/decisions.md, programmatic prep launch).
// Prep kernels, first: wait for the previous grid (the previous step's main kernel writes the cursors, rings,
// checkpoints and claim counter read or written here), then let the main kernel launch (only after the wait: its
// producer loads checkpoint tiles before its own wait) and zero its claim counter (one thread of the grid).
__device__ __forceinline__ void prep_begin(int* claims) {
  wait_previous_grid();
  if (threadIdx.x + blockIdx.x + blockIdx.y + blockIdx.z == 0) *claims = 0;
}

// consume_tiles for produce_tiles_claiming_tail: the CTA's round-robin tiles below min(tail_start, num_tiles), then,
// if tail_start < num_tiles, the claimed tiles named by the stages' tile words until the one with -1.
template <class TileFn>
__device__ __forceinline__ void consume_tiles_claiming_tail(TilePipe& pipe, unsigned char* stage_mem, int stages,
                                                            int stage_bytes, int num_tiles, int tail_start,
                                                            int tile_bytes, TileFn tile) {
  const int static_end = min(tail_start, num_tiles);
  for (StageCursor at;; at.next(stages)) {  // one call site of `tile`: the kernels inline it
    int t = blockIdx.x + at.i * gridDim.x;
    const bool claimed = t >= static_end;
    if (claimed && static_end == num_tiles) return;
    unsigned char* stage = stage_mem + (long long)at.s * stage_bytes;
    at.wait_full(pipe);
    if (claimed) {
      t = *stage_tile_word(stage, tile_bytes);
      if (t < 0) return;
    }
    tile(t, stage, at.s);
  }
}

// The body of a persistent replay main kernel: checks the host's stage size against the kernel's own layout
// (`layout_bytes`), sets up the pipe, then the producer warp (the last) runs `produce()` and the consumer warps run
// `tile(t, stage, s, fold_buf, folds)` for each of the CTA's tiles, with a claimed tail (kClaimTail:
// consume_tiles_claiming_tail) or round-robin (consume_tiles). `fold_buf` is the CTA's fold buffer (after the stages)
// and `folds` the number of flush tiles the consumers have folded (its barrier phase), which `tile` advances.
template <bool kClaimTail, class ProduceFn, class TileFn>
__device__ __forceinline__ void persistent_main(TilePipe& pipe, unsigned char* stage_mem, int stages, int stage_bytes,
                                                int layout_bytes, int num_tiles, int tail_start, int tile_bytes,
                                                ProduceFn produce, TileFn tile) {
  if (layout_bytes > stage_bytes) __trap();  // host and device stage layouts disagree
  pipe_init(pipe, stages, kNumWarps);
  if (threadIdx.x / kWarpSize == kNumWarps) {
    produce();
    return;
  }
  const unsigned char* fold_buf = stage_mem + (long long)stages * stage_bytes;
  int folds = 0;
  auto run = [&](int t, unsigned char* stage, int s) { tile(t, stage, s, fold_buf, folds); };
  if constexpr (kClaimTail) {
    consume_tiles_claiming_tail(pipe, stage_mem, stages, stage_bytes, num_tiles, tail_start, tile_bytes, run);
  } else {
    consume_tiles(pipe, stage_mem, stages, stage_bytes, num_tiles, run);
  }
}

// Fold buffer: one per CTA, after the stages, holding the ring inputs a flush tile's fold would otherwise load from
// global memory (a chain of dependent loads that stalls the CTA's stream). The producer fills it for the CTA's n-th
// flush tile with async copies, the consumers take it in the same order; n's parity is the barrier phase.
__device__ __forceinline__ void fold_buffer_acquire(TilePipe& pipe, int n) {  // producer warp, before its copies
  if (n > 0) mbar_wait(&pipe.fold_empty, (n - 1) & 1);
}

__device__ __forceinline__ void fold_buffer_wait(TilePipe& pipe, int n) {  // consumer warp
  mbar_wait(&pipe.fold_full, n & 1);
}

__device__ __forceinline__ void fold_buffer_release(TilePipe& pipe) {  // consumer warp, after its last read
  __syncwarp();
  if (threadIdx.x % kWarpSize == 0) mbar_arrive(&pipe.fold_empty);
}
#endif  // __CUDA_ARCH__ >= 900

// Flush-rows kernels (plans that keep flush rows apart: the persistent main kernel skips them): `items_per_row` items
// per batch row, a CTA's items every gridDim.x-th of them, blockIdx.x first. Its threads test kThreads items at once
// (one load latency per round, not per item) and the CTA then calls `fn(item, b, slot, w)` for each item whose row's
// step word marks a flush at cursor w (every thread calls it; the ones in between synchronise the CTA). Waits for the
// kernel before it (the main kernel, which never triggers early).
template <class ItemFn>
__device__ __forceinline__ void for_each_flush_item(const int* step, const int* slot_idx, int pad_slot_id, int slots,
                                                    int batch, int items_per_row, ItemFn fn) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ int s_items[kThreads];
  __shared__ int s_count;
  const long long items = (long long)batch * items_per_row;
  for (long long round = 0; blockIdx.x + round * kThreads * gridDim.x < items; ++round) {
    const long long item = blockIdx.x + (round * kThreads + threadIdx.x) * gridDim.x;
    bool flush = false;
    if (item < items) {  // not a non-flush or skipped row (kSkipStep), nor a pad row (its step word is stale)
      const int b = static_cast<int>(item / items_per_row);
      flush = step[b] < 0 && row_slot(slot_idx, b, pad_slot_id, slots) != pad_slot_id;
    }
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    if (flush) s_items[atomicAdd(&s_count, 1)] = static_cast<int>(item);
    __syncthreads();
    const int count = s_count;
    for (int k = 0; k < count; ++k) {
      const int it = s_items[k], b = it / items_per_row;
      fn(it, b, slot_idx[b], -step[b] - 1);
    }
    __syncthreads();  // s_items and s_count are read before the next round rewrites them
  }
}

}  // namespace rssm
