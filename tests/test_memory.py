"""Resident memory: KV caches take pages only where written, and a load's freed temporaries go
back to the system (Linux: /proc/self/status; glibc for the heap)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.models import heap
from specdec.models.cache import zeroed

STATUS = Path("/proc/self/status")
pytestmark = pytest.mark.skipif(not STATUS.exists(), reason="needs /proc/self/status (Linux)")
MIB = 2**20


def anonymous_bytes() -> int:
    line = next(line for line in STATUS.read_text().splitlines() if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def test_a_zeroed_buffer_takes_memory_only_where_written():
    before = anonymous_bytes()
    cache = zeroed((64, 1024, 1024), torch.uint8)  # 64 MiB
    assert anonymous_bytes() - before < 8 * MIB
    cache[3] = 7  # one MiB written
    assert anonymous_bytes() - before < 9 * MIB
    assert int(cache[3].sum()) == 7 * MIB and int(cache[2, :4096].sum()) == 0 and cache.shape == (64, 1024, 1024)
    assert zeroed((0, 5), torch.bfloat16).shape == (0, 5)


@pytest.mark.skipif(heap._libc() is None, reason="needs glibc's mallopt")
def test_while_loading_freed_temporaries_go_back_to_the_system():
    """As unpacking does: a large temporary freed while blocks allocated after it stay (outside
    loading_heap glibc kept 20-24 MB of them here, measured)."""
    climb = np.ones(30 * MIB, dtype=np.uint8)  # glibc's adaptive threshold then keeps blocks below 30 MB
    del climb
    with heap.loading_heap():
        before = anonymous_bytes()
        kept, other = [], None
        for i in range(16):
            temporary = np.full(heap.LOADING_MMAP_BYTES + i * MIB // 2, i, dtype=np.uint8)  # each larger
            kept.append(np.full(64 * 1024, i, dtype=np.uint8))
            other = np.full(3 * MIB, i, dtype=np.uint8)
            del temporary
        assert anonymous_bytes() - before < 8 * MIB  # the last 3 MB one and the 1 MB kept
    assert [int(k[0]) for k in kept] == list(range(16)) and other[0] == 15
