// Speculative commit for every family: after a verify of T = p.window tokens, row b's first accepted[b] window
// records join its committed history (rssm::SpecCursor: count += accepted) in every one of p.layers layers. A thread
// per (layer, row); a pad row (an id outside [0, slots) included), a row repeating the slot of an earlier row, a
// count outside 1..T or a cursor no verify of T could have run from leaves the cursor as it is. The verify did any
// fold, so this is a cursor move and nothing else.
#include "replayssm_common.cuh"

#include "SpecCommitParams.h"

// Every layer reads the one set of row ids, so a row's repeated-slot test scans rows 0..b-1 of it. The CTA stages
// the ids its rows test in shared memory, kThreads at a time, so that each test is a scan of shared memory, not of
// global loads.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) spec_commit_kernel(const SpecCommitParams p) {
  __shared__ int s_ids[rssm::kThreads];
  const int total = p.layers * p.batch;
  const int first = blockIdx.x * blockDim.x, t = first + threadIdx.x;
  const bool row = t < total;
  const int layer = row ? t / p.batch : 0, b = row ? t - layer * p.batch : 0;
  const int accepted = row ? p.accepted[b] : 0;
  const int slot = row ? rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots) : p.pad_slot_id;
  int* const cursor = p.cursor + static_cast<long long>(layer) * p.slots;
  const int word = slot != p.pad_slot_id ? cursor[slot] : 0;
  // Rows before the CTA's last row of its last layer; every row when the CTA spans two layers.
  const int last = min(first + static_cast<int>(blockDim.x), total) - 1;
  const int end = first / p.batch == last / p.batch ? last % p.batch : p.batch;
  bool repeated = false;
  for (int c = 0; c < end; c += blockDim.x) {
    __syncthreads();  // the previous chunk is read
    s_ids[threadIdx.x] = c + threadIdx.x < end ? p.slot_idx[c + threadIdx.x] : p.pad_slot_id;
    __syncthreads();
    const int hi = min(c + static_cast<int>(blockDim.x), b);
    for (int i = c; i < hi; ++i) repeated |= s_ids[i - c] == slot;
  }
  if (!row || slot == p.pad_slot_id || repeated) return;
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  if (accepted < 1 || accepted > p.window || !cur.valid(p.window, p.ring_len)) return;
  cursor[slot] = rssm::SpecCursor{cur.origin, cur.count + accepted}.word();
}
