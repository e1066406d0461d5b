"""Frame-number stamps for the live tests: they now live in the package (`swapstream.live.probe`),
where `tools/bench_live.py` uses them too. Kept here for the tests that import them from here."""

from __future__ import annotations

from swapstream.live.probe import BITS, read_stamp, stamp

__all__ = ["BITS", "read_stamp", "stamp"]
