"""The soak, at CI scale: `tools/soak.py` for 3 minutes with a fault every 30 s (nginx restarted,
publishers killed, nginx paused, a timestamp jump, then nginx again), against `swapstream live` and
`swapstream serve` with two API streams. The 60-minute record is docs/benchmarks/soak.json.

Every fault must recover within 5 s of its cause ending, the A/V skew stay within 40 ms after each,
RSS, open files and threads stay flat, and nothing may crash: the tool's own verdict, which is
checked here item by item so that a failure says which.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("av")

from swapstream.errors import SwapStreamError  # noqa: E402
from swapstream.live.nginx import find_nginx_rtmp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_three_minute_soak_recovers_from_every_fault(tmp_path: Path) -> None:
    try:
        find_nginx_rtmp()
    except SwapStreamError as e:
        pytest.skip(f"nginx-rtmp is not installed: {e}")
    out = tmp_path / "soak.json"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "soak.py"), "--minutes", "3", "--fault-every",
                          "30", "--out", str(out), "--work", str(tmp_path / "work")],
                         cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert out.exists(), res.stdout[-2000:] + res.stderr[-2000:]
    r = json.loads(out.read_text())
    kinds = [f["kind"] for f in r["faults"]]
    assert set(kinds) == {"nginx_restart", "publisher_kill", "stall", "timestamp_jump"}, kinds
    for f in r["faults"]:
        for name in ("live", "s1", "s2"):
            assert f["recovery_s"][name] is not None and f["recovery_s"][name] <= 5.0, f
            assert f["onsets_after"][name] >= 2, f  # the skew was measured, not skipped
            assert f["max_abs_skew_ms_after"][name] <= 40.0, f
    for name, v in r["resources"].items():
        assert v["ok"], (name, v)
    assert not r["crashed"] and r["api_stream_states"] == {"s1": "running", "s2": "running"}, r
    assert r["pass"] and res.returncode == 0, res.stdout[-2000:]
