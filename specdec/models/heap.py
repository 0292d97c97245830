"""The process's heap once models load. glibc's: unpacking a GGUF makes many short-lived arrays of
a few MB beside the tensors that stay, and glibc keeps what they freed for reuse, so the process's
resident memory ran ~150 MB above what it holds (elsewhere, no glibc, these do nothing). Python's:
the objects alive after loading are set aside from the cyclic collector (settle_objects)."""
from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# While loading: blocks from 8 MB get their own mapping, unmapped when freed, and the heap's free
# top beyond 16 MB goes back. Loaders keep their temporaries below (slices of rows: grouped.py),
# so those reuse heap pages: at 256 KB every temporary faulted in fresh pages (load +6 s, measured).
LOADING_MMAP_BYTES = 8 * 1024 * 1024
LOADING_TRIM_BYTES = 16 * 1024 * 1024
# After: the ceilings glibc's own adaptive limits climb to (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit,
# and twice that for the trim), so a prefill's activations of up to 32 MB keep reusing heap pages
# as they did before (first tokens measured no slower, bench/results/README.md "stop 60").
RUNNING_MMAP_BYTES = 32 * 1024 * 1024
RUNNING_TRIM_BYTES = 64 * 1024 * 1024


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextmanager
def loading_heap() -> Iterator[None]:
    """Within: large blocks mapped on their own and freed pages handed back at once; after: the
    running limits above, and the heap trimmed."""
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, LOADING_MMAP_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, LOADING_TRIM_BYTES)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, RUNNING_MMAP_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, RUNNING_TRIM_BYTES)
        libc.malloc_trim(0)


def settle_objects() -> None:
    """Collect once, then move every object alive now (torch's and the other imported modules', the
    loaded models') out of Python's cyclic collector's reach (gc.freeze). Why: a full collection
    walks every tracked object: ~310k once torch and SmolLM2 are loaded, 128-131 ms a collection
    (AMD EPYC Zen 5), a stall of ~25 tokens mid-stream whenever one fell due (rare: none did in 156
    sampled requests of 128 tokens, 90 s); after this one walks only what was made since (0.003
    ms). Frozen objects are still freed when nothing refers to them; only a cycle among them
    outlives its last use."""
    gc.collect()
    gc.freeze()
