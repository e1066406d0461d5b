"""A slow live output's HLS plays in a browser: Debian's headless Chromium (its built-in HLS player;
Playwright only drives it) loads, over loopback HTTP, the playlist that `LiveWriter` writes at
3.75 frames a second, at the first moment `hls_playable` says it can, and plays it. Chromium failed
both one-second segments of 4 frames and a live playlist of one or two segments with
DEMUXER_ERROR_COULD_NOT_PARSE; the dashboard then fell back to still previews (seen on CI's two
cores, where the CPU swap delivers a few frames a second)."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from fractions import Fraction
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")
av = pytest.importorskip("av")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

from swapstream.live.streams import HLS_SEGMENT_FRAMES, LiveWriter, hls_playable  # noqa: E402
from swapstream.types import Frame  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]
TB = Fraction(1, 30)
STEP = 8
"""Output frames every 8/30 s: 3.75 fps, a CPU swap that keeps up with one input frame in eight."""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over loopback HTTP, and its URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def play(url: str) -> dict[str, object]:
    """Chromium's verdict on an HLS playlist: playing, or its error (whichever comes first)."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(url)
            # A wait on a condition, generous for CI's two cores.
            page.wait_for_function("""() => { const v = document.getElementById('v');
                return v.error !== null || (v.readyState >= 2 && v.currentTime > 0); }""", timeout=30000)
            return page.evaluate("""() => { const v = document.getElementById('v');
                return {error: v.error && v.error.message, ready: v.readyState, time: v.currentTime}; }""")
        finally:
            browser.close()


def test_a_slow_hls_output_plays_in_chromium_as_soon_as_it_is_said_to(http_folder: tuple[Path, str]) -> None:
    folder, url = http_folder
    playlist = folder / "hls" / "index.m3u8"
    w = LiveWriter(str(playlist), kind="hls", width=320, height=240, fps=30, time_base=TB, threads=1)
    (folder / "play.html").write_text('<video id="v" muted autoplay src="hls/index.m3u8"></video>')
    rng = np.random.default_rng()
    base = rng.integers(0, 256, (240, 320, 3), np.uint8)
    states = []
    try:
        for i in range(40):  # 10.7 s of output
            # Moving content, fresh each run: a still picture would encode to almost nothing.
            w.write(Frame(np.roll(base, 5 * i, axis=1), pts=i * STEP, time_base=TB))
            if not states and hls_playable(playlist):
                # The dashboard's cue (`hls_ready`): the first moment the playlist is said to play.
                states.append(play(url + "/play.html"))
    finally:
        w.close()
    assert states, "the playlist never became playable"
    assert states[0]["error"] is None and states[0]["time"] > 0, states[0]
    counts = []
    for seg in sorted((folder / "hls").glob("*.ts"))[:-1]:  # the last one ends where the writing did
        with av.open(str(seg)) as c:
            counts.append(sum(1 for _ in c.decode(video=0)))
    assert len(counts) >= 3 and min(counts) >= HLS_SEGMENT_FRAMES, counts
