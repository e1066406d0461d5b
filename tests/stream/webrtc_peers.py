"""Real peers for the WebRTC tests: our aiohttp app on an ephemeral loopback port, and aiortc
clients that publish (WHIP) or view (WHEP) through it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from aiohttp import ClientSession, web
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription

from swapstream.config import load_config
from swapstream.demo import astronaut
from swapstream.live.probe import Received, receive
from swapstream.pipeline import FileJob
from swapstream.types import Frame


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve `app` on 127.0.0.1 on a free port; returns the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def connect(http: ClientSession, url: str, pc: RTCPeerConnection) -> str:
    """WHIP/WHEP without trickle ICE: POST the complete offer, apply the answer; returns Location."""
    await pc.setLocalDescription(await pc.createOffer())
    r = await http.post(url, data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"})
    assert r.status == 201, (r.status, await r.text())
    await pc.setRemoteDescription(RTCSessionDescription(sdp=await r.text(), type="answer"))
    return r.headers["Location"]


def publisher(tracks: list[MediaStreamTrack], got: Received) -> RTCPeerConnection:
    """A WHIP publisher that sends `tracks` and receives what comes back into `got`."""
    pc = RTCPeerConnection()
    for t in tracks:
        pc.addTransceiver(t, direction="sendrecv")
    pc.on("track", lambda track: asyncio.ensure_future(receive(track, got)))
    return pc


def viewer(kinds: tuple[str, ...], got: Received) -> RTCPeerConnection:
    """A WHEP viewer (receive only)."""
    pc = RTCPeerConnection()
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


def mesh_swap(*, extra_delay_s: float = 0.0) -> tuple[FileJob, Callable[[np.ndarray, int], int]]:
    """The real CPU swap (mesh, default preset, the astronaut's face) as WhipServer's swap function.

    `extra_delay_s` makes the swap stage that much slower than it is, standing in for a heavy
    model or a loaded GPU: the frames are still really swapped.
    """
    job = FileJob(load_config())
    job.set_source_image(astronaut(), "astronaut")

    def swap(rgb: np.ndarray, index: int) -> int:
        faces = job.swap_frame(Frame(rgb, pts=index, time_base=Fraction(1, 15), index=index))
        if extra_delay_s:
            time.sleep(extra_delay_s)  # runs in the swap worker thread, as a slow model would
        return faces

    return job, swap
