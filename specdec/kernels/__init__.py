"""C++ kernels specdec builds on the user's machine (build.py) and their tensor-level calls."""
