"""Resident memory: KV caches take pages only where written, and a load's freed temporaries go
back to the system (Linux: /proc/self/status; glibc for the heap). Each measured in a fresh
interpreter: a test process's other threads (servers left by earlier tests) allocate too."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdec.models import heap

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc/self/status (Linux)")
MEASURE = """
from pathlib import Path
import numpy as np
import torch
MIB = 2**20
def anonymous_bytes():
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024
"""


def measured(script: str) -> list[float]:
    """The MiB figures the script prints, one a line."""
    out = subprocess.run([sys.executable, "-c", MEASURE + textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [float(line) for line in out.split()]


def test_a_zeroed_buffer_takes_memory_only_where_written():
    unwritten, written, zero_elsewhere, shape_ok, empty_ok = measured("""
        from specdec.models.cache import zeroed
        before = anonymous_bytes()
        cache = zeroed((64, 1024, 1024), torch.uint8)  # 64 MiB
        print((anonymous_bytes() - before) / MIB)
        cache[3] = 7  # one MiB written
        print((anonymous_bytes() - before) / MIB)
        print(int(int(cache[3].sum()) == 7 * MIB and int(cache[2, :4096].sum()) == 0))
        print(int(cache.shape == (64, 1024, 1024) and cache.dtype == torch.uint8))
        print(int(zeroed((0, 5), torch.bfloat16).shape == (0, 5)))
    """)
    assert unwritten < 8 and written < 9 and zero_elsewhere and shape_ok and empty_ok


@pytest.mark.skipif(heap._libc() is None, reason="needs glibc's mallopt")
def test_while_loading_freed_temporaries_go_back_to_the_system():
    """As unpacking does: large temporaries freed while blocks allocated after them stay (outside
    loading_heap glibc kept ~38 MiB of them here, measured)."""
    growth, values_ok = measured("""
        from specdec.models import heap
        climb = np.ones(30 * MIB, dtype=np.uint8)  # glibc's adaptive threshold then keeps blocks below 30 MB
        del climb
        with heap.loading_heap():
            before = anonymous_bytes()
            kept, other = [], None
            for i in range(32):
                temporary = np.full(heap.LOADING_MMAP_BYTES + i * MIB // 2, i, dtype=np.uint8)  # each larger
                kept.append(np.full(64 * 1024, i, dtype=np.uint8))
                other = np.full(3 * MIB, i, dtype=np.uint8)
                del temporary
            print((anonymous_bytes() - before) / MIB)
        print(int([int(k[0]) for k in kept] == list(range(32)) and other[0] == 31))
    """)
    assert growth < 16 and values_ok  # the last 3 MB block, the 2 MB kept, some heap top (9 MiB measured)


def test_after_loading_the_objects_alive_are_set_aside_from_the_cyclic_collector(tmp_path):
    """A full collection walked every object torch and a model leave (~310k with SmolLM2: ~130 ms,
    a stall mid-stream): after specdec.load it walks only what was made since (models/heap.py)."""
    from tests.helpers import make_model_dir
    make_model_dir(tmp_path / "m")
    frozen, walked, works = measured(f"""
        import gc
        import specdec
        decoder = specdec.load(target={str(tmp_path / "m")!r}, dtype="float32", calibrate=False)
        print(gc.get_freeze_count())
        print(len(gc.get_objects()))
        print(int(len(decoder.generate([1, 2, 3], max_new_tokens=4, ignore_eos=True).token_ids) == 4))
    """)
    assert frozen > 50_000 and walked < frozen / 20 and works
