"""GPU image ops and their NumPy references.

Every public op takes its output array as an argument (so callers can reuse buffers from frame to frame)
and is written against `xp`, the array module of its inputs: NumPy runs the reference, CuPy arrays run
the same code on the GPU until a hand-written kernel in `kernels/cuda/` replaces it.
"""
