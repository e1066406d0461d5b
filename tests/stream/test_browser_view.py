"""The view-only page (WHEP) as an OBS Browser Source would load it, in headless Chromium, while an
aiortc publisher sends the demo clip (stamped) and a tone over WHIP. Checks that frames are decoded
and keep coming, that the picture is the swapped stream, and that the page around the video is
the background the URL asked for (a chroma colour, or transparent)."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

pytest.importorskip("aiortc")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

import cv2  # noqa: E402
from aiohttp import ClientSession  # noqa: E402
from aiortc import RTCPeerConnection  # noqa: E402

from swapstream.live.probe import ProbeClock, Received, StampedVideoTrack, ToneTrack, read_stamp  # noqa: E402
from swapstream.live.webrtc import WhipServer  # noqa: E402

from .webrtc_peers import (ServerThread, chromium_args, connect, looks_swapped, mesh_swap,  # noqa: E402
                          publisher)

W, H = 320, 240
VIEWPORT = {"width": 2 * W, "height": H}
"""Twice as wide as the video: the video fills the middle half, the background the two sides."""
VIDEO = (slice(0, H), slice(W // 2, W // 2 + W))
SIDES = (slice(0, H), np.r_[0:W // 2 - 8, W // 2 + W + 8:2 * W])
"""The page's background, 8 px clear of the video's edges (scaling blurs them)."""


def test_view_page_plays_the_swapped_stream_on_the_requested_background() -> None:
    job, swap = mesh_swap(smoothing=False)
    server = ServerThread(WhipServer(swap).app)

    async def go_live() -> tuple[RTCPeerConnection, StampedVideoTrack]:
        clock = ProbeClock(asyncio.get_running_loop().time())
        video = StampedVideoTrack(clock, size=(W, H))
        pc = publisher([video, ToneTrack(clock)], Received())
        async with ClientSession() as http:
            await connect(http, server.base + "/whip", pc)
        return pc, video

    pc, video = server.call(go_live())
    shots: dict[str, np.ndarray] = {}
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(
                "--autoplay-policy=no-user-gesture-required"))
            for query in ("bg=chroma&color=ff00ff", "bg=transparent"):
                page = browser.new_page(viewport=VIEWPORT)
                page.goto(f"{server.base}/view?{query}")
                page.wait_for_function("window.stats.frames > 10 || window.stats.error", timeout=30000)
                first = page.evaluate("window.stats")
                assert first["error"] is None and first["status"] == 201, first
                # Frames keep being decoded, and the audio comes too.
                page.wait_for_function(f"window.stats.frames > {first['frames'] + 10}", timeout=15000)
                page.wait_for_function("window.stats.audioPackets > 25", timeout=15000)
                png = page.screenshot(omit_background=True)  # what OBS composites: alpha included
                shots[query] = cv2.cvtColor(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED),
                                            cv2.COLOR_BGRA2RGBA)
                page.close()
            # A bad colour is refused on the page, readably, rather than shown as some colour.
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{server.base}/view?bg=chroma&color=green")
            page.wait_for_function("window.stats.error !== null", timeout=10000)
            assert "color must be RRGGBB hex" in page.evaluate("window.stats.error")
            assert "SwapStream view:" in page.inner_text("body")
            browser.close()
    finally:
        server.call(pc.close())
        server.close()
        job.close()

    for query, shot in shots.items():
        assert shot.shape == (H, 2 * W, 4)
        sides, picture = shot[SIDES], shot[VIDEO]
        if query.startswith("bg=chroma"):
            assert (sides == (255, 0, 255, 255)).all(), np.unique(sides.reshape(-1, 4), axis=0)[:5]
        else:
            assert (sides[..., 3] == 0).all(), "the page around the video is not transparent"
        assert (picture[..., 3] == 255).all(), "the video itself must be opaque"
        # The picture is the swapped stream: a stamped frame of the publisher's, showing that
        # frame's face swapped (see test_browser_preview.py for the 0.5).
        rgb = np.ascontiguousarray(picture[..., :3])
        n = read_stamp(rgb)
        assert n in video.sources, f"stamp {n} was never sent"
        to_swapped, to_sent = looks_swapped(rgb, video.sources[n])
        print(f"view {query}: frame {n}, changed pixels {to_swapped:.1f} from the swapped frame, "
              f"{to_sent:.1f} from the sent frame")
        assert to_swapped < 0.5 * to_sent, (to_swapped, to_sent)
