"""Measurement helpers for the live tests and `tools/bench_live.py`, kept out of the package.

- `stamps`: frame-number stamps (NumPy only, so the runtime's pure-logic tests can import it without
  PyAV or aiortc).
- `probe`: measurable media built on them (stamped clips, tracks that timestamp frames, receivers,
  latency measures); needs PyAV and aiortc.

Nothing under `stream/` (the `swapstream` package) imports these.
"""
