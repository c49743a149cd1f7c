// A minimal kernel with the persistent replay kernels' stage protocol (plugins/replayssm_common.cuh TilePipe), race
// free by construction, for compute-sanitizer racecheck (development only; benchmarks/dev/racecheck_protocol.py).
// A producer warp fills a ring of `stages` shared-memory stages with tiles of `src`: lane 0 by one bulk copy completing
// on the stage's `full` mbarrier (BULK=1) or every lane by 4-byte cp.async copies (BULK=0), each lane then arriving
// with cp.async.mbarrier.arrive.noinc, exactly as stage_state_copy / stage_tile_inputs do. Four consumer warps wait
// on `full`, sum their quarter of the tile and release the stage on `empty` (release_stage); the producer waits on
// `empty` before refilling a stage. Lane 0 also writes each stage's tile word with a plain store before its arrive,
// as produce_tiles_claiming_tail does, and the consumers check it. Every shared-memory read is ordered after the copy
// or store that wrote it by the mbarrier phase it waited for, and every refill after the reads by `empty`.
#include "replayssm_common.cuh"

#include "ProtocolParams.h"  // generated from benchmarks/dev/racecheck_protocol.py

constexpr int kTileFloats = 1024;
constexpr int kTileBytes = kTileFloats * 4;
constexpr int kStageBytes = kTileBytes + 128;  // the tile, then the stage info words (rssm::stage_tile_word)

extern "C" __global__ void __launch_bounds__(rssm::kThreads + rssm::kWarpSize) protocol_kernel(const ProtocolParams p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ rssm::TilePipe pipe;
  rssm::pipe_init(pipe, p.stages, rssm::kNumWarps);
  const int warp = threadIdx.x / rssm::kWarpSize, lane = threadIdx.x % rssm::kWarpSize;
  if (warp == rssm::kNumWarps) {  // producer
    for (int i = 0; i < p.tiles; ++i) {
      const int s = i % p.stages;
      unsigned char* stage = stage_mem + (long long)s * kStageBytes;
      const float* tile = p.src + (long long)i * kTileFloats;
      if (i >= p.stages) rssm::mbar_wait(&pipe.empty[s], ((i / p.stages) - 1) & 1);
      if (lane == 0) *rssm::stage_tile_word(stage, kTileBytes) = i;  // published by the arrive below
      if (BULK) {
        rssm::stage_state_copy(pipe, s, stage, tile, kTileBytes);
      } else {
        if (lane == 0) rssm::mbar_arrive(&pipe.full[s]);
        rssm::cp_async_words(stage, tile, kTileFloats);
      }
      rssm::cp_async_arrive(&pipe.full[s]);
    }
    return;
  }
  float acc = 0.f;
  for (int i = 0; i < p.tiles; ++i) {
    const int s = i % p.stages;
    rssm::mbar_wait(&pipe.full[s], (i / p.stages) & 1);
    unsigned char* stage = stage_mem + (long long)s * kStageBytes;
    if (*rssm::stage_tile_word(stage, kTileBytes) != i) acc = __int_as_float(0x7fc00000);  // NaN: wrong tile
    const float* t = reinterpret_cast<const float*>(stage);
    for (int k = warp * (kTileFloats / rssm::kNumWarps) + lane; k < (warp + 1) * (kTileFloats / rssm::kNumWarps);
         k += rssm::kWarpSize)
      acc += t[k];
    rssm::release_stage(pipe, s);
  }
  p.out[blockIdx.x * rssm::kThreads + threadIdx.x] = acc;
#endif
}
