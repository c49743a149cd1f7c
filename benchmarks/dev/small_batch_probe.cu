// Structural floors of a small-batch non-flush step (development only; benchmarks/dev/small_batch_probe.py): how
// fast can a kernel read a checkpoint tile per (batch row, head) from its slot and write S·C per state row, with
// nothing else to do (no ring, no cursor, no inputs but C)? Three launch structures over the same bytes:
//   grid_kernel        one CTA per ROWS-row tile (grid: P / ROWS, heads, batch), the tile in registers: the
//                      structure of the one-launch replay and the flush kernel;
//   grid_pair_kernel   one CTA per two tiles of a batch row (heads h and h + heads/2): the first in registers, the
//                      second by one bulk copy into shared memory issued at the start, so that a grid of half the
//                      CTAs requests every byte at once;
//   persistent_kernel  a few CTAs per SM, a producer warp streaming tiles by bulk copies through `stages` stages, four
//                      consumer warps: the structure of the persistent replay main kernel, without its prep kernel;
//   group_stream_kernel  one CTA per `tiles_per_cta` consecutive tiles of a batch row (heads of one group), streamed
//                      like the persistent kernel's, after a prologue a one-launch replay would need: the row's cursor,
//                      then 16 ring records of B of the group (fp32) dotted with C, whose sum every row output adds.
// State: fp32 [slots][heads][P][N] with N = 128 (a lane's 4 columns per row, one 16-byte load), C fp32 [batch][N].
#include "replayssm_common.cuh"

#include "ProbeParams.h"  // generated from benchmarks/dev/small_batch_probe.py

constexpr int N = 128;
constexpr int kRowsPerWarp = ROWS / rssm::kNumWarps;
constexpr int kTileBytes = ROWS * N * 4;
static_assert(ROWS % rssm::kNumWarps == 0 && kRowsPerWarp <= rssm::kWarpSize, "rows: 4 .. 128, a multiple of 4");

// Lane r < kRowsPerWarp of the warp returns row r's dot with C, from this lane's 4 columns of each row.
__device__ __forceinline__ float row_dots(const float4 (&v)[kRowsPerWarp], const float4 c) {
  float part[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) part[r] = v[r].x * c.x + v[r].y * c.y + v[r].z * c.z + v[r].w * c.w;
  float mine = 0.f;
  const int lane = threadIdx.x % rssm::kWarpSize;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float s = rssm::warp_sum(part[r]);
    if (lane == r) mine = s;
  }
  return mine;
}

__device__ __forceinline__ const float* tile_src(const ProbeParams& p, int b, int head, int row0) {
  const int slot = p.slot_idx[b];
  return p.state + ((long long)slot * p.heads + head) * P * N + (long long)row0 * N;
}

__device__ __forceinline__ void finish_rows(const ProbeParams& p, const float4 (&v)[kRowsPerWarp], int b, int head,
                                            int row0) {
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const float4 c = reinterpret_cast<const float4*>(p.C + (long long)b * N)[lane];
  const float d = row_dots(v, c);
  if (lane < kRowsPerWarp) p.out[((long long)b * p.heads + head) * P + row0 + warp * kRowsPerWarp + lane] = d;
}

extern "C" __global__ void __launch_bounds__(rssm::kThreads) grid_kernel(const ProbeParams p) {
  const int b = blockIdx.z, head = blockIdx.y, row0 = blockIdx.x * ROWS;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  const float4* src = reinterpret_cast<const float4*>(tile_src(p, b, head, row0) + warp * kRowsPerWarp * N) + lane;
  float4 v[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) v[r] = __ldcs(src + r * (N / 4));
  finish_rows(p, v, b, head, row0);
}

extern "C" __global__ void __launch_bounds__(rssm::kThreads) grid_pair_kernel(const ProbeParams p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char tile_mem[];
  __shared__ unsigned long long full;
  const int b = blockIdx.z, head = blockIdx.y, row0 = blockIdx.x * ROWS, second = head + p.heads / 2;
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  rssm::mbar_init_cta(&full, 1);
  if (threadIdx.x == 0) {
    rssm::mbar_arrive_expect_tx(&full, kTileBytes);
    rssm::bulk_load(tile_mem, tile_src(p, b, second, row0), kTileBytes, &full);
  }
  const float4* src = reinterpret_cast<const float4*>(tile_src(p, b, head, row0) + warp * kRowsPerWarp * N) + lane;
  float4 v[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) v[r] = __ldcs(src + r * (N / 4));
  finish_rows(p, v, b, head, row0);
  rssm::mbar_wait(&full, 0);
  const float4* s = reinterpret_cast<const float4*>(tile_mem) + warp * kRowsPerWarp * (N / 4) + lane;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) v[r] = s[r * (N / 4)];
  finish_rows(p, v, b, second, row0);
#endif
}

#if __CUDA_ARCH__ >= 900
// A consumer warp's rows of its i-th tile: waits for the tile's stage, loads the rows, releases the stage.
__device__ __forceinline__ void take_stage_rows(rssm::TilePipe& pipe, const unsigned char* stage_mem, int i, int stages,
                                                float4 (&v)[kRowsPerWarp]) {
  const int s = i % stages, warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  rssm::mbar_wait(&pipe.full[s], (i / stages) & 1);
  const float4* src =
      reinterpret_cast<const float4*>(stage_mem + (long long)s * kTileBytes) + warp * kRowsPerWarp * (N / 4) + lane;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) v[r] = src[r * (N / 4)];
  rssm::release_stage(pipe, s);
}
#endif

extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, 1)
    persistent_kernel(const ProbeParams p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  rssm::pipe_init(pipe, p.stages, rssm::kNumWarps);
  const int warp = threadIdx.x / rssm::kWarpSize;
  constexpr int kRowTiles = P / ROWS;
  const int num_tiles = p.batch * p.heads * kRowTiles;
  if (warp == rssm::kNumWarps) {  // producer
    for (int i = 0;; ++i) {
      const int t = blockIdx.x + i * gridDim.x;
      if (t >= num_tiles) break;
      const int s = i % p.stages;
      if (i >= p.stages) rssm::mbar_wait(&pipe.empty[s], ((i / p.stages) - 1) & 1);
      const int b = t / kRowTiles / p.heads, head = t / kRowTiles % p.heads, row0 = t % kRowTiles * ROWS;
      rssm::stage_state_copy(pipe, s, stage_mem + (long long)s * kTileBytes, tile_src(p, b, head, row0), kTileBytes);
      rssm::cp_async_arrive(&pipe.full[s]);
    }
    return;
  }
  for (int i = 0;; ++i) {
    const int t = blockIdx.x + i * gridDim.x;
    if (t >= num_tiles) break;
    float4 v[kRowsPerWarp];
    take_stage_rows(pipe, stage_mem, i, p.stages, v);
    finish_rows(p, v, t / kRowTiles / p.heads, t / kRowTiles % p.heads, t % kRowTiles * ROWS);
  }
#endif
}

extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize, 1)
    group_stream_kernel(const ProbeParams p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  __shared__ float s_coef[16];
  rssm::pipe_init(pipe, p.stages, rssm::kNumWarps);
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  constexpr int kRowTiles = P / ROWS;
  const int b = blockIdx.z, t0 = blockIdx.x * p.tiles_per_cta;  // tiles of row b: head t / kRowTiles
  const int slot = p.slot_idx[b];
  if (warp == rssm::kNumWarps) {  // producer
    for (int i = 0; i < p.tiles_per_cta; ++i) {
      const int s = i % p.stages, t = t0 + i;
      if (i >= p.stages) rssm::mbar_wait(&pipe.empty[s], ((i / p.stages) - 1) & 1);
      rssm::stage_state_copy(pipe, s, stage_mem + (long long)s * kTileBytes,
                             tile_src(p, b, t / kRowTiles, t % kRowTiles * ROWS), kTileBytes);
      rssm::cp_async_arrive(&pipe.full[s]);
    }
    return;
  }
  // the prologue: the cursor, then B records of the group (warp k: records k, k + 4, ...), each dotted with C
  const int w = p.cursor[slot] & 15;
  const int group = t0 / kRowTiles / (p.heads / p.groups);
  const float4 c = reinterpret_cast<const float4*>(p.C + (long long)b * N)[lane];
  const float* B = p.B_ring + ((long long)slot * p.groups + group) * 16 * N;
  float4 bv[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) bv[k] = reinterpret_cast<const float4*>(B + (warp + 4 * k) * N)[lane];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float d = rssm::warp_sum(bv[k].x * c.x + bv[k].y * c.y + bv[k].z * c.z + bv[k].w * c.w);
    if (lane == 0) s_coef[warp + 4 * k] = warp + 4 * k <= w ? d : 0.f;
  }
  asm volatile("bar.sync 1, %0;" ::"n"(rssm::kThreads));  // the consumers only
  float ring = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) ring += s_coef[j];
  for (int i = 0; i < p.tiles_per_cta; ++i) {
    const int t = t0 + i;
    float4 v[kRowsPerWarp];
    take_stage_rows(pipe, stage_mem, i, p.stages, v);
    const float d = row_dots(v, c) + ring;
    const int row = t % kRowTiles * ROWS + warp * kRowsPerWarp + lane;
    if (lane < kRowsPerWarp) p.out[((long long)b * p.heads + t / kRowTiles) * P + row] = d;
  }
#endif
}
