"""Real peers for the WebRTC tests: our aiohttp app on an ephemeral loopback port, and aiortc
clients that publish (WHIP) or view (WHEP) through it."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Coroutine
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
from aiohttp import ClientSession, web
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from swapstream.config import Config, load_config
from swapstream.demo import astronaut
from swapstream.disclosure import Disclosure
from swapstream.face.analyser import FaceAnalyser
from swapstream.runtime.swappers import MeshBackend, SwapItem
from swapstream.types import Frame

from ..helpers.probe import Received, receive

T = TypeVar("T")


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve `app` on 127.0.0.1 on a free port; returns the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def connect(http: ClientSession, url: str, pc: RTCPeerConnection, *, token: str | None = None) -> str:
    """WHIP/WHEP without trickle ICE: POST the complete offer, apply the answer; returns Location.
    `token`: sent as `Authorization: Bearer TOKEN`, for a server started with one."""
    await pc.setLocalDescription(await pc.createOffer())
    headers = {"Content-Type": "application/sdp"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    r = await http.post(url, data=pc.localDescription.sdp, headers=headers)
    assert r.status == 201, (r.status, await r.text())
    await pc.setRemoteDescription(RTCSessionDescription(sdp=await r.text(), type="answer"))
    return r.headers["Location"]


def local_peer() -> RTCPeerConnection:
    """A peer connection without ICE servers: aiortc's default configuration contacts Google's STUN
    server, and a test must reach nothing beyond this machine."""
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


def publisher(tracks: list[MediaStreamTrack], got: Received) -> RTCPeerConnection:
    """A WHIP publisher that sends `tracks` and receives what comes back into `got`."""
    pc = local_peer()
    for t in tracks:
        pc.addTransceiver(t, direction="sendrecv")
    pc.on("track", lambda track: asyncio.ensure_future(receive(track, got)))
    return pc


def viewer(kinds: tuple[str, ...], got: Received) -> RTCPeerConnection:
    """A WHEP viewer (receive only)."""
    pc = local_peer()
    for k in kinds:
        pc.addTransceiver(k, direction="recvonly")
    pc.on("track", lambda track: asyncio.ensure_future(receive(track, got)))
    return pc


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait on the event loop until `condition()` holds; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


class ReferenceSwap:
    """The CPU mesh swap of one stream's frames, with the astronaut's face, as a runtime stream
    makes it (a `FaceAnalyser` tracking the faces, the runtime's `MeshBackend`, the label and the
    mark): what a test compares a server's output with."""

    def __init__(self, config: Config) -> None:
        self.analyser = FaceAnalyser(config)
        self.backend = MeshBackend(config)
        self.identity = self.backend.identity(astronaut())
        self.disclosure = Disclosure(config, live=True)

    def swap(self, rgb: np.ndarray, faces: list[Any]) -> int:
        """Swap `faces` in `rgb`, in place."""
        return self.backend.swap([SwapItem(rgb, faces, self.identity)])[0] if faces else 0

    def swap_frame(self, frame: Frame) -> int:
        """Track the faces of the stream's next frame, swap them in place, label and mark it."""
        n = self.swap(frame.data, self.analyser.track(frame))
        self.disclosure.apply(frame.data, n > 0)
        return n

    def close(self) -> None:
        self.analyser.close()
        self.backend.close()


def mesh_swap(*, extra_delay_s: float = 0.0, smoothing: bool = True
              ) -> tuple[ReferenceSwap, Callable[[np.ndarray, int], int]]:
    """The real CPU swap (mesh, default preset, the astronaut's face) as WhipServer's swap function.

    `extra_delay_s` makes the swap stage that much slower than it is, standing in for a heavy
    model or a loaded GPU: the frames are still really swapped. Without `smoothing` (of the
    landmarks over time) each frame's swap depends on that frame alone, so that a frame seen at the
    far end can be compared with the same source frame swapped afresh (`fresh_job`).
    """
    job = ReferenceSwap(load_config(None, [] if smoothing else ["smoothing.enabled=false"]))

    def swap(rgb: np.ndarray, index: int) -> int:
        faces = job.swap_frame(Frame(rgb, pts=index, time_base=Fraction(1, 15), index=index))
        if extra_delay_s:
            time.sleep(extra_delay_s)  # runs in the swap worker thread, as a slow model would
        return faces

    return job, swap


class ServerThread:
    """Our app served from its own thread's event loop, for tests whose main thread drives a
    browser (Playwright's sync API). `call` runs a coroutine on that loop and waits for it."""

    def __init__(self, app: web.Application) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self._thread.start()
        self.runner, self.base = self.call(start(app))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def chromium_args(*extra: str) -> list[str]:
    """Headless Debian Chromium for WebRTC on loopback."""
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            # Host candidates as plain IP addresses: aiortc cannot resolve Chromium's mDNS names.
            "--disable-features=WebRtcHideLocalIpsWithMdns", *extra]


def fresh_job() -> ReferenceSwap:
    """A swap without smoothing of the astronaut's face: what a server running
    `mesh_swap(smoothing=False)` makes of a frame, before any codec. Close it after use."""
    return ReferenceSwap(load_config(None, ["smoothing.enabled=false"]))


def looks_swapped(seen: np.ndarray, sent: np.ndarray, job: ReferenceSwap | None = None
                  ) -> tuple[float, float]:
    """How far `seen` (what came out) is from `sent` swapped afresh (by `job`, else a `fresh_job()`),
    and from `sent` itself, over the pixels the swap changes a lot (glasses, eyes, mouth): codec
    blur dominates elsewhere."""
    swapper = job or fresh_job()
    try:
        expected = sent.copy()
        swapper.swap(expected, swapper.analyser.analyse_image(expected))
    finally:
        if job is None:
            swapper.close()
    changed = np.abs(expected.astype(int) - sent.astype(int)).mean(axis=2) > 30
    assert changed.sum() > 300, "the swap changed almost nothing in the sent frame"
    to_swapped = float(np.abs(seen[changed].astype(int) - expected[changed].astype(int)).mean())
    to_sent = float(np.abs(seen[changed].astype(int) - sent[changed].astype(int)).mean())
    return to_swapped, to_sent


class SwapMedia:
    """A test's `PublisherMedia`: the newest received frame (older ones waiting are dropped and
    counted, as the runtime's queues do), as RGB, swapped in place by the test's `swap` on one thread
    that the server's publishers share, then delivered with its receive time.

    The product's media is a runtime stream (`runtime.rtc.RuntimePublishers`, tested in
    test_whip_runtime.py); this one lets a test of the server's own half (negotiation, limits,
    tracks, audio) swap with a function of its own: a stamp reader, a slowed-down mesh swap."""

    def __init__(self, link: Any, swap: Callable[[np.ndarray, int], int], pool: ThreadPoolExecutor,
                 prepare: Callable[[Any], Any] | None) -> None:
        self.link = link
        self._swap = swap
        self._pool = pool
        self._prepare = prepare
        self.faces = 0
        self.dropped = 0
        self.index = 0
        self._latest: tuple[Any, float] | None = None
        self._busy = False
        self._closed = False
        self._lock = threading.Lock()

    def prepare(self, pc: Any) -> None:
        if self._prepare is not None:
            self._prepare(pc)

    async def start(self) -> None:
        pass

    def push(self, frame: Any) -> None:
        with self._lock:
            if self._latest is not None:
                self.dropped += 1
            self._latest = (frame, time.monotonic())
            if self._busy:
                return
            self._busy = True
        self._pool.submit(self._run)

    def _run(self) -> None:
        while True:
            with self._lock:
                item, self._latest = self._latest, None
                if item is None or self._closed:
                    self._busy = False
                    return
            frame, received = item
            rgb = np.ascontiguousarray(frame.to_ndarray(format="rgb24"))
            self.faces += self._swap(rgb, self.index)
            self.index += 1
            self.link.deliver(rgb, frame.pts, frame.time_base, received)

    def end(self) -> None:
        pass

    async def close(self) -> None:
        self._closed = True


def swap_media(swap: Callable[[np.ndarray, int], int], *,
               prepare: Callable[[Any], Any] | None = None) -> Callable[[Any], SwapMedia]:
    """A `MediaFactory` of `SwapMedia` over `swap`; `prepare` sets up each publisher's connection
    before its offer is applied (the GPU path's H.264 first and NVDEC diversion)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-swap")
    return lambda link: SwapMedia(link, swap, pool, prepare)
