// Speculative commit for every family: after a verify of T = p.window tokens, row b's first accepted[b] window
// records join its committed history (rssm::SpecCursor: count += accepted). A thread per batch row; a pad row, a row
// repeating the slot of an earlier row of its group, a count outside 1..T or a cursor no verify of T could have run
// from leaves the cursor as it is. The verify did any fold, so this is a cursor move and nothing else.
#include "replayssm_common.cuh"

#include "SpecCommitParams.h"

// Rows come in groups of p.group_rows (a layer's rows in one launch for every layer; slots of different groups never
// coincide), so a row's repeated-slot test reads the ids of its own group only. The CTA stages the ids its rows test
// in shared memory, kThreads at a time, so that each test is a scan of shared memory, not of global loads.
extern "C" __global__ void __launch_bounds__(rssm::kThreads) spec_commit_kernel(const SpecCommitParams p) {
  __shared__ int s_ids[rssm::kThreads];
  const int first = blockIdx.x * blockDim.x, b = first + threadIdx.x;
  const bool row = b < p.batch;
  const int accepted = row ? p.accepted[b] : 0;
  const int slot = row ? rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots) : p.pad_slot_id;
  const int word = slot != p.pad_slot_id ? p.cursor[slot] : 0;
  const int group0 = b / p.group_rows * p.group_rows;  // this row's group's first row
  const int end = min(first + static_cast<int>(blockDim.x), p.batch);
  bool repeated = false;
  for (int c = first / p.group_rows * p.group_rows; c < end; c += blockDim.x) {  // the CTA's first group onwards
    __syncthreads();  // the previous chunk is read
    s_ids[threadIdx.x] = c + threadIdx.x < end ? p.slot_idx[c + threadIdx.x] : p.pad_slot_id;
    __syncthreads();
    const int lo = max(c, group0), hi = min(c + static_cast<int>(blockDim.x), b);
    for (int i = lo; i < hi; ++i) repeated |= s_ids[i - c] == slot;
  }
  if (!row || slot == p.pad_slot_id || repeated) return;
  const rssm::SpecCursor cur = rssm::SpecCursor::of(word);
  if (accepted < 1 || accepted > p.window || !cur.valid(p.window, p.ring_len)) return;
  p.cursor[slot] = rssm::SpecCursor{cur.origin, cur.count + accepted}.word();
}
