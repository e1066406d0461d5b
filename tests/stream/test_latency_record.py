"""`LatencyRecord`, `swapstream run`'s per-frame latency in bounded memory, against NumPy's exact
percentiles on fresh random latencies."""

from __future__ import annotations

import numpy as np
import pytest

from swapstream.runtime.run import LatencyRecord


def test_percentiles_are_within_one_percent_of_the_exact_ones() -> None:
    rng = np.random.default_rng()
    # Milliseconds to seconds, heavy-tailed like a loop's frame times.
    seconds = rng.lognormal(mean=np.log(0.004), sigma=1.0, size=20_000)
    rec = LatencyRecord()
    for s in seconds:
        rec.add(float(s))
    assert rec.n == seconds.size
    for q in (1, 50, 90, 99, 100):
        # The exact value is an order statistic: NumPy's "inverted_cdf" picks the same rank.
        exact = float(np.percentile(seconds, q, method="inverted_cdf")) * 1e3
        assert rec.percentile_ms(q) == pytest.approx(exact, rel=0.01), q  # bins are 1% wide


def test_out_of_range_latencies_land_in_the_end_bins() -> None:
    rec = LatencyRecord()
    assert rec.percentile_ms(50) is None  # no frame yet
    rec.add(0.0)
    rec.add(1e4)  # far beyond the last bin's start: counted there, not lost
    assert rec.n == 2 and rec.counts[0] == 1 and rec.counts[-1] == 1
    assert rec.percentile_ms(100) >= 1e5  # at least 100 s
