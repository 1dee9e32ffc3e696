"""Freed host memory handed back to the operating system (bebop.host_memory): glibc keeps a program's freed blocks
in its heap, and `release_freed_memory` returns their pages."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from bebop.host_memory import release_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# 2,000 blocks of 64 KiB (under glibc's mmap threshold: they come from the heap), each followed by a small block that
# stays, written, then freed: holes that cannot merge into the heap's top, so free() alone gives nothing back (a
# fragmented heap). The resident memory before and after the call.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, os, sys
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page / 2**20
    blocks, pins = [], []
    for _ in range(2000):
        blocks.append(libc.malloc(64 << 10))
        pins.append(libc.malloc(64))
        ctypes.memset(blocks[-1], 1, 64 << 10)
    for b in blocks:
        libc.free(b)
    kept = rss_mib()
    from bebop.host_memory import release_freed_memory
    assert release_freed_memory()
    print(kept, rss_mib())
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's heap is what the call trims; elsewhere it does nothing")
def test_the_pages_of_freed_blocks_go_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    kept, after = map(float, out.split())
    assert kept - after > 100, f"{kept:.0f} MiB resident with 125 MiB freed, {after:.0f} MiB after the call"


def test_it_answers_whether_it_could_release_anything():
    assert release_freed_memory() is GLIBC
