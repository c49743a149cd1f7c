"""Copy a kernel-source dir with one timing-only change to the GDN/KDA replay main kernel (development only; the
numerics of every variant but `cs` are wrong by design).

  python3 benchmarks/dev/timing_variants.py VARIANT plugins /tmp/VARIANT/plugins

VARIANT (session 10, sweeps s10-12..15): so = consumers release each stage unread (the state stream alone; run with
the fold buffer off, the producer would wait for it), sow = so plus flush tiles writing their stage rows back
unchanged, rf = consumers release each stage before reading it, nf = flush tiles skip the ring fold's math (the
checkpoint is still written), cs = the fold's fp32 checkpoint stores are streaming (st.global.cs) stores.
Run the copies beside plugins/ with benchmarks/dev/plan_sweep.py (a case's plugins field).
"""
import shutil
import sys
from pathlib import Path

PAD_CHECK = "  const int slot = info_words[0], info = info_words[1];\n  if (slot == p.pad_slot_id) {"
SOW_WRITE_BACK = '''
    if (slot != p.pad_slot_id && info < 0) {  // sow: the flush tile's rows written back unchanged
      const int warp = threadIdx.x / rssm::kWarpSize, col0 = (threadIdx.x % rssm::kWarpSize) * kEpl;
      const state_t* rows = reinterpret_cast<const state_t*>(stage) + warp * kRows * kK + col0;
      state_t* dst = static_cast<state_t*>(p.state) + slot * p.s_state_slot + c.hv * p.s_state_head +
                     (long long)(c.row0 + warp * kRows) * kK + col0;
      for (int r = 0; r < kRows; ++r) {
        float v[kEpl];
        rssm::load_vec<state_t, kEpl>(rows + r * kK, v);
        rssm::store_vec<state_t, kEpl>(dst + r * kK, v);
      }
    }'''
RELEASE_LATE = "  rssm::release_stage(pipe, s);\n  if (lane < kRows) {"
REC_READ = "  const float* rec = reinterpret_cast<const float*>(stage + lay.rec);"
FOLD_LOOP = "    for (int j0 = 0; j0 < w; j0 += kFoldChunk) {"
FOLD_STORE = "      rssm::store_vec<state_t, kEpl>(dst + (r0 + r) * kK, acc[r]);"


def patched(source: str, variant: str) -> str:
    def swap(old: str, new: str) -> str:
        assert source.count(old) == 1, f"{variant}: anchor not found once: {old!r}"
        return source.replace(old, new)

    if variant in ("so", "sow"):
        extra = SOW_WRITE_BACK if variant == "sow" else ""
        return swap(PAD_CHECK, "  const int slot = info_words[0], info = info_words[1];\n  if (true) {" + extra)
    if variant == "rf":
        source = swap(RELEASE_LATE, "  if (lane < kRows) {")
        return swap(REC_READ, "  rssm::release_stage(pipe, s);\n" + REC_READ)
    if variant == "nf":
        return swap(FOLD_LOOP, "    for (int j0 = 0; j0 < 0 * w; j0 += kFoldChunk) {")
    if variant == "cs":
        return swap(FOLD_STORE, '''      if constexpr (sizeof(state_t) == 4 && kEpl == 4)
        __stcs(reinterpret_cast<float4*>(dst + (r0 + r) * kK), make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
      else
        rssm::store_vec<state_t, kEpl>(dst + (r0 + r) * kK, acc[r]);''')
    raise SystemExit(f"VARIANT: expected so, sow, rf, nf or cs, got {variant!r}")


if __name__ == "__main__":
    variant, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    kernel = dst / "delta_rule_decode.cu"
    kernel.write_text(patched(kernel.read_text(), variant))
    print(f"{variant}: {kernel}")
