"""`swapstream serve` under load, at the small scale CI affords (issue 25): 40 WHIP offers sent at
once and 100 control-API calls, while a probe polls /healthz every 20 ms. The app is built as serve
builds it (WhipServer and the control API on one aiohttp app and one event loop), served from a
thread of its own on loopback; the load comes from real aiortc peers and HTTP clients in the test's
thread.

What must hold: /healthz answers within 100 ms at the p99 throughout; no answer is a 500; no more
offers than --max-sessions are accepted, the rest get 503; two accepted publishers connect and get
their video back meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("aiortc")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from aiohttp import ClientSession  # noqa: E402
from aiortc import RTCPeerConnection, RTCSessionDescription  # noqa: E402

from swapstream.config import load_config  # noqa: E402
from swapstream.live.webrtc import WhipServer  # noqa: E402
from swapstream.runtime.api import ApiSettings, mount_runtime  # noqa: E402
from swapstream.runtime.manager import StreamRuntime  # noqa: E402

from ..helpers.probe import ProbeClock, Received, StampedVideoTrack  # noqa: E402
from .test_webrtc_security import HealthProbe  # noqa: E402
from .webrtc_peers import ServerThread, publisher, until, swap_media  # noqa: E402

OFFERS = 40
API_CALLS = 100
BURST_CALLS = 60
"""API calls sent with the offers, all at once; the rest are spread over the streaming that follows."""
STREAM_S = 2.0
"""How long the publishers that connected stream while the rest of the API calls come: with the
burst, a window of some 150 health checks, so that the p99 is not just the slowest one."""
MAX_SESSIONS = 16
STREAMING = 2
"""Accepted publishers that take their answer, connect and stream; the others stay half-open."""
P99_S = 0.1
API_TOKEN = "load-test-api-token-0123456789"
WHIP_TOKEN = "load-test-whip-token"


def passthrough(rgb: Any, index: int) -> int:
    """The swap: none. The server's handling of the load is under test, not the face swap."""
    return 1


def serve_app() -> tuple[WhipServer, StreamRuntime]:
    """What `swapstream serve` puts together (cli.serve, _mount_runtime), with a swap that does
    nothing."""
    cfg = load_config("live")
    server = WhipServer(swap_media(passthrough), token=WHIP_TOKEN, max_sessions=MAX_SESSIONS, settings=cfg.webrtc,
                        host="127.0.0.1")
    runtime = StreamRuntime(cfg)
    mount_runtime(server.app, runtime, ApiSettings(API_TOKEN))
    return server, runtime


def test_serve_answers_health_checks_fast_under_40_offers_and_100_api_calls() -> None:
    server, _runtime = serve_app()
    served = ServerThread(server.app)
    base = served.base
    statuses: Counter[tuple[str, int]] = Counter()

    async def offer(http: ClientSession, pc: RTCPeerConnection) -> tuple[int, str, str]:
        headers = {"Content-Type": "application/sdp", "Authorization": f"Bearer {WHIP_TOKEN}"}
        async with http.post(base + "/whip", data=pc.localDescription.sdp, headers=headers) as r:
            statuses[("POST /whip", r.status)] += 1
            return r.status, await r.text(), r.headers.get("Location", "")

    async def api_call(http: ClientSession, i: int) -> None:
        auth = {"Authorization": f"Bearer {API_TOKEN}"}
        kind = i % 4
        if kind == 0:
            method, path, kwargs = "GET", "/api/streams", {}
        elif kind == 1:
            method, path, kwargs = "GET", "/metrics", {}
        elif kind == 2:  # not JSON
            method, path, kwargs = "POST", "/api/streams", {"data": b"{not json", "headers": {
                "Content-Type": "application/json"}}
        else:  # JSON the API refuses by its schema (no outputs), before it looks at any input
            method, path, kwargs = "POST", "/api/streams", {"json": {"input": "clip.mp4", "outputs": []}}
        headers = {**auth, **kwargs.pop("headers", {})}
        async with http.request(method, base + path, headers=headers, **kwargs) as r:
            await r.read()
            statuses[(f"{method} {path}", r.status)] += 1

    async def scenario() -> dict[str, Any]:
        clock = ProbeClock(asyncio.get_running_loop().time())
        got = [Received() for _ in range(OFFERS)]
        pcs = [publisher([StampedVideoTrack(clock, size=(160, 120))], g) for g in got]
        for pc in pcs:  # the offers are ready before the clock runs: the server's load is measured
            await pc.setLocalDescription(await pc.createOffer())
        async with ClientSession() as http, ClientSession() as probe_http:
            async with probe_http.get(base + "/healthz") as r:
                assert r.status == 200
            t0 = time.perf_counter()
            with HealthProbe(probe_http, base + "/healthz") as probe:
                await asyncio.sleep(0.3)  # the idle baseline
                answers, _ = await asyncio.gather(
                    asyncio.gather(*(offer(http, pc) for pc in pcs)),
                    asyncio.gather(*(api_call(http, i) for i in range(BURST_CALLS))))
                accepted = [(pc, g, text, where) for pc, g, (status, text, where) in zip(pcs, got, answers)
                            if status == 201]
                for pc, _g, text, _where in accepted[:STREAMING]:
                    await pc.setRemoteDescription(RTCSessionDescription(sdp=text, type="answer"))
                await until(lambda: all(len(g.video) >= 5 for _pc, g, _t, _w in accepted[:STREAMING]), 20,
                            "video back at the publishers that connected")
                for i in range(BURST_CALLS, API_CALLS):
                    await api_call(http, i)
                    await asyncio.sleep(STREAM_S / (API_CALLS - BURST_CALLS))
                for _pc, _g, _text, where in accepted:
                    async with http.delete(base + where, headers={"Authorization": f"Bearer {WHIP_TOKEN}"}) as r:
                        statuses[("DELETE /whip", r.status)] += 1
                await asyncio.sleep(0.3)
            took = time.perf_counter() - t0
        for pc in pcs:
            await pc.close()
        return {"probe": probe, "accepted": len(accepted), "took": took,
                "left": len(server.sessions), "opening": dict(server.opening)}

    try:
        out = asyncio.run(scenario())
    finally:
        served.close()
    probe: HealthProbe = out["probe"]
    summary = {"healthz_polls": len(probe.times), "healthz_p99_ms": round(probe.p99() * 1e3, 1),
               "healthz_max_ms": round(max(probe.times) * 1e3, 1), "accepted": out["accepted"],
               "seconds": round(out["took"], 1),
               "statuses": {f"{what} {status}": n for (what, status), n in sorted(statuses.items())}}
    print(json.dumps(summary, default=str))
    assert not probe.failures, probe.failures
    assert not [k for k in statuses if k[1] >= 500 and k[1] != 503], statuses
    assert not [k for k in statuses if k[0] == "POST /whip" and k[1] not in (201, 503)], statuses
    assert out["accepted"] <= MAX_SESSIONS and statuses[("POST /whip", 503)] >= OFFERS - MAX_SESSIONS, statuses
    assert statuses[("DELETE /whip", 200)] == out["accepted"] and out["left"] == 0, statuses
    assert out["opening"] == {"WHIP": 0, "WHEP": 0}
    assert sum(n for (what, _), n in statuses.items() if not what.endswith("/whip")) == API_CALLS
    assert len(probe.times) >= 100, summary
    assert probe.p99() <= P99_S, summary
