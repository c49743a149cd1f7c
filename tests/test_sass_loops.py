"""benchmarks/dev/sass_loops.py reads cuobjdump's SASS listing: functions, opcodes and the loops backward branches
span (a synthetic listing; no GPU or cuobjdump needed)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dev" / "sass_loops.py"
spec = importlib.util.spec_from_file_location("sass_loops", SCRIPT)
sass_loops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_loops)

LISTING = """
\t\tFunction : outer_kernel
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                           /* 0x00000a00ff017b82 */
        /*0010*/                   MOV R2, RZ ;                                     /* 0x000000ff00027202 */
        /*0020*/                   FFMA.FTZ R3, R2, R2, R3 ;                        /* 0x0000000202037223 */
        /*0030*/              @!P0 FFMA.FTZ R4, R2, R2, R4 ;                        /* 0x0000000202048223 */
        /*0040*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;                /* 0x000000ff0200720c */
        /*0050*/               @P0 BRA 0x20 ;                                       /* 0xfffffffc00000947 */
        /*0060*/                   BRA 0x80 ;                                       /* 0x0000000000047947 */
        /*0070*/                   EXIT ;                                           /* 0x000000000000794d */
\t\tFunction : other_kernel
        /*0000*/                   EXIT ;                                           /* 0x000000000000794d */
"""


def test_functions_opcodes_and_backward_branches():
    funcs = sass_loops.functions(LISTING)
    assert list(funcs) == ["outer_kernel", "other_kernel"]
    code = funcs["outer_kernel"]
    assert len(code) == 8 and code[3] == (0x30, "@!P0 FFMA.FTZ R4, R2, R2, R4")
    assert [sass_loops.opcode(t) for _, t in code[2:6]] == ["FFMA", "FFMA", "ISETP", "BRA"]
    assert sass_loops.loops(code) == [(2, 5)]  # the forward branch to 0x80 is no loop
    assert sass_loops.loops(funcs["other_kernel"]) == []
