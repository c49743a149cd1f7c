// Speculative commit for every family: after a verify of T = p.window tokens, row b's first accepted[b] window
// records join its committed history (rssm::SpecCursor: count += accepted). A thread per batch row; a pad row, a row
// repeating an earlier row's slot, a count outside 1..T or a cursor no verify of T could have run from leaves the
// cursor as it is. The verify did any fold, so this is a cursor move and nothing else.
#include "replayssm_common.cuh"

#include "SpecCommitParams.h"

extern "C" __global__ void __launch_bounds__(rssm::kThreads) spec_commit_kernel(const SpecCommitParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch) return;
  const int slot = rssm::row_slot(p.slot_idx, b, p.pad_slot_id, p.slots);
  if (slot == p.pad_slot_id || rssm::earlier_row_has(p.slot_idx, b, slot, 0, 1, p.slot_idx[0])) return;
  const int accepted = p.accepted[b];
  const rssm::SpecCursor cur = rssm::SpecCursor::of(p.cursor[slot]);
  if (accepted < 1 || accepted > p.window || !cur.valid(p.window, p.ring_len)) return;
  p.cursor[slot] = rssm::SpecCursor{cur.origin, cur.count + accepted}.word();
}
