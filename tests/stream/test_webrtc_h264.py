"""WebRTC video on the GPU path's terms: the WHIP answer puts H.264 first, and the publisher's H.264
access units leave aiortc's decoder thread for our decode function (`gpu/rtc.py`), which on the GPU
is NVDEC. Real aiortc peers over loopback.

On the CPU the decode function is FFmpeg's H.264 decoder (PyAV), so the test checks the routing
itself: every video frame the server swapped came through the diverted queue, none through aiortc's
own decoder, and what comes back to the publisher is the swapped face. On the GPU the runtime
stream of a publisher takes the access units to NVDEC (test_whip_runtime.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("aiortc")
pytest.importorskip("aiohttp")

import av  # noqa: E402
from aiohttp import ClientSession  # noqa: E402

from swapstream.gpu.rtc import (DivertingQueue, divert_video, h264_first, prefer_h264,  # noqa: E402
                                RTP_VIDEO_TIME_BASE)
from swapstream.live.rtp import LiveH264Encoder  # noqa: E402
from swapstream.live.webrtc import WhipServer, first_codec  # noqa: E402

from ..helpers.probe import ProbeClock, Received, StampedVideoTrack  # noqa: E402
from .webrtc_peers import (connect, fresh_job, looks_swapped, mesh_swap, publisher, start,  # noqa: E402
                          swap_media, until)

SIZE = (320, 240)


def cpu_decode() -> Callable[[bytes, int], list[Any]]:
    """FFmpeg's H.264 decoder as the diverted decode function, as aiortc would decode (but here)."""
    codec = av.CodecContext.create("h264", "r")

    def decode(data: bytes, timestamp: int) -> list[Any]:
        packet = av.Packet(data)
        packet.pts, packet.time_base = timestamp, RTP_VIDEO_TIME_BASE
        return list(codec.decode(packet))

    return decode


def run_scenario(make_decode: Callable[[], Callable[[bytes, int], list[Any]]],
                 swap: Callable[[np.ndarray, int], int]) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        diverted: list[DivertingQueue] = []

        def on_publisher(pc: Any) -> None:
            t = prefer_h264(pc)
            q = divert_video(t.receiver, make_decode(), asyncio.get_running_loop())
            assert q is not None, "aiortc's decoder queue was not found"
            diverted.append(q)

        server = WhipServer(swap_media(swap, prepare=on_publisher))
        runner, base = await start(server.app)
        source = StampedVideoTrack(ProbeClock(asyncio.get_running_loop().time()), size=SIZE)
        got = Received()
        pc = publisher([source], got)
        async with ClientSession() as http:
            await connect(http, base + "/whip", pc)
            await until(lambda: len(got.video) >= 15, 30, "15 swapped frames back at the publisher")
            session = next(iter(server.sessions.values()))
            encoders = [getattr(t.sender, "_RTCRtpSender__encoder", None) for t in session.pc.getTransceivers()
                        if t.kind == "video"]
        answer = pc.remoteDescription.sdp
        await pc.close()
        await runner.cleanup()
        return {"got": got.video, "sources": source.sources, "answer": answer, "queue": diverted[0],
                "frames_in": session.frames_in, "faces": session.faces, "encoders": encoders}

    return asyncio.run(scenario())


def check_result(res: dict[str, Any]) -> None:
    assert first_codec(res["answer"]) == "H264", res["answer"]
    # The swapped video went out through our H.264 encoder (its frames are checked below).
    assert [type(e) for e in res["encoders"]] == [LiveH264Encoder], res["encoders"]
    q: DivertingQueue = res["queue"]
    # Every received video frame was decoded by the diverted function: aiortc's decoder got none.
    assert q.access_units > 0 and q.errors == 0
    assert q.frames >= res["frames_in"] > 0, (q.frames, res["frames_in"])
    assert res["faces"] > 0
    check = fresh_job()
    ratios = [np.divide(*looks_swapped(img, res["sources"][n], check)) for n, img, _t in res["got"][-8:]]
    check.close()
    # The swapped face is much closer to a fresh swap than to the source frame (as in the WHIP test).
    assert max(ratios) < 0.5, [round(r, 2) for r in ratios]


def test_h264_first_orders_only_h264_ahead() -> None:
    from aiortc import RTCRtpSender

    codecs = RTCRtpSender.getCapabilities("video").codecs
    ordered = h264_first(codecs)
    names = [c.mimeType for c in ordered]
    n264 = sum(1 for c in codecs if c.mimeType == "video/H264")
    assert n264 > 0 and all(n == "video/H264" for n in names[:n264])
    assert sorted(map(repr, ordered)) == sorted(map(repr, codecs))  # nothing lost or added


def test_whip_h264_access_units_are_diverted_to_our_decoder() -> None:
    job, swap = mesh_swap(smoothing=False)
    try:
        res = run_scenario(cpu_decode, swap)
    finally:
        job.close()
    check_result(res)
