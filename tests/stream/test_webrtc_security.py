"""WHIP/WHEP security (issue 25), with real aiortc peers on loopback against the real server:

- no WebRTC session contacts or resolves anything beyond this machine (no default STUN server);
- serve refuses a --host beyond loopback without a token; the Host header must name the server;
  a bearer header that is not UTF-8 is a 401;
- the session cap holds against offers sent at once, and a session that never connects gives its
  slot back after `webrtc.connect_timeout_s`;
- an offer's size, media sections and candidates are limited before anything parses it, and a huge
  offer leaves the event loop free;
- OPTIONS and CORS (RFC 9725) with an explicit origin allowlist.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiortc")
pytest.importorskip("aiohttp")

from aiohttp import ClientError, ClientSession  # noqa: E402
from aiortc import RTCPeerConnection  # noqa: E402

from swapstream.config import WebRtcConfig  # noqa: E402
from swapstream.errors import ConfigError  # noqa: E402
from swapstream.live.webrtc import (WhipServer, host_name, is_loopback_host, own_addresses,  # noqa: E402
                                    require_whip_token)

from ..helpers.probe import ProbeClock, Received, StampedVideoTrack, ToneTrack  # noqa: E402
from .webrtc_peers import ServerThread, connect, local_peer, publisher, start, until, viewer, swap_media  # noqa: E402

SIZE = (160, 120)
SDP = {"Content-Type": "application/sdp"}


def passthrough(rgb: Any, index: int) -> int:
    """The swap: none. The server around it is under test here, not the face swap."""
    return 1


# --------------------------------------------------------------------------------------------------
# What the process resolves and contacts: Python's audit events for every socket call


class NetworkWatch:
    """Records, while entered, every host name or address a socket call of this process (any thread)
    names that is not this machine, and blocks that call: the watch both reports a leak and keeps
    it from reaching the network.

    This machine is loopback plus the addresses of its own interfaces: aioice never gathers
    127.0.0.1 or ::1 as ICE candidates, so two aiortc peers in one process reach each other on the
    host's interface addresses, and the kernel delivers packets to a local address without them
    leaving the host. Names other than `localhost` are foreign: resolving one asks a DNS server.
    """

    EVENTS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
              "socket.gethostbyaddr", "socket.getnameinfo", "socket.connect", "socket.sendto",
              "socket.sendmsg", "socket.bind")
    _active: list[NetworkWatch] = []
    _installed = False

    def __init__(self) -> None:
        self.local = own_addresses() | {"127.0.0.1", "::1"}
        self.seen: list[tuple[str, str]] = []
        """Every (event, host) noted, local or not: that the watch saw the session at all."""
        self.foreign: list[tuple[str, str]] = []

    def __enter__(self) -> NetworkWatch:
        if not NetworkWatch._installed:
            # An audit hook cannot be removed: one for the process, which does nothing unless a
            # watch is entered.
            sys.addaudithook(NetworkWatch._hook)
            NetworkWatch._installed = True
        NetworkWatch._active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        NetworkWatch._active.remove(self)

    @staticmethod
    def _hook(event: str, args: tuple[Any, ...]) -> None:
        if not NetworkWatch._active or event not in NetworkWatch.EVENTS:
            return
        host = NetworkWatch._host(event, args)
        if host is None:
            return
        foreign = False
        for watch in list(NetworkWatch._active):
            watch.seen.append((event, host))
            if not watch.is_local(host):
                watch.foreign.append((event, host))
                foreign = True
        if foreign:
            raise PermissionError(f"{event} {host!r}: beyond this machine, blocked by the test")

    @staticmethod
    def _host(event: str, args: tuple[Any, ...]) -> str | None:
        """The host the call names; None for calls that name none (Unix sockets, connected sends)."""
        if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                     "socket.gethostbyaddr"):
            name = args[0]
        else:
            address = args[0] if event == "socket.getnameinfo" else args[1]
            if not isinstance(address, tuple) or not address:
                return None
            name = address[0]
        if isinstance(name, bytes):
            name = name.decode("ascii", "replace")
        return "" if name is None else str(name)

    def is_local(self, host: str) -> bool:
        name = host.split("%", 1)[0].lower()  # fe80::1%eth0: the address without its zone
        if name == "localhost":
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name (or "" for every address): not this machine's to answer
        return ip.is_loopback or str(ip) in self.local


def test_the_watch_catches_aiortcs_default_stun_server() -> None:
    # What the server did before: a peer connection without configuration gathers a server-
    # reflexive candidate from Google's STUN server. The watch must see (and block) that lookup,
    # or the test below would prove nothing.
    async def gather() -> None:
        pc = RTCPeerConnection()
        pc.addTransceiver("video")
        await pc.setLocalDescription(await pc.createOffer())
        await pc.close()

    with NetworkWatch() as watch:
        asyncio.run(gather())
    assert any("stun.l.google.com" in host for _, host in watch.foreign), watch.foreign


def test_a_webrtc_session_reaches_nothing_beyond_this_machine() -> None:
    """A WHIP publisher (video and a tone) and a WHEP viewer negotiate with the server and get
    media back, then end; nothing in the process resolves a name or sends to an address that is
    not this machine's."""

    async def scenario() -> tuple[Received, Received, int]:
        server = WhipServer(swap_media(passthrough))
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        back, seen = Received(), Received()
        pc = publisher([StampedVideoTrack(clock, size=SIZE), ToneTrack(clock)], back)
        view = viewer(("video", "audio"), seen)
        async with ClientSession() as http:
            location = await connect(http, base + "/whip", pc)
            view_location = await connect(http, base + "/whep", view)
            await until(lambda: len(back.video) >= 10 and len(seen.video) >= 5 and len(seen.audio) >= 10,
                        30, "video back at the publisher, video and audio at the viewer")
            for where in (view_location, location):
                assert (await http.delete(base + where)).status == 200
        await view.close()
        await pc.close()
        await runner.cleanup()
        return back, seen, len(server.sessions) + len(server.viewers)

    with NetworkWatch() as watch:
        back, seen, left = asyncio.run(scenario())
    assert not watch.foreign, f"contacted or resolved beyond this machine: {sorted(set(watch.foreign))}"
    # The watch saw the session: the HTTP connections and the ICE sockets.
    assert any(event == "socket.connect" for event, _ in watch.seen), watch.seen[:20]
    assert any(event == "socket.sendto" for event, _ in watch.seen), watch.seen[:20]
    assert len(back.video) >= 10 and len(seen.audio) >= 10 and left == 0


def test_the_pages_use_the_configured_ice_servers_only() -> None:
    async def pages(settings: WebRtcConfig) -> dict[str, str]:
        server = WhipServer(swap_media(passthrough), settings=settings)
        runner, base = await start(server.app)
        async with ClientSession() as http:
            got = {path: await (await http.get(base + path)).text() for path in ("/", "/view")}
        await runner.cleanup()
        return got

    default = asyncio.run(pages(WebRtcConfig()))
    configured = asyncio.run(pages(WebRtcConfig(ice_servers=["stun:stun.example.org:3478"])))
    for path in ("/", "/view"):
        assert '<meta name="swapstream-ice-servers" content="[]">' in default[path]
        assert ('<meta name="swapstream-ice-servers" content="[&quot;stun:stun.example.org:3478&quot;]">'
                in configured[path])
        assert "new RTCPeerConnection({ iceServers: iceServers() })" in default[path]
        assert "new RTCPeerConnection()" not in default[path]
    # And the server's own connections: no servers but the configured ones.
    assert WhipServer(swap_media(passthrough))._rtc_configuration().iceServers == []
    stun = WhipServer(swap_media(passthrough), settings=WebRtcConfig(ice_servers=["stun:127.0.0.1:3478"]))
    assert [s.urls for s in stun._rtc_configuration().iceServers] == ["stun:127.0.0.1:3478"]


def test_the_view_page_in_chromium_gets_no_ice_servers_but_the_configured_ones() -> None:
    import shutil

    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium (.ci/run installs it)")
    from .webrtc_peers import chromium_args

    # A STUN server on loopback that nothing answers: configured, the page must hand it over as is.
    servers = {"default": WebRtcConfig(), "configured": WebRtcConfig(ice_servers=["stun:127.0.0.1:9"])}
    seen = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=chromium_args())
        for name, settings in servers.items():
            server = ServerThread(WhipServer(swap_media(passthrough), settings=settings).app)
            try:
                page = browser.new_page()
                page.goto(f"{server.base}/view")
                page.wait_for_function("window.stats.iceServers !== null || window.stats.error", timeout=15000)
                seen[name] = page.evaluate("window.stats.iceServers")
                page.close()
            finally:
                server.close()
        browser.close()
    assert seen == {"default": [], "configured": ["stun:127.0.0.1:9"]}


# --------------------------------------------------------------------------------------------------
# Open by default: token off loopback, the Host header, the bearer check


def test_a_host_beyond_loopback_needs_a_whip_token() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback_host(host), host
        require_whip_token(host, None)
    for host in ("0.0.0.0", "::", "192.0.2.7", "my-host.lan", ""):
        assert not is_loopback_host(host), host
        with pytest.raises(ConfigError, match="--whip-token TOKEN .*SWAPSTREAM_WHIP_TOKEN"):
            require_whip_token(host, None)
        with pytest.raises(ConfigError):
            require_whip_token(host, "")
        require_whip_token(host, "a-token")


def test_serve_refuses_to_start_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    import cv2

    from swapstream.demo import astronaut

    face = tmp_path / "face.png"
    cv2.imwrite(str(face), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    env = {k: v for k, v in os.environ.items() if k not in ("SWAPSTREAM_WHIP_TOKEN", "FORCE_COLOR")}
    env["TERM"] = "dumb"
    # Refused before anything loads or listens: a server that started would run into the timeout.
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", "serve", "-s", str(face), "--host", "0.0.0.0",
                          "--port", "9"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and "--whip-token" in errors[0] and "SWAPSTREAM_WHIP_TOKEN" in errors[0], res.stderr


async def post_offer(http: ClientSession, url: str, sdp: str | bytes, **headers: str) -> tuple[int, str]:
    async with http.post(url, data=sdp, headers={**SDP, **headers}) as r:
        return r.status, await r.text()


async def an_offer(kinds: tuple[str, ...] = ("video",)) -> str:
    """A real aiortc offer (recvonly, as a viewer's): each POST of it makes a session of its own."""
    pc = local_peer()
    for kind in kinds:
        pc.addTransceiver(kind, direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def test_the_host_header_must_name_this_server() -> None:
    """DNS rebinding: a page from an attacker's name that now resolves to 127.0.0.1 reaches the
    server with the attacker's name in Host. Before, POST /whep with a foreign Host got 201."""

    async def scenario() -> None:
        server = WhipServer(swap_media(passthrough))
        runner, base = await start(server.app)
        port = base.rsplit(":", 1)[1]
        offer = await an_offer()
        async with ClientSession() as http:
            for host in (f"rebind.attacker.example:{port}", "rebind.attacker.example", f"192.0.2.99:{port}",
                         "localhost.attacker.example", f"127.0.0.1.nip.io:{port}"):
                for method, path in (("POST", "/whep"), ("POST", "/whip"), ("DELETE", "/whep/x"),
                                     ("DELETE", "/whip/x"), ("OPTIONS", "/whep"), ("OPTIONS", "/whip")):
                    async with http.request(method, base + path, data=offer, headers={**SDP, "Host": host}) as r:
                        assert r.status == 421, (method, path, host, r.status)
                        assert "webrtc.allowed_hosts" in await r.text()
            assert not server.viewers and not server.sessions
            # The names the server has, with any port, and without one.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "localhost."):
                status, text = await post_offer(http, base + "/whep", offer, Host=host)
                assert status == 201, (host, status, text)
            assert len(server.viewers) == 5
        await runner.cleanup()

    asyncio.run(scenario())


def test_allowed_hosts_are_the_configured_names_and_the_listened_host() -> None:
    configured = WhipServer(swap_media(passthrough), settings=WebRtcConfig(allowed_hosts=["studio.lan", "[fd00::5]"]),
                            host="10.1.2.3")
    assert configured.allowed_hosts == {"studio.lan", "fd00::5", "10.1.2.3"}
    assert WhipServer(swap_media(passthrough), host="127.0.0.1").allowed_hosts == {"localhost", "127.0.0.1", "::1"}
    # Listening on every address: the machine's own addresses are its names too (an address is
    # never a rebound name); other names still must be configured.
    everywhere = WhipServer(swap_media(passthrough), host="0.0.0.0").allowed_hosts
    assert own_addresses() <= everywhere and "0.0.0.0" not in everywhere
    assert [host_name(h) for h in ("[::1]:80", "Studio.LAN.:8080", "fd00::5", "10.0.0.1")] == [
        "::1", "studio.lan", "fd00::5", "10.0.0.1"]


async def raw_request(base: str, head: bytes) -> tuple[int, bytes]:
    """Send `head` (request line and headers, as bytes) and read the answer's head: bytes no HTTP
    client would send. Not the body: aiohttp keeps a connection whose request body was not read
    open a while (lingering), to read and drop what comes."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    return int(answer.split(b" ", 2)[1]), answer


def test_a_bearer_header_that_is_not_utf8_is_a_401_not_a_500() -> None:
    async def scenario() -> None:
        server = WhipServer(swap_media(passthrough), token="tökén-1")
        runner, base = await start(server.app)
        offer = await an_offer()
        for value in (b"Bearer \xff\xfe", b"Bearer t\xf6k\xe9n-1", "Bearer tökén-2".encode(), b"\xc3(",
                      b"Bearer \xed\xa0\x80"):
            for method, path in (("POST", "/whip"), ("POST", "/whep"), ("DELETE", "/whep/x")):
                head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
                        f"Content-Length: 0\r\nConnection: close\r\nAuthorization: ").encode() + value + b"\r\n\r\n"
                status, answer = await raw_request(base, head)
                assert status == 401, (value, path, answer[:300])
        # The right token, in UTF-8 as a client sends it, still works.
        async with ClientSession() as http:
            status, text = await post_offer(http, base + "/whep", offer, Authorization="Bearer tökén-1")
            assert status == 201, text
        await runner.cleanup()

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------------
# The session cap: offers at once, and sessions that never connect


def test_offers_sent_at_once_never_pass_the_session_cap() -> None:
    """Before, the cap was checked before the awaits and the session added after them: 30 offers at
    once all got 201 against a cap of 16."""
    cap, offers = 4, 12

    async def scenario() -> None:
        server = WhipServer(swap_media(passthrough), max_sessions=cap)
        runner, base = await start(server.app)
        offer = await an_offer()
        async with ClientSession() as http:
            for path, sessions in (("/whep", server.viewers), ("/whip", server.sessions)):
                answers = await asyncio.gather(*(post_offer(http, base + path, offer) for _ in range(offers)))
                statuses = sorted(status for status, _ in answers)
                assert statuses == [201] * cap + [503] * (offers - cap), (path, statuses)
                assert len(sessions) == cap
            assert server.opening == {"WHIP": 0, "WHEP": 0}
        await runner.cleanup()

    asyncio.run(scenario())


def test_a_session_that_never_connects_gives_its_slot_back() -> None:
    """Offers whose answers are never applied (half-open sessions) held their slots for about a
    minute, and the real publisher got 503. With a connect timeout of 1 s they are dropped, and a
    publisher that does connect is not."""
    cap = 2
    timeout = 1.0

    async def scenario() -> None:
        server = WhipServer(swap_media(passthrough), max_sessions=cap, settings=WebRtcConfig(connect_timeout_s=timeout))
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        # Offerers that never take the answer: their ICE never starts, so the server's never completes.
        half_open = [publisher([StampedVideoTrack(clock, size=SIZE)], Received()) for _ in range(cap)]
        for pc in half_open:
            await pc.setLocalDescription(await pc.createOffer())
        got = Received()
        real = publisher([StampedVideoTrack(clock, size=SIZE)], got)
        async with ClientSession() as http:
            for pc in half_open:
                status, text = await post_offer(http, base + "/whip", pc.localDescription.sdp)
                assert status == 201, text
            status, _ = await post_offer(http, base + "/whip", "v=0\r\n")
            assert status == 503  # full
            t0 = time.monotonic()
            await until(lambda: not server.sessions, 10 * timeout, "the half-open sessions to be dropped")
            assert time.monotonic() - t0 < 4 * timeout
            await connect(http, base + "/whip", real)
            await until(lambda: len(got.video) >= 5, 20, "frames back at the publisher that connected")
            await asyncio.sleep(2 * timeout)  # well past its timeout: connected, so kept
            assert len(server.sessions) == 1
            assert next(iter(server.sessions.values())).pc.connectionState == "connected"
        for pc in (*half_open, real):
            await pc.close()
        await runner.cleanup()

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------------
# Offer limits, and the event loop while a huge offer comes


def bundled_offer(sdp: str, sections: int) -> str:
    """`sdp` (one video section) with that section repeated `sections` times, all in one BUNDLE
    group: the shape of the issue's 996 KB offer at 600 sections."""
    head, _, media = sdp.partition("m=video")
    mid = next(line for line in media.splitlines() if line.startswith("a=mid:"))
    copies = ["m=video" + media.replace(mid, f"a=mid:m{i}") for i in range(sections)]
    group = next(line for line in head.splitlines() if line.startswith("a=group:BUNDLE"))
    head = head.replace(group, "a=group:BUNDLE " + " ".join(f"m{i}" for i in range(sections)))
    return head + "".join(copies)


class HealthProbe:
    """GET `url` every `every` s until stopped; each answer's time, and any status but 200."""

    def __init__(self, http: ClientSession, url: str, every: float = 0.02) -> None:
        self.http, self.url, self.every = http, url, every
        self.times: list[float] = []
        self.failures: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            async with self.http.get(self.url) as r:
                await r.read()
                if r.status != 200:
                    self.failures.append(r.status)
            self.times.append(time.perf_counter() - t0)
            await asyncio.sleep(self.every)

    def __enter__(self) -> HealthProbe:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def p99(self) -> float:
        ordered = sorted(self.times)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_a_huge_offer_is_refused_at_once_and_the_loop_stays_free() -> None:
    """The issue's offer: ~1 MB, 600 bundled sections. It took 2.6 s in setRemoteDescription on the
    loop, and /health went from 5 ms to 2,661 ms. Now it is refused by its size (Content-Length, or
    the bytes read of a chunked body), and a small one with as many sections by their count."""

    server = WhipServer(swap_media(passthrough))
    # The server on a loop of its own, as in `swapstream serve`: a stall of its loop shows in the
    # probe's answers, not hidden in the probe's own waiting.
    served = ServerThread(server.app)
    base = served.base

    async def scenario() -> dict[str, Any]:
        offer = await an_offer()
        huge = bundled_offer(offer, 600)
        assert len(huge) > 900_000
        out: dict[str, Any] = {}
        async with ClientSession() as http, ClientSession() as probe_http:
            await (await probe_http.get(base + "/health")).read()  # connected before the clock runs
            with HealthProbe(probe_http, base + "/health") as probe:
                await asyncio.sleep(0.2)
                for path in ("/whip", "/whep"):
                    t0 = time.perf_counter()
                    status, text = await post_offer(http, base + path, huge)
                    out[f"sized {path}"] = (status, time.perf_counter() - t0, text)

                async def chunks() -> AsyncIterator[bytes]:
                    data = huge.encode()
                    for i in range(0, len(data), 16384):
                        yield data[i:i + 16384]

                t0 = time.perf_counter()
                try:
                    async with http.post(base + "/whip", data=chunks(), headers=SDP) as r:
                        out["chunked"] = (r.status, time.perf_counter() - t0, await r.text())
                except ClientError as e:  # refused mid-body: the server closed without reading the rest
                    out["chunked"] = (type(e).__name__, time.perf_counter() - t0, str(e))
                await asyncio.sleep(0.3)
            out["health"] = (probe.p99(), max(probe.times), len(probe.times), probe.failures)
        out["sessions"] = len(server.sessions) + len(server.viewers)
        return out

    try:
        out = asyncio.run(scenario())
    finally:
        served.close()
    print({k: v[:2] if isinstance(v, tuple) else v for k, v in out.items()})
    for path in ("/whip", "/whep"):
        status, took, text = out[f"sized {path}"]
        assert status == 413 and "webrtc.max_sdp_bytes" in text, out
        assert took < 1.0, out
    status, took, _ = out["chunked"]
    assert status in (413, "ClientOSError", "ServerDisconnectedError", "ClientPayloadError"), out
    assert took < 2.0, out
    p99, worst, polls, failures = out["health"]
    assert polls >= 10 and not failures, out["health"]
    # Before: 2.6 s (and more on a loaded machine) for one /health while the offer was applied.
    assert worst < 0.5, out["health"]
    assert out["sessions"] == 0


def test_offer_limits_refuse_before_parsing() -> None:
    async def scenario() -> None:
        settings = WebRtcConfig(max_m_sections=4, max_candidates=8)
        server = WhipServer(swap_media(passthrough), settings=settings)
        runner, base = await start(server.app)
        offer = await an_offer(("video", "audio"))
        async with ClientSession() as http:
            many = bundled_offer(await an_offer(), 5)
            status, text = await post_offer(http, base + "/whip", many)
            assert status == 400 and "5 media sections" in text and "webrtc.max_m_sections" in text, text
            # 600 tiny sections, well under the size limit: refused by their count.
            tiny = "v=0\r\n" + "".join(f"m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:{i}\r\n" for i in range(600))
            status, text = await post_offer(http, base + "/whep", tiny)
            assert status == 400 and "600 media sections" in text, text
            head, _, rest = offer.partition("m=video")
            flood = head + "m=video" + rest.replace(
                "a=mid:", "".join(f"a=candidate:{i} 1 udp {2000 - i} 127.0.0.1 {20000 + i} typ host\r\n"
                                  for i in range(9)) + "a=mid:", 1)
            status, text = await post_offer(http, base + "/whip", flood)
            assert status == 400 and "webrtc.max_candidates" in text, text
            # What the parser refuses is refused off the loop, as a 400 that says so.
            broken = re.sub(r"^m=video [0-9]+", "m=video x", offer, flags=re.M)
            status, text = await post_offer(http, base + "/whip", broken)
            assert status == 400 and text.startswith("cannot parse this offer"), text
            status, text = await post_offer(http, base + "/whip", b"v=0\r\nm=video 9 \xff\r\n")
            assert status == 400 and "not UTF-8" in text, text
            status, _ = await raw_request(base, b"POST /whip HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                                b"application/sdp\r\nContent-Length: 70000\r\n\r\n")
            assert status == 413  # from the header alone: nothing of the body was sent
            assert not server.sessions and not server.viewers
            assert server.opening == {"WHIP": 0, "WHEP": 0}
            # Within every limit: a real offer of the pages' shape is taken.
            status, text = await post_offer(http, base + "/whep", offer)
            assert status == 201, text
        await runner.cleanup()

    asyncio.run(scenario())


def test_the_largest_offer_within_the_limits_keeps_the_loop_free() -> None:
    """What the limits let through still runs on the loop in aiortc: the worst of it (64 KiB of
    attributes over 8 sections, or of candidates up to their limit) must stay short."""

    settings = WebRtcConfig()
    served = ServerThread(WhipServer(swap_media(passthrough), settings=settings, max_sessions=64).app)
    base = served.base

    async def scenario() -> list[float]:
        offer = await an_offer()
        dense = bundled_offer(offer, settings.max_m_sections)
        filler = "".join(f"a=ssrc:{1000 + i} cname:c{i}\r\n" for i in range(5000))
        room = settings.max_sdp_bytes - len(dense) - 64
        dense = dense.replace("a=mid:m0", filler[:room - room % 32].rsplit("\r\n", 1)[0] + "\r\na=mid:m0", 1)
        assert settings.max_sdp_bytes - 1024 < len(dense.encode()) <= settings.max_sdp_bytes
        async with ClientSession() as http, ClientSession() as probe_http:
            await (await probe_http.get(base + "/health")).read()
            with HealthProbe(probe_http, base + "/health") as probe:
                await asyncio.sleep(0.2)
                for _ in range(3):
                    status, text = await post_offer(http, base + "/whep", dense)
                    assert status == 201, text
                await asyncio.sleep(0.2)
        return probe.times

    try:
        times = asyncio.run(scenario())
        if max(times) >= 0.25:
            # Offers that hold the loop hold it on every try; a loaded 2-core machine's one-off
            # stall does not (CI once saw one probe of 0.47 s among others under 0.12 s, where this
            # test alone gives 0.06-0.11 s). A second measurement tells the two apart.
            first = sorted(times)[-5:]
            times = asyncio.run(scenario())
            assert max(times) < 0.25, (first, sorted(times)[-5:])
    finally:
        served.close()


# --------------------------------------------------------------------------------------------------
# OPTIONS and CORS


def test_options_answer_204_and_cors_only_for_allowed_origins() -> None:
    studio = "https://studio.example"

    async def scenario(cors: list[str]) -> dict[str, Any]:
        server = WhipServer(swap_media(passthrough), token="tok", settings=WebRtcConfig(cors_origins=cors))
        runner, base = await start(server.app)
        offer = await an_offer()
        found: dict[str, Any] = {}
        preflight = {"Origin": studio, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        async with ClientSession() as http:
            for path in ("/whip", "/whep", "/whip/some-session", "/whep/some-session"):
                async with http.options(base + path, headers=preflight) as r:
                    found[path] = (r.status, dict(r.headers))
            async with http.options(base + "/whip", headers={**preflight, "Origin": "https://evil.example"}) as r:
                found["evil"] = (r.status, dict(r.headers))
            async with http.post(base + "/whep", data=offer,
                                 headers={**SDP, "Origin": studio, "Authorization": "Bearer tok"}) as r:
                found["post"] = (r.status, dict(r.headers))
            async with http.post(base + "/whep", data=offer, headers={**SDP, "Origin": studio}) as r:
                found["refused"] = (r.status, dict(r.headers))
        await runner.cleanup()
        return found

    closed = asyncio.run(scenario([]))
    for path in ("/whip", "/whep"):
        status, headers = closed[path]
        assert status == 204 and headers["Accept-Post"] == "application/sdp", (path, closed[path])
    assert closed["/whip/some-session"][0] == 204 and "Accept-Post" not in closed["/whip/some-session"][1]
    for status, headers in closed.values():
        assert not any(h.startswith("Access-Control-") for h in headers), headers
    assert closed["post"][0] == 201

    opened = asyncio.run(scenario([studio]))
    for path in ("/whip", "/whep", "/whip/some-session", "/whep/some-session"):
        status, headers = opened[path]
        assert status == 204 and headers["Access-Control-Allow-Origin"] == studio, (path, headers)
        assert "POST" in headers["Access-Control-Allow-Methods"] and "DELETE" in headers["Access-Control-Allow-Methods"]
        assert {"authorization", "content-type"} <= {
            h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
        assert headers["Vary"] == "Origin"
    assert "Access-Control-Allow-Origin" not in opened["evil"][1]
    status, headers = opened["post"]
    assert status == 201 and headers["Access-Control-Allow-Origin"] == studio
    assert headers["Access-Control-Expose-Headers"] == "Location"
    # A refusal is readable by the allowed page too, so that it can say why.
    assert opened["refused"][0] == 401 and opened["refused"][1]["Access-Control-Allow-Origin"] == studio
