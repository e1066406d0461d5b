"""The stream benchmark is a load generator for `swapstream serve`: run at small scale on the CPU,
it starts the server with a worker, publishes two streams to a real nginx-rtmp, has the server pull
them, swap with the mesh swapper and push the result back, and checks what came out. The figures are
the product's own (its API), and the output carries the watermark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("av")
pytest.importorskip("aiohttp")

from swapstream.errors import SwapStreamError  # noqa: E402
from swapstream.live.nginx import find_nginx_rtmp  # noqa: E402

from ..runtime.conftest import make_clip  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

try:
    find_nginx_rtmp()
    NGINX = ""
except SwapStreamError as e:
    NGINX = str(e)


@pytest.mark.skipif(bool(NGINX), reason=NGINX)
def test_the_load_generator_drives_serve_over_rtmp(tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    make_clip(clip, 4.0, size=(320, 240), fps=15)
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench_streams.py"), "--clip", f"240p={clip}", "--workers", "1",
         "--ns", "2", "--source", "rtmp", "--sink", "rtmp", "--seconds", "4", "--settle", "2", "--warmup-timeout", "20",
         "--budget-ms", "5000", "--check-output", "--out", str(tmp_path / "out"), "--name", "ci"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"n"')]
    assert len(rows) == 1, res.stdout[-3000:]
    row = rows[0]
    assert row["streams_failed"] == 0, row
    assert row["frames_out"] > 0 and row["faces_per_s"] > 0, row
    # Both outputs, pulled back from nginx, carry the invisible mark.
    assert sorted(row["watermark_found"]) == ["b240p-2-0", "b240p-2-1"] and all(row["watermark_found"].values()), row
    records = json.loads((tmp_path / "out" / "ci.json").read_text())
    metrics = {r["metric"] for r in records}
    assert {"serve_faces_per_s_240p15_rtmp_n2", "serve_streams_240p15_rtmp_within_budget"} <= metrics, metrics
    assert all(r["command"].startswith("python tools/bench_streams.py --clip 240p=") for r in records)
    assert "| 240p | rtmp | rtmp | 2 |" in (tmp_path / "out" / "ci.md").read_text()
