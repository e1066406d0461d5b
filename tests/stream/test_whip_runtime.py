"""WHIP publishers as streams of the multi-stream runtime (`runtime.rtc`), as `swapstream serve`
runs them: real aiortc publishers on loopback, a real runtime on this machine's device, the real
mesh swap. What comes back to each publisher is its own face swapped; each publisher is a stream of
its own (its own analyser and tracks) beside the API's; ending a session removes its stream, and
removing the stream (the API's DELETE) ends the session."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

pytest.importorskip("aiortc")
pytest.importorskip("aiohttp")

from aiohttp import ClientSession  # noqa: E402

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut  # noqa: E402
from swapstream.live.webrtc import WhipServer, first_codec  # noqa: E402
from swapstream.runtime.manager import StreamRuntime  # noqa: E402
from swapstream.runtime.rtc import RuntimePublishers
from swapstream.runtime.whip_relay import WHIP_ID_PREFIX  # noqa: E402

from ..helpers.probe import ProbeClock, Received, StampedVideoTrack  # noqa: E402
from .webrtc_peers import connect, fresh_job, looks_swapped, publisher, start, until  # noqa: E402

SIZES = ((320, 240), (256, 192))
NO_SMOOTHING = ("smoothing.enabled=false",)
"""Each frame's swap then depends on that frame alone, so that what comes back can be compared with
the same sent frame swapped afresh (`looks_swapped`)."""


def run_publishers(devices: list[str] | None, frames: int = 15) -> dict[str, Any]:
    """Two publishers at different sizes on one server whose media is a runtime on `devices`;
    what came back, what the runtime held while they ran, and what was left after each way of
    ending a session."""

    async def scenario() -> dict[str, Any]:
        cfg = load_config("live")
        runtime = StreamRuntime(cfg, devices=devices)
        await runtime.start()
        media = RuntimePublishers(runtime, image=astronaut(), image_name="astronaut",
                                  config=load_config("live", list(NO_SMOOTHING)))
        server = WhipServer(media)
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        sources = [StampedVideoTrack(clock, size=size) for size in SIZES]
        got = [Received(), Received()]
        pcs = [publisher([src], g) for src, g in zip(sources, got)]
        res: dict[str, Any] = {}
        try:
            async with ClientSession() as http:
                locations = [await connect(http, base + "/whip", pc) for pc in pcs]
                await until(lambda: all(len(g.video) >= frames for g in got), 60,
                            f"{frames} frames back at each publisher")
                streams = {sid: p for sid, p in runtime.streams.items()}
                res["infos"] = [p.info() for p in streams.values()]
                res["analysers"] = {sid: id(p._analyser) for sid, p in streams.items()}
                res["packets"] = [p._source.packets for p in streams.values()]
                res["nvdec_frames"] = [getattr(p._decode, "frames", 0) for p in streams.values()]
                sessions = list(server.sessions.values())
                res["faces"] = [s.faces for s in sessions]
                res["latency"] = [list(s.latency_ms) for s in sessions]
                res["answers"] = [pc.remoteDescription.sdp for pc in pcs]
                # The first publisher leaves (WHIP DELETE): its stream goes from the runtime.
                first_id = WHIP_ID_PREFIX + locations[0].rsplit("/", 1)[1][:12]
                assert first_id in streams, (first_id, list(streams))
                d = await http.delete(base + locations[0])
                assert d.status == 200
                await until(lambda: first_id not in runtime.streams and first_id not in runtime.stopping,
                            10, "the first publisher's stream removed")
                # The second one's stream is removed through the runtime (the API's DELETE): the
                # session ends with it.
                second_id = next(iter(runtime.streams))
                await runtime.remove_stream(second_id)
                await until(lambda: not server.sessions, 10, "the second session dropped")
                res["left"] = dict(runtime.streams)
        finally:
            for pc in pcs:
                await pc.close()
            await runner.cleanup()
            await runtime.close()
        res["got"] = [g.video for g in got]
        res["sources"] = [s.sources for s in sources]
        return res

    return asyncio.run(scenario())


def check_swapped_back(res: dict[str, Any]) -> None:
    infos = res["infos"]
    assert len(infos) == 2 and all(i["id"].startswith(WHIP_ID_PREFIX) for i in infos), infos
    assert all(i["outputs"] == [{"type": "webrtc"}] and i["state"] == "running" for i in infos), infos
    assert all(i["frames_out"] > 0 and i["faces_swapped"] > 0 and i["source"]["set"] for i in infos), infos
    assert all(f > 0 for f in res["faces"]), res["faces"]
    assert all(lat and min(lat) > 0 for lat in res["latency"])
    assert res["left"] == {}
    check = fresh_job()
    try:
        for got, sources in zip(res["got"], res["sources"]):
            idx = [n for n, _img, _t in got]
            assert idx == sorted(idx)  # in order, drops allowed
            ratios = [np.divide(*looks_swapped(img, sources[n], check)) for n, img, _t in got[-6:]]
            # Much closer to a fresh swap of the same frame than to the frame sent (an unswapped
            # frame sits far above 1): the same bound as the other WebRTC tests, once tracks settled.
            assert max(ratios) < 0.5, [round(r, 2) for r in ratios]
    finally:
        check.close()


def test_whip_publishers_are_runtime_streams_of_their_own() -> None:
    res = run_publishers(["cpu"])
    check_swapped_back(res)
    # Each publisher has its own analyser (its own tracks and landmark smoothing).
    assert len(set(res["analysers"].values())) == 2, res["analysers"]
    assert res["packets"] == [False, False]  # on the CPU aiortc decodes


@pytest.mark.gpu
def test_whip_publishers_on_the_gpu_decode_on_nvdec() -> None:
    from swapstream.gpu.pynvc import nvdec_available
    from swapstream.runtime.metrics import GpuMonitor

    monitor = GpuMonitor()
    try:
        if not (monitor.available and monitor.count):
            pytest.skip("no GPU")
    finally:
        monitor.close()
    ok, why = nvdec_available()
    if not ok:
        pytest.skip(why)
    res = run_publishers(["cuda:0"])
    check_swapped_back(res)
    assert all(first_codec(a) == "H264" for a in res["answers"])
    # The access units went to the streams' NVDEC decoders (aiortc decoded none of them).
    assert res["packets"] == [True, True] and all(n > 0 for n in res["nvdec_frames"]), res


def test_serve_with_workers_places_each_publisher_on_a_worker(tmp_path: Any) -> None:
    """`swapstream serve --workers 2` as a user starts it: a publisher's offer goes to a worker,
    whose stream swaps its face and sends it back; the control API lists that stream with its
    worker; --max-sessions holds over all workers; a DELETE ends the session and its stream."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import cv2

    face = tmp_path / "face.png"
    cv2.imwrite(str(face), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "whip-workers-test-token-0123456789"
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "swapstream.cli", "serve", "-s", str(face), "--port", str(port),
                             "--workers", "2", "--max-sessions", "1", "--set", "smoothing.enabled=false"],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SWAPSTREAM_API_TOKEN": token})
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}

    async def scenario() -> dict[str, Any]:
        async with ClientSession() as http:
            async def ready() -> bool:
                assert proc.poll() is None, "serve exited"
                try:
                    async with http.get(base + "/readyz") as r:
                        return r.status == 200
                except OSError:
                    return False

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while not await ready():
                assert loop.time() < deadline, "serve --workers 2 not ready in 120 s"
                await asyncio.sleep(0.25)
            source = StampedVideoTrack(ProbeClock(loop.time()), size=SIZES[0])
            got = Received()
            pc = publisher([source], got)
            second = publisher([StampedVideoTrack(ProbeClock(loop.time()), size=SIZES[1])], Received())
            try:
                location = await connect(http, base + "/whip", pc)
                await until(lambda: len(got.video) >= 15, 60, "15 frames back from the worker")
                async with http.get(base + "/api/streams", headers=auth) as r:
                    listed = (await r.json())["streams"]
                async with http.get(base + "/health") as r:
                    health = await r.json()
                # The cap holds over the workers: a second publisher is refused while the first is up.
                await second.setLocalDescription(await second.createOffer())
                async with http.post(base + "/whip", data=second.localDescription.sdp,
                                     headers={"Content-Type": "application/sdp"}) as r:
                    refused = r.status
                # A DELETE of the wrong kind is a 404 and leaves the session counted.
                async with http.delete(base + location.replace("/whip/", "/whep/")) as r:
                    wrong_kind = r.status
                async with http.get(base + "/health") as r:
                    health_after = await r.json()
                # The publisher's stream answers through the API as an API stream does.
                stream_id = WHIP_ID_PREFIX + location.rsplit("/", 1)[1][:12]
                async with http.get(base + f"/api/streams/{stream_id}", headers=auth) as r:
                    inspected = (r.status, await r.json())
                async with http.delete(base + location) as r:
                    deleted = r.status
                async with http.delete(base + location) as r:
                    again = r.status

                async def whip_streams() -> list[dict[str, Any]]:
                    async with http.get(base + "/api/streams", headers=auth) as r:
                        return [s for s in (await r.json())["streams"] if s["id"].startswith(WHIP_ID_PREFIX)]

                deadline = loop.time() + 15
                while await whip_streams():
                    assert loop.time() < deadline, "the publisher's stream was not removed"
                    await asyncio.sleep(0.2)
            finally:
                await pc.close()
                await second.close()
            return {"got": got.video, "sources": source.sources, "listed": listed, "health": health,
                    "refused": refused, "deleted": deleted, "again": again, "location": location,
                    "wrong_kind": wrong_kind, "health_after": health_after, "inspected": inspected}

    try:
        res = asyncio.run(scenario())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        out = log.read()
    whip = [s for s in res["listed"] if s["id"].startswith(WHIP_ID_PREFIX)]
    assert len(whip) == 1 and whip[0]["worker"] in ("w0", "w1"), res["listed"]
    assert whip[0]["outputs"] == [{"type": "webrtc"}] and whip[0]["faces_swapped"] > 0, whip
    assert res["location"].startswith("/whip/") and res["health"]["sessions"] == 1
    assert res["refused"] == 503 and res["deleted"] == 200 and res["again"] == 404, res
    assert res["wrong_kind"] == 404 and res["health_after"]["sessions"] == 1, res
    status, info = res["inspected"]
    assert status == 200 and info["id"] == whip[0]["id"] and info["worker"] == whip[0]["worker"], res["inspected"]
    assert "WHIP publishers are placed on the workers" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    check = fresh_job()
    try:
        ratios = [np.divide(*looks_swapped(img, res["sources"][n], check)) for n, img, _t in res["got"][-6:]]
    finally:
        check.close()
    assert max(ratios) < 0.5, [round(r, 2) for r in ratios]


def test_a_publisher_the_runtime_cannot_take_is_refused_with_the_reason() -> None:
    """The runtime is full (runtime.max_streams): the offer is answered 503 with why, before any
    answer went out; it is not answered and then dropped."""

    async def scenario() -> tuple[int, str, int, int]:
        runtime = StreamRuntime(load_config("live", ["runtime.max_streams=1"]), devices=["cpu"])
        await runtime.start()
        server = WhipServer(RuntimePublishers(runtime, image=astronaut(), image_name="astronaut"))
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        first = publisher([StampedVideoTrack(clock, size=SIZES[0])], Received())
        second = publisher([StampedVideoTrack(clock, size=SIZES[1])], Received())
        try:
            async with ClientSession() as http:
                await connect(http, base + "/whip", first)
                await second.setLocalDescription(await second.createOffer())
                async with http.post(base + "/whip", data=second.localDescription.sdp,
                                     headers={"Content-Type": "application/sdp"}) as r:
                    status, text = r.status, await r.text()
                return status, text, len(server.sessions), len(runtime.streams)
        finally:
            await first.close()
            await second.close()
            await runner.cleanup()
            await runtime.close()

    status, text, sessions, streams = asyncio.run(scenario())
    assert status == 503 and "runtime.max_streams" in text, (status, text)
    assert sessions == 1 and streams == 1
