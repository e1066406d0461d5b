"""Frame-number stamps for the live tests: they live in the package (`swapstream.live.stamps`, NumPy
only), where `swapstream.live.probe` and `tools/bench_live.py` use them too. Kept here for the tests
that import them from here."""

from __future__ import annotations

from swapstream.live.stamps import BITS, read_stamp, stamp

__all__ = ["BITS", "read_stamp", "stamp"]
