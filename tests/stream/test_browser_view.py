"""The view-only page (WHEP) as an OBS Browser Source would load it, in headless Chromium, while an
aiortc publisher sends the demo clip (stamped) and a tone over WHIP. Checks that frames are decoded
and keep coming, that the picture is the swapped stream, and that the page around the video is
the background the URL asked for (a chroma colour, or transparent). Then both pages (/view and
the preview at /) against a server started with a token: the token in the URL is sent on the POST
and the DELETE, and a refused or missing token is said on the page."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

pytest.importorskip("aiortc")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

import cv2  # noqa: E402
from aiohttp import ClientSession, web  # noqa: E402
from aiortc import RTCPeerConnection  # noqa: E402

from swapstream.live.webrtc import WhipServer  # noqa: E402

from ..helpers.probe import ProbeClock, Received, StampedVideoTrack, ToneTrack, read_stamp  # noqa: E402
from .webrtc_peers import (ServerThread, chromium_args, connect, looks_swapped, mesh_swap, swap_media,  # noqa: E402
                          publisher, until)

W, H = 320, 240
VIEWPORT = {"width": 2 * W, "height": H}
"""Twice as wide as the video: the video fills the middle half, the background the two sides."""
VIDEO = (slice(0, H), slice(W // 2, W // 2 + W))
SIDES = (slice(0, H), np.r_[0:W // 2 - 8, W // 2 + W + 8:2 * W])
"""The page's background, 8 px clear of the video's edges (scaling blurs them)."""


def test_view_page_plays_the_swapped_stream_on_the_requested_background() -> None:
    job, swap = mesh_swap(smoothing=False)
    server = ServerThread(WhipServer(swap_media(swap)).app)

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


TOKEN = "view-7c1e"
NEEDS_TOKEN = "this server needs a token: add ?token=... to the URL"
WRONG_TOKEN = "the server refused the token in the URL (401)"
Request = tuple[str, str, int]
"""Method, path and the status answered."""


def token_server() -> tuple[ServerThread, WhipServer, list[Request]]:
    """A server started with TOKEN that records every request it answers: a page that has been left
    cannot report its own DELETE, so the server's side is where the test sees it. The swap passes
    frames through: the token is under test here, not the swap."""
    whip = WhipServer(swap_media(lambda rgb, index: 1), token=TOKEN)
    seen: list[Request] = []

    @web.middleware
    async def record(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        response = await handler(request)
        seen.append((request.method, request.path, response.status))
        return response

    whip.app.middlewares.append(record)
    return ServerThread(whip.app), whip, seen


def test_view_page_sends_the_url_token_and_says_when_it_is_missing_or_wrong() -> None:
    server, whip, seen = token_server()

    async def go_live() -> RTCPeerConnection:
        # A WHEP viewer only gets frames while someone publishes.
        pc = publisher([StampedVideoTrack(ProbeClock(asyncio.get_running_loop().time()), size=(W, H))],
                       Received())
        async with ClientSession() as http:
            await connect(http, server.base + "/whip", pc, token=TOKEN)
        return pc

    pc = server.call(go_live())
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(
                "--autoplay-policy=no-user-gesture-required"))
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{server.base}/view?bg=transparent&token={TOKEN}")
            page.wait_for_function("window.stats.frames > 10 || window.stats.error", timeout=30000)
            stats = page.evaluate("window.stats")
            assert stats["error"] is None and stats["status"] == 201, stats
            assert len(whip.viewers) == 1
            # Leaving the page sends its DELETE, which needs the token as much as the POST did.
            page.goto("about:blank")
            server.call(until(lambda: any(m == "DELETE" for m, _, _ in seen), 10, "the page's DELETE"))
            deletes = [r for r in seen if r[0] == "DELETE"]
            # 404, not 401, if Chromium's closing the connection ended the session first: the token
            # was still accepted, since the server checks it before looking the session up.
            assert len(deletes) == 1, seen
            _, path, answered = deletes[0]
            assert path.startswith("/whep/") and answered in (200, 404), seen
            server.call(until(lambda: not whip.viewers, 10, "the viewer's session to end"))

            refusals = ((f"bg=transparent&token=not-{TOKEN}", WRONG_TOKEN), ("bg=green", NEEDS_TOKEN))
            for query, says in refusals:
                page.goto(f"{server.base}/view?{query}")
                page.wait_for_function("window.stats.error !== null", timeout=10000)
                stats = page.evaluate("window.stats")
                assert stats["status"] == 401 and says in stats["error"], stats
                # On the page itself, where OBS shows the source: not an empty (transparent) picture.
                assert says in page.inner_text("body")
            assert not whip.viewers
            assert [r[2] for r in seen if r[:2] == ("POST", "/whep")] == [201, 401, 401], seen
            browser.close()
    finally:
        server.call(pc.close())
        server.close()


def test_preview_page_sends_the_url_token_and_says_when_it_is_missing_or_wrong() -> None:
    server, whip, seen = token_server()
    # Chromium's generated camera and microphone: the page needs a camera to get as far as its POST.
    args = chromium_args("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
            page = browser.new_page(viewport={"width": 800, "height": 500})
            page.goto(f"{server.base}/?token={TOKEN}")
            page.wait_for_function("window.stats.frames > 10 || window.stats.error", timeout=30000)
            stats = page.evaluate("window.stats")
            assert stats["error"] is None and stats["status"] == 201, stats
            assert page.inner_text("#status").startswith("connected: /whip/")

            for query, says in ((f"?token=not-{TOKEN}", WRONG_TOKEN), ("", NEEDS_TOKEN)):
                page.goto(f"{server.base}/{query}")
                page.wait_for_function("window.stats.error !== null", timeout=10000)
                stats = page.evaluate("window.stats")
                assert stats["status"] == 401 and says in stats["error"], stats
                status = page.locator("#status")
                assert says in status.inner_text()
                assert "error" in (status.get_attribute("class") or "")  # styled to stand out
            assert [r[2] for r in seen if r[:2] == ("POST", "/whip")] == [201, 401, 401], seen
            browser.close()
    finally:
        server.close()
