"""Copy a kernel-source dir with per-CTA trace hooks for benchmarks/dev/timeline.py (development only).

  python3 benchmarks/dev/timeline_patch.py plugins /tmp/traced/plugins

Adds `extern "C"` trace arrays to replayssm_common.cuh (%globaltimer, SM id) and hooks to the GDN/KDA prep kernel
(start, end) and main kernel (start, producer past `griddepcontrol.wait`, end); records only for the cursor tensors
named in g_trace_key.
"""
import re, shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst, ignore_errors=True); shutil.copytree(src, dst)
h = dst / "replayssm_common.cuh"; s = h.read_text()
anchor = "constexpr int kMaxStages = 8;"
s = s.replace(anchor, '''extern "C" {
__device__ const void* g_trace_key[2];
__device__ unsigned long long g_prep_trace[2][4096][3];
__device__ unsigned long long g_main_trace[2][1024][4];
__device__ unsigned long long g_waited[1024];
}
__device__ __forceinline__ int trace_gen(const void* cursor) {
  return cursor == g_trace_key[0] ? 0 : cursor == g_trace_key[1] ? 1 : -1;
}
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
''' + anchor, 1)
pat = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
i = s.index(pat, s.index("void produce_tiles("))
j = s.index("\n", i)
s = s[:j + 1] + "  if (lane == 0) g_waited[blockIdx.x] = gtime();\n" + s[j + 1:]
h.write_text(s)
f = dst / "delta_rule_decode.cu"; s = f.read_text()
k0 = s.index("delta_replay_prep_kernel(\n    const DeltaParams p) {")
k1 = s.index("\n", k0 + len("delta_replay_prep_kernel(\n")) + 1  # after the signature line
k2 = s.index('  asm volatile("griddepcontrol.launch_dependents;");\n', k1) + len('  asm volatile("griddepcontrol.launch_dependents;");\n')
body_start = k2
s = s[:k0] + '''delta_replay_prep_kernel(
    const DeltaParams p) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int gen = rssm::trace_gen(p.cursor);
  if (threadIdx.x == 0 && gen >= 0) { rssm::g_prep_trace[gen][blockIdx.x][0] = rssm::gtime(); rssm::g_prep_trace[gen][blockIdx.x][2] = rssm::smid(); }
  prep_body(p);
  __syncwarp();
  if (threadIdx.x % 32 == 0 && gen >= 0) atomicMax(&rssm::g_prep_trace[gen][blockIdx.x][1], rssm::gtime());
}
__device__ __forceinline__ void prep_body(const DeltaParams& p) {
''' + s[body_start:]
s = s.replace('extern "C" __global__ void __launch_bounds__(rssm::kThreads, kEpl <= 4 ? 8 : 6) delta_replay_prep_kernel(',
              '__device__ __forceinline__ void prep_body(const DeltaParams& p);\nextern "C" __global__ void __launch_bounds__(rssm::kThreads, kEpl <= 4 ? 8 : 6) delta_replay_prep_kernel(')
old = '''  const int num_tiles = p.batch * p.num_v_heads * (kV / kTile);
  if (stage_layout(p.L).bytes > p.stage_bytes) __trap();'''
assert old in s
s = s.replace(old, '''  const int gen = rssm::trace_gen(p.cursor);
  if (threadIdx.x == 0 && gen >= 0) { rssm::g_main_trace[gen][blockIdx.x][0] = rssm::gtime(); rssm::g_main_trace[gen][blockIdx.x][3] = rssm::smid(); }
''' + old)
m = re.search(r"    replay_tile\(p, tile_coord\(p, t\), stage, pipe, s, fold_buf, folds\);\n  \}\);", s)
s = s[:m.end()] + "\n  if (threadIdx.x % 32 == 0 && gen >= 0) atomicMax(&rssm::g_main_trace[gen][blockIdx.x][2], rssm::gtime());\n  if (threadIdx.x == 0 && gen >= 0) rssm::g_main_trace[gen][blockIdx.x][1] = rssm::g_waited[blockIdx.x];" + s[m.end():]
f.write_text(s)
