"""Compiling rows.cpp on the user's machine and loading it with ctypes.

Why a plain shared library: it compiles in about a second with the system's C++ compiler (no
torch headers), and loads through ctypes, Python's public foreign-function interface. Built
once per source, compiler and flags into the user's cache ($XDG_CACHE_HOME/specdec/kernels,
or $SPECDEC_KERNEL_CACHE), written under a temporary name and renamed, so that processes
starting together do not read a half-written file. Its OpenMP runtime is the one PyTorch has
already loaded (the same libgomp.so.1), so the two share one thread pool.

Where the CPU offers more than one instruction sequence for a product (AMX tiles or AVX-512 BF16
dot products beside AVX2 for bf16, AVX-512 VNNI beside AVX2 for grouped weights),
load() sets the one variants.py chose for this machine, before any product.

SPECDEC_KERNELS=off turns the kernels off (the exact paths then compute a row at a time with
PyTorch's kernels, see models/exact.py); where the CPU lacks AVX2 and FMA or no compiler is
found, `load()` returns None and `unavailable()` says why."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from specdec.kernels import variants

SOURCE = Path(__file__).with_name("rows.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-fno-fast-math"]
REQUIRED_CPU_FLAGS = ("avx2", "fma")
_why: list[str] = []  # why the kernels are unavailable, set by load()
_chosen: dict[str, str] = {}  # the kernel of each variant, chosen by load()


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    line = next((line for line in text.splitlines() if line.startswith("model name")), ":unknown CPU")
    return line.partition(":")[2].strip()


def cache_dir() -> Path:
    if os.environ.get("SPECDEC_KERNEL_CACHE"):
        return Path(os.environ["SPECDEC_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str, defines: tuple[str, ...] = ()) -> Path:
    """The library for this source, compiler and flags (defines: extra -D flags, e.g.
    SPECDEC_PHASES for scripts/stack_phases.py's timed build), built once into the cache."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    source = SOURCE.read_bytes()
    flags = FLAGS + [f"-D{name}" for name in defines]
    digest = hashlib.sha256(source + " ".join(flags).encode() + version.encode()).hexdigest()[:16]
    target = cache_dir() / f"rows-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
        if result.returncode != 0:  # a compiler without AMX / AVX-512 BF16 intrinsics: the rest still builds
            result = subprocess.run([compiler, *flags, "-DSPECDEC_NO_AMX", str(SOURCE), "-o", str(built)],
                                    capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:500]}")
        os.replace(built, target)
    return target


def _declare(lib: ctypes.CDLL) -> None:
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    for name in ("linear_bf16", "linear_f32"):
        getattr(lib, name).argtypes = [p, i32, p, p, p, i32, i64, i64, i64]
    lib.linear_i8.argtypes = [p, i32, p, p, p, p, i32, i64, i64, i64]
    for name in ("attend_bf16", "attend_f32"):
        getattr(lib, name).argtypes = [p] * 8 + [i32] + [i64] * 6 + [f32]
    for name in ("linear_bf16", "linear_f32", "linear_i8", "attend_bf16", "attend_f32"):
        getattr(lib, name).restype = None
    lib.linear_grouped.argtypes = [p, i32, p, i32, i32, i32, p, p, p, p, i64, p, p, i32, i64, i64, i64, i64]
    lib.linear_grouped.restype = i32
    lib.stack_forward.argtypes = [p, i64, p, p, i32, i64] + [p] * 11
    lib.stack_forward.restype = i32
    for name in (variant.setter for variant in variants.VARIANTS):
        if hasattr(lib, name):  # an older build beside this one (load_beside) may lack later setters
            getattr(lib, name).argtypes = [i32]
            getattr(lib, name).restype = i32


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use, or None (see unavailable())."""
    if os.environ.get("SPECDEC_KERNELS", "").lower() in ("off", "0", "no"):
        _why.append("turned off by SPECDEC_KERNELS")
        return None
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in cpu_flags()]
    if missing:
        _why.append(f"this CPU lacks {', '.join(missing)}")
        return None
    compiler = _compiler()
    if compiler is None:
        _why.append("no C++ compiler found (install g++ or set CXX)")
        return None
    try:
        import torch  # loads PyTorch's OpenMP runtime first, which the library then shares

        library = _build(compiler)
        lib = ctypes.CDLL(str(library))
        _declare(lib)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        _why.append(f"could not build the kernels: {error}")
        return None
    key = hashlib.sha256(f"{cpu_model()}/threads={torch.get_num_threads()}".encode()).hexdigest()[:12]
    for variant in variants.VARIANTS:
        _chosen[variant.name] = variants.choose(lib, variant, library, cpu_flags(), key, _chosen)
    return lib


def load_beside(defines: tuple[str, ...] = (), path: str | Path | None = None) -> ctypes.CDLL:
    """A second library beside the running one, for A/B scripts: this source built with extra -D
    `defines` (SPECDEC_PHASES: scripts/stack_phases.py), or the library at `path` (another build:
    scripts/stack_ab.py); declared, and set to the kernel variants this process chose where it has
    their setters. RuntimeError where the kernels are unavailable here."""
    if load() is None:
        raise RuntimeError(f"the kernels are unavailable: {unavailable()}")
    lib = ctypes.CDLL(str(path if path is not None else _build(_compiler(), defines)))
    _declare(lib)
    for variant in variants.VARIANTS:
        if hasattr(lib, variant.setter):
            variant.set(lib, _chosen[variant.name])
    return lib


def kernels_in_use() -> dict[str, str]:
    """The instruction sequence each product variant runs here (variants.py: "bf16": "avx2", "amx"
    or "avx512"; "grouped": "avx2", "vnni" or "avx2-columns"); empty where the kernels are unavailable."""
    return dict(_chosen) if load() is not None else {}


def unavailable() -> str | None:
    """Why the kernels cannot be used here, or None when they can."""
    return None if load() is not None else _why[-1]
