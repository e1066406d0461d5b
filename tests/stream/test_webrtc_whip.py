"""WHIP with real peers in one process over loopback ICE: an aiortc publisher and our aiohttp server.

The publisher sends animated portrait frames stamped with their number; the server swaps the face
and sends the video back on the same connection; the test checks what comes back.
"""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("aiortc")
pytest.importorskip("aiohttp")

from aiohttp import ClientSession, web  # noqa: E402
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription  # noqa: E402
import av  # noqa: E402

from swapstream.config import load_config  # noqa: E402

from swapstream.live.probe import read_stamp, stamp  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, render_target_frame  # noqa: E402
from swapstream.live.webrtc import WhipServer  # noqa: E402
from swapstream.pipeline import FileJob  # noqa: E402
from swapstream.types import Frame  # noqa: E402

SIZE = (320, 240)


class PortraitTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.portrait = grace_hopper()
        self.sources: dict[int, np.ndarray] = {}

    async def recv(self) -> av.VideoFrame:
        await asyncio.sleep(1 / 15)
        img = render_target_frame(self.portrait, self.n / 15, SIZE)
        stamp(img, self.n % 256)
        self.sources[self.n % 256] = img.copy()
        f = av.VideoFrame.from_ndarray(img, format="rgb24")
        f.pts = self.n * 6000
        f.time_base = Fraction(1, 90000)
        self.n += 1
        return f


async def collect(track: MediaStreamTrack, into: list[tuple[int, np.ndarray]]) -> None:
    """Receive a video track until it ends, keeping each frame with its stamped number."""
    while True:
        try:
            f = await track.recv()
        except Exception:  # the track ended (MediaStreamError) or the connection closed
            return
        img = f.to_ndarray(format="rgb24")
        into.append((read_stamp(img), img))


def make_swap():
    job = FileJob(load_config())
    job.set_source_image(astronaut(), "astronaut")

    def swap(rgb: np.ndarray, index: int) -> int:
        return job.swap_frame(Frame(rgb, pts=index, time_base=Fraction(1, 15), index=index))

    return job, swap


def test_whip_publish_get_swapped_video_back_and_delete() -> None:
    async def scenario() -> dict:
        job, swap = make_swap()
        server = WhipServer(swap)
        runner = web.AppRunner(server.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        pc = RTCPeerConnection()
        source = PortraitTrack()
        pc.addTransceiver(source, direction="sendrecv")
        got: list[tuple[int, np.ndarray]] = []

        pc.on("track", lambda track: asyncio.ensure_future(collect(track, got)))

        await pc.setLocalDescription(await pc.createOffer())
        async with ClientSession() as http:
            bad = await http.post(base + "/whip", data="x", headers={"Content-Type": "text/plain"})
            assert bad.status == 415
            r = await http.post(base + "/whip", data=pc.localDescription.sdp,
                                headers={"Content-Type": "application/sdp"})
            assert r.status == 201
            location = r.headers["Location"]
            assert location.startswith("/whip/") and r.content_type == "application/sdp"
            await pc.setRemoteDescription(RTCSessionDescription(sdp=await r.text(), type="answer"))
            # A WHEP viewer (view-only) of the same swapped stream.
            viewer = RTCPeerConnection()
            viewer.addTransceiver("video", direction="recvonly")
            seen: list[tuple[int, np.ndarray]] = []
            viewer.on("track", lambda track: asyncio.ensure_future(collect(track, seen)))

            await viewer.setLocalDescription(await viewer.createOffer())
            rv = await http.post(base + "/whep", data=viewer.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp"})
            assert rv.status == 201 and rv.headers["Location"].startswith("/whep/")
            await viewer.setRemoteDescription(RTCSessionDescription(sdp=await rv.text(), type="answer"))
            deadline = time.monotonic() + 25
            while (len(got) < 20 or len(seen) < 10) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            dv = await http.delete(base + rv.headers["Location"])
            assert dv.status == 200
            await viewer.close()
            sessions_before = len(server.sessions)
            stats = next(iter(server.sessions.values()))
            d = await http.delete(base + location)
            assert d.status == 200
            again = await http.delete(base + location)
            assert again.status == 404
        await pc.close()
        await runner.cleanup()
        job.close()
        return {"got": got, "sources": source.sources, "sessions_before": sessions_before,
                "sessions_after": len(server.sessions), "faces": stats.faces,
                "latency": stats.latency_ms, "dropped": stats.dropped, "seen": seen,
                "viewers_after": len(server.viewers)}

    res = asyncio.run(scenario())
    got = res["got"]
    assert len(got) >= 20, f"only {len(got)} frames came back"
    assert res["sessions_before"] == 1 and res["sessions_after"] == 0
    idx = [n for n, _ in got]
    assert idx == sorted(idx)  # frames come back in order (with drops allowed, no reordering)
    assert res["faces"] > 0
    seen = [n for n, _ in res["seen"]]
    assert len(seen) >= 10 and seen == sorted(seen) and res["viewers_after"] == 0  # WHEP viewer
    changed = 0
    for n, img in got[5:]:
        ref = res["sources"][n]
        face = (slice(40, 200), slice(110, 210))
        changed += np.abs(img[face].astype(int) - ref[face]).mean() > 8
    assert changed >= 0.8 * len(got[5:])
    print(f"WHIP: {len(got)} swapped frames back, swap stage median {np.median(res['latency']):.0f} ms, "
          f"{res['dropped']} dropped as late")
