"""After keep_freed_memory(), megabyte-sized buffers come from the heap, not from fresh mmaps.

Each arm runs in a fresh interpreter: glibc's dynamic mmap threshold remembers what a long-lived
process freed, which would hide the difference.
"""

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "tuned":
        from wirelessfl.host.allocator import keep_freed_memory
        assert keep_freed_memory() and keep_freed_memory()  # applied, idempotent
    before = libc.mallinfo2().hblkhd
    buffer = np.ones(2**19)  # 4 MiB, far above glibc's initial 128 KiB mmap threshold
    print(libc.mallinfo2().hblkhd - before)
""")


def _mmapped_growth(arm: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, arm], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        pytest.skip(f"no glibc >= 2.33 with mallinfo2 here: {out.stderr.strip()[-200:]}")
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_megabyte_buffers_come_from_the_heap_once_tuned():
    assert _mmapped_growth("default") >= 4 * 2**20  # glibc's default: a fresh mapping
    assert _mmapped_growth("tuned") == 0
