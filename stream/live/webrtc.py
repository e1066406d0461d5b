"""WebRTC in and out with aiortc: a WHIP endpoint whose publisher gets the swapped video back, and a
WHEP endpoint for viewers of it (the view page, an OBS Browser Source).

`POST /whip` with an SDP offer (Content-Type application/sdp) answers `201 Created` with the SDP
answer and a `Location` for the session; `DELETE` on that location ends it (WHIP, RFC 9725). The
publisher's video comes back swapped on the same peer connection, so one page (or OBS 30+ with a
player) both publishes and previews.

aiortc's receive queue is unbounded: a swap slower than the camera would build up delay without
limit. The consumer therefore always takes the newest frame and drops the older ones, counting them.
What becomes of the video is the publisher's media (`PublisherMedia`): in `swapstream serve`, a
stream of the multi-stream runtime (`runtime.rtc`), with the API's streams, whose own threads and
device do the work, so that the event loop keeps serving ICE and RTP.

Audio is not swapped: the publisher's decoded audio frames go back out (Opus) on the publisher's
connection and to every WHEP viewer, through small drop-oldest relays of our own, each sender with
its own copy of the frame. (aiortc's MediaRelay hands one frame object to every subscriber; two
encoder threads converting one frame at once hung in PyAV here, see `video_copies`.) aiortc's RTCP sender reports map RTP time to the time a
packet is *sent*, so a receiver lines audio and video up by send time: audio sent as soon as it
arrives would play ahead of the video by the swap's delay. Each audio frame is therefore held back
by the video's measured delay: the swap stage. (aiortc's jitter buffers would add a frame interval
to the video and 80 ms to the audio: `live.rtp` replaces both with buffers that hand each frame over
once it is complete, and where it cannot, the hold counts them.)
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCIceServer
from aiortc.mediastreams import MediaStreamError

from ..config import WebRtcConfig
from ..errors import ConfigError, SwapStreamError
from ..queues import DropOldestQueue
from .rtp import fast_h264, prompt_frames

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"

Deliver = Callable[[np.ndarray, "int | None", "Fraction | None", "float | None"], None]
"""How a publisher's media hands over each processed picture, from any thread: the picture on the
host, RGB (height, width, 3) or NV12 (height * 3/2, width, as the GPU path makes it), its pts and
time base, and when the frame was received (`time.monotonic()`; None where not known)."""


class PublisherMedia(Protocol):
    """What becomes of one WHIP publisher's video: the server's half of the session (negotiation,
    tracks, audio) drives it; `swapstream serve` makes it a runtime stream (`runtime.rtc`)."""

    def prepare(self, pc: Any) -> None:
        """Before the offer is applied: set up the connection's video receiver (the GPU path puts
        H.264 first and sends its access units to NVDEC)."""

    async def start(self) -> None:
        """Start processing, before the answer goes out (frames come once the connection is up).
        A `SwapStreamError` refuses the offer with its message (and its `status`, default 503)."""

    def push(self, frame: Any) -> None:
        """One received video frame (aiortc's `av.VideoFrame`), in arrival order."""

    def end(self) -> None:
        """The publisher's video track ended: what was pushed is finished, then the media ends."""

    @property
    def faces(self) -> int:
        """Faces swapped so far."""

    @property
    def dropped(self) -> int:
        """Frames it dropped so far because its processing fell behind the publisher."""

    async def close(self) -> None:
        """The session is over: stop and release everything (safe to call more than once)."""


@dataclass(frozen=True)
class PublisherLink:
    """What the server gives each publisher's media: its session id, where processed pictures go,
    and whom to tell when the media ends by itself (a failure, or removal through the stream API)."""

    sid: str
    deliver: Deliver
    ended: Callable[[], None]


MediaFactory = Callable[[PublisherLink], PublisherMedia]
"""Makes the media of one new publisher."""


class SessionRelay(Protocol):
    """Where sessions live when not in this server (`serve --workers N`: `runtime.whip_relay`)."""

    def sessions(self, kind: str) -> int:
        """Sessions of `kind` ("WHIP" or "WHEP") that are up or being set up."""

    async def offer(self, kind: str, sdp: str) -> tuple[int, str, str | None]:
        """A checked offer: (status, the answer SDP or an error text, the session's id on 201)."""

    async def delete(self, kind: str, sid: str) -> int:
        """End a session; the HTTP status (404: no such session)."""

AUDIO_HOLD_MAX_S = 0.8
"""The most audio is held back to wait for the video; a swap slower than this is not live anyway."""
AUDIO_LINE_FRAMES = 75
"""Audio frames waiting to be released: 1.5 s of aiortc's 20 ms Opus frames, the longest hold and
0.7 s for a stalled event loop. (At 1 s, a loaded machine dropped some.)"""
AUDIO_OUT_FRAMES = 5
"""Released audio frames waiting for one sender: 100 ms. A sender that does not read (a publisher
that only sends) must not make them pile up."""
AIORTC_AUDIO_PREFETCH_S = 0.08
"""aiortc's audio jitter buffer releases a frame only once 4 more packets are in: 80 ms at Opus's
20 ms. (Its video buffer releases a frame when the next frame's first packet comes: one frame
interval, measured per session.) Both are part of how late each medium reaches us, unless
`live.rtp` replaced the buffers; a player (the benchmark's, the tests') keeps its own."""
DELAY_SMOOTHING = 0.2
"""Weight of the newest measurement in the video delay's moving average: follows a change within
about five frames, while one slow frame moves the audio by a fifth of its excess."""

LATENCY_SAMPLES = 1800
"""Swap-stage latencies a session keeps: its last minute at 30 fps, enough for a median and a p99,
while a session that runs for hours holds no more."""

ICE_SERVERS_META = '<meta name="swapstream-ice-servers" content="[]">'
"""The line of the pages that carries the ICE servers their RTCPeerConnection uses: none as the
file stands; the server writes `webrtc.ice_servers` into it when it serves a page."""
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
"""--host values that listen on every address of the machine."""

class RelayTrack(MediaStreamTrack):
    """An outgoing track fed with `put`: the newest `capacity` frames wait, older ones are dropped.

    Video uses a capacity of 1 (always the newest swapped frame); audio a few frames, so that the
    sender's Opus encoder gets a continuous signal without a backlog building up.
    """

    def __init__(self, kind: str, capacity: int) -> None:
        super().__init__()
        self.kind = kind
        self._frames: DropOldestQueue[Any] = DropOldestQueue(capacity, name=f"{kind} out")

    @property
    def dropped(self) -> int:
        return self._frames.dropped

    def put(self, frame: Any) -> None:
        self._frames.put(frame)

    async def recv(self) -> Any:
        if self.readyState != "live":
            raise MediaStreamError
        return await self._frames.get()


@dataclass
class Session:
    """One WHIP publisher or WHEP viewer, with what its media did."""

    pc: Any
    sid: str = ""
    """Its id: the last part of its Location."""
    media: PublisherMedia | None = None
    """This publisher's media (from `WhipServer.media`); None for a viewer."""
    out: RelayTrack = field(default_factory=lambda: RelayTrack("video", 1))
    """The swapped video going out to this peer."""
    audio_out: RelayTrack = field(default_factory=lambda: RelayTrack("audio", AUDIO_OUT_FRAMES))
    """The publisher's audio going out to this peer, held back to meet the video."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    """Video frames skipped in aiortc's receive queue because a newer one was waiting (the event
    loop fell behind); those the media dropped are its own `dropped`."""
    max_backlog: int = 0
    """Most video frames found waiting in aiortc's receive queue at once."""
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    """Per processed frame, the newest `LATENCY_SAMPLES`: received (taken from aiortc's receive
    queue, or its access unit diverted to our decoder) -> handed to the outgoing tracks."""
    video_delay_s: float = 0.0
    """Moving average of `latency_ms`, in seconds."""
    in_interval_s: float = 0.0
    """Moving average of the publisher's frame interval (from the frames' timestamps). aiortc's own
    jitter buffer hands a video frame over only when the next one starts arriving: without
    "video" in `prompt` the video reaches the swap this much after it was sent."""
    prompt: set[str] = field(default_factory=set)
    """The kinds ("audio", "video") whose receiver hands each frame over once it is complete
    (`live.rtp`), not one frame interval (video) or 80 ms (audio) later."""
    audio_frames_in: int = 0
    audio_frames_out: int = 0
    audio_line: DropOldestQueue[tuple[float, Any]] = field(
        default_factory=lambda: DropOldestQueue(AUDIO_LINE_FRAMES, name="audio line"))
    """Received audio frames with their arrival time, waiting for their release time."""
    connect_timer: asyncio.TimerHandle | None = None
    """Drops the session unless its connection is up by `webrtc.connect_timeout_s` after the answer."""

    @property
    def faces(self) -> int:
        """Faces swapped in this publisher's video so far."""
        return self.media.faces if self.media is not None else 0


def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` (serve's --host) reaches this machine only. Names other than
    localhost count as not: what they resolve to is not known here, and is not looked up."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def require_whip_token(host: str, token: str | None) -> None:
    """Refuse to serve WHIP/WHEP beyond loopback without a token: anyone who reached the port could
    publish faces through the server and watch what it sends."""
    if not token and not is_loopback_host(host):
        raise ConfigError(f"--host {host} is reachable from other machines, and /whip and /whep would be "
                          f"open to anyone there: give a token with --whip-token TOKEN (or "
                          f"SWAPSTREAM_WHIP_TOKEN), or listen on --host 127.0.0.1")


def host_name(value: str) -> str:
    """The name in a Host header or an allowed-hosts entry, without port, brackets or final dot,
    lower case: `[::1]:8080` -> `::1`, `LocalHost.:80` -> `localhost`."""
    name = value.strip().lower()
    if name.startswith("["):
        end = name.find("]")
        return name[1:end] if end > 0 else name
    if name.count(":") == 1:  # one colon: name:port; more: a bare IPv6 address
        name = name.split(":", 1)[0]
    return name.rstrip(".")


def own_addresses() -> set[str]:
    """Every address of this machine's interfaces (read from the interfaces, no lookup): the Host
    a client on the network names a server listening on all addresses by."""
    import ifaddr  # aioice's dependency: aiortc gathers its ICE host candidates with it

    found: set[str] = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            found.add(ip.ip if isinstance(ip.ip, str) else ip.ip[0])
    return {host_name(a) for a in found}


def count_m_sections(sdp: str) -> int:
    """The media sections of an SDP (lines that start with `m=`), without parsing it."""
    return sdp.count("\nm=") + sdp.startswith("m=")


async def read_limited(request: Any, limit: int) -> bytes | None:
    """The request's body, or None as soon as more than `limit` bytes have come (the rest unread):
    the Content-Length, when there is one, was checked, but a chunked body has none."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def first_codec(sdp: str, kind: str = "video") -> str | None:
    """The encoding name (e.g. 'H264') of the first payload type of the SDP's `kind` m-line: in
    an answer, the codec the sender will use. None when the SDP has no such line."""
    lines = sdp.splitlines()
    m = next((line.split() for line in lines if line.startswith(f"m={kind}")), [])
    if len(m) < 4:
        return None
    rtpmap = next((line for line in lines if line.startswith(f"a=rtpmap:{m[3]} ")), None)
    return rtpmap.split()[1].split("/")[0] if rtpmap else None


def newest(track: Any, first: Any) -> tuple[Any, int]:
    """The newest frame waiting in an aiortc remote track, and how many older ones were skipped.

    Reads aiortc's internal queue (`RemoteStreamTrack._queue`): there is no public way to ask a
    track for its backlog, and draining it is what keeps a live preview live. The end-of-track
    marker (None) is put back, so that the next `recv()` ends instead of waiting for ever.
    """
    frame, skipped = first, 0
    q = getattr(track, "_queue", None)
    while q is not None and not q.empty():
        nxt = q.get_nowait()
        if nxt is None:
            q.put_nowait(None)
            break
        frame = nxt
        skipped += 1
    return frame, skipped


def smooth(average: float, value: float, *, first: bool) -> float:
    """One step of the exponential moving average used for delays (`DELAY_SMOOTHING`)."""
    return value if first else (1 - DELAY_SMOOTHING) * average + DELAY_SMOOTHING * value


def video_copies(picture: np.ndarray, pts: int | None, time_base: Fraction | None,
                 n: int) -> list[Any]:
    """`n` separate yuv420p frames of one swapped picture (RGB, or NV12 as a 2-D array), one for
    each outgoing track.

    aiortc's encoders run in executor threads and convert and mark the frame they get
    (`frame.reformat`, `frame.pict_type`): PyAV keeps the converter on the frame, so two encoders
    converting one shared frame at once hung in `reformat` here. Converting once and giving each
    sender its own copy is one memcpy per viewer.
    """
    import av

    if picture.ndim == 2:  # NV12 from the GPU: only the chroma is de-interleaved
        src = av.VideoFrame.from_ndarray(np.ascontiguousarray(picture), format="nv12")
    else:
        h, w = picture.shape[0] & ~1, picture.shape[1] & ~1  # 4:2:0 needs even sizes
        src = av.VideoFrame.from_ndarray(np.ascontiguousarray(picture[:h, :w]), format="rgb24")
    yuv = src.reformat(format="yuv420p").to_ndarray()
    frames = []
    for _ in range(n):
        f = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
        f.pts = pts
        f.time_base = time_base or Fraction(1, 90000)
        frames.append(f)
    return frames


def audio_copy(frame: Any) -> Any:
    """A separate copy of a decoded audio frame, for another sender's encoder (see `video_copies`)."""
    import av

    f = av.AudioFrame.from_ndarray(frame.to_ndarray(), format=frame.format.name,
                                   layout=frame.layout.name)
    f.sample_rate, f.pts, f.time_base = frame.sample_rate, frame.pts, frame.time_base
    return f


class WhipServer:
    """An aiohttp application with the WHIP endpoint. `media` makes what becomes of each publisher's
    video (`swapstream serve`: a runtime stream, `runtime.rtc.RuntimePublishers`)."""

    def __init__(self, media: MediaFactory | None, *, token: str | None = None, max_sessions: int = 16,
                 settings: WebRtcConfig | None = None, host: str | None = None,
                 relay: SessionRelay | None = None) -> None:
        """`token`: when given, POST and DELETE on /whip and /whep need `Authorization: Bearer
        TOKEN` (OBS's WHIP "Bearer Token" field); the preview pages send the one in their URL's
        `?token=`. `max_sessions`: publishers, and separately viewers, beyond
        this are answered 503, since each costs an encoder thread and a decoder. `settings`: the
        config's `webrtc` section (ICE servers, allowed Host names and origins, offer limits);
        `host`: the address served on, whose name requests may carry in their Host header too.
        `relay`: instead of `media`, where sessions live elsewhere (`serve --workers N`: in the
        workers, `runtime.whip_relay`); this server checks each offer and hands it over."""
        from aiohttp import web

        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.token = token
        self.max_sessions = max_sessions
        self.settings = settings if settings is not None else WebRtcConfig()
        self.allowed_hosts = self._allowed_hosts(self.settings.allowed_hosts, host)
        """Host header names (`host_name`) that /whip and /whep answer to."""
        if (media is None) == (relay is None):
            raise ValueError("give either media (sessions here) or relay (sessions elsewhere)")
        self.media = media
        self.relay = relay
        self.sessions: dict[str, Session] = {}
        self.viewers: dict[str, Session] = {}
        """WHEP viewers: each gets the newest swapped frame of any publisher."""
        self.opening: dict[str, int] = {"WHIP": 0, "WHEP": 0}
        """Offers of each kind past the session-cap check and not yet answered: they count against
        the cap while they negotiate, so that offers arriving together cannot all pass it."""
        self._background: set[asyncio.Task[Any]] = set()
        self.app = web.Application()
        for kind, post in (("whip", self._post), ("whep", self._post_whep)):
            self.app.router.add_post(f"/{kind}", self._guarded(post))
            self.app.router.add_delete(f"/{kind}/{{sid}}", self._guarded(self._delete))
            self.app.router.add_route("OPTIONS", f"/{kind}", self._guarded(self._options))
            self.app.router.add_route("OPTIONS", f"/{kind}/{{sid}}", self._guarded(self._options))
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/", self._page)
        self.app.router.add_get("/view", self._view_page)
        self.app.on_shutdown.append(self._shutdown)
        # Offers are parsed here first, off the event loop that serves every session and the API;
        # one thread, so that a burst of offers takes no more than one core from the swap.
        self._sdp_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sdp")

    @staticmethod
    def _allowed_hosts(configured: Iterable[str], host: str | None) -> frozenset[str]:
        names = {host_name(h) for h in configured}
        if host is not None:
            names.add(host_name(host))
            if host_name(host) in WILDCARD_HOSTS:
                # Listening everywhere, the server is named by any of its addresses; an address is
                # never a rebound name, so this opens nothing to DNS rebinding.
                names |= own_addresses()
        return frozenset(names - set(WILDCARD_HOSTS))

    def _serve_page(self, name: str) -> Any:
        from aiohttp import web

        page = (STATIC / name).read_text()
        if ICE_SERVERS_META not in page:  # the page would quietly fall back to no ICE servers
            raise RuntimeError(f"{name} lacks its ICE servers line {ICE_SERVERS_META}")
        servers = html.escape(json.dumps(self.settings.ice_servers), quote=True)
        page = page.replace(ICE_SERVERS_META, ICE_SERVERS_META.replace('"[]"', f'"{servers}"'))
        return web.Response(text=page, content_type="text/html")

    async def _page(self, request: Any) -> Any:
        """The preview page: publishes the browser's camera over WHIP and plays the swapped video."""
        return self._serve_page("index.html")

    async def _view_page(self, request: Any) -> Any:
        """View-only page (WHEP), e.g. for an OBS Browser Source."""
        return self._serve_page("view.html")

    def _guarded(self, handler: Callable[[Any], Coroutine[Any, Any, Any]]) -> Callable[[Any], Coroutine[Any, Any, Any]]:
        """`handler` behind the Host check, with the CORS headers of an allowed Origin added to what
        it answers."""

        async def guarded(request: Any) -> Any:
            refused = self._misdirected(request)
            if refused is not None:
                return refused
            return self._cors(request, await handler(request))

        return guarded

    def _misdirected(self, request: Any) -> Any:
        """None when the Host header names this server; else the 421 to answer. A page the browser
        got from an attacker's name that now resolves to us (DNS rebinding) sends that name."""
        from aiohttp import web

        given = request.headers.get("Host")
        if given is not None and host_name(given) in self.allowed_hosts:
            return None
        # repr: the header may hold undecodable bytes (as surrogates), which text= cannot encode.
        return web.Response(status=421, text=f"Host {given!r} is not a name of this server: if it is, add "
                                             f"it to webrtc.allowed_hosts (--set 'webrtc.allowed_hosts=[...]')\n")

    def _cors(self, request: Any, response: Any) -> Any:
        """CORS headers for an Origin in `webrtc.cors_origins`; none otherwise (the pages are
        same-origin), so a foreign page's browser refuses to send or read."""
        if not self.settings.cors_origins:
            return response
        response.headers["Vary"] = "Origin"  # the answer differs by Origin: caches must keep it apart
        origin = request.headers.get("Origin")
        if origin not in self.settings.cors_origins:
            return response
        response.headers["Access-Control-Allow-Origin"] = origin
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Methods"] = "POST, DELETE, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
            response.headers["Access-Control-Max-Age"] = "600"
        else:
            response.headers["Access-Control-Expose-Headers"] = "Location"
        return response

    async def _options(self, request: Any) -> Any:
        """OPTIONS (RFC 9725 section 4.1): what the endpoint takes, and the CORS preflight. Needs no
        token: browsers send a preflight without credentials."""
        from aiohttp import web

        headers = {"Allow": "POST, OPTIONS" if "sid" not in request.match_info else "DELETE, OPTIONS"}
        if "sid" not in request.match_info:
            headers["Accept-Post"] = "application/sdp"
        return web.Response(status=204, headers=headers)

    def _rtc_configuration(self) -> RTCConfiguration:
        """The peer connection's configuration: the configured ICE servers only. aiortc's own default
        (no configuration) is Google's STUN server, contacted by every session."""
        return RTCConfiguration(iceServers=[RTCIceServer(urls=u) for u in self.settings.ice_servers])

    def _full(self, kind: str) -> Any:
        from aiohttp import web

        return web.Response(status=503, text=f"too many {kind} sessions ({self.max_sessions}): end one, "
                                             f"or start `swapstream serve` with a larger --max-sessions\n")

    async def _read_offer(self, request: Any, kind: str) -> str | web.Response:
        """The offer's SDP, checked cheaply (size, media sections) before anything parses it; else
        the response refusing it."""
        from aiohttp import web

        if request.content_type != "application/sdp":
            return web.Response(status=415, text=f"{kind} offers must be Content-Type: application/sdp\n")
        limit = self.settings.max_sdp_bytes
        too_large = web.Response(status=413, text=f"the offer is larger than {limit} bytes "
                                                  f"(webrtc.max_sdp_bytes)\n")
        # Answered without reading the rest, and not kept alive: aiohttp drops what still comes (for
        # at most its lingering time, 10 s) and closes.
        too_large.force_close()
        if request.content_length is not None and request.content_length > limit:
            return too_large
        try:
            body = await asyncio.wait_for(read_limited(request, limit), self.settings.connect_timeout_s)
        except asyncio.TimeoutError:
            response = web.Response(status=408, text=f"the offer did not arrive within "
                                                     f"{self.settings.connect_timeout_s:g} s\n")
            response.force_close()
            return response
        if body is None:
            return too_large
        try:
            sdp = body.decode("utf-8")
        except UnicodeDecodeError:
            return web.Response(status=400, text="the offer is not UTF-8 text\n")
        sections = count_m_sections(sdp)
        if sections > self.settings.max_m_sections:
            return web.Response(status=400, text=f"the offer has {sections} media sections, more than "
                                                 f"{self.settings.max_m_sections} (webrtc.max_m_sections)\n")
        candidates = sdp.count("a=candidate:")
        if candidates > self.settings.max_candidates:
            return web.Response(status=400, text=f"the offer has {candidates} ICE candidates, more than "
                                                 f"{self.settings.max_candidates} (webrtc.max_candidates)\n")
        if "m=video" not in sdp:
            return web.Response(status=400, text="the offer has no video section\n")
        return sdp

    async def _negotiate(self, request: Any, kind: str, sessions: dict[str, Session], *,
                         before: Callable[[Any, Session], None] | None = None,
                         after: Callable[[Any, Session], None] | None = None) -> Any:
        """The WHIP/WHEP exchange: check the offer, build a peer connection, answer 201 with a
        Location, and drop the session when the connection ends, or when it is not up within
        `webrtc.connect_timeout_s`. `before` runs before the offer is applied (to catch the "track"
        event it fires), `after` once its transceivers exist."""
        from aiohttp import web
        from aiortc import RTCPeerConnection, RTCSessionDescription
        from aiortc.sdp import SessionDescription

        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        if self._count(kind, sessions) + self.opening[kind] >= self.max_sessions:
            return self._full(kind)  # early, before reading the offer: the check that counts is below
        sdp = await self._read_offer(request, kind)
        if not isinstance(sdp, str):
            return sdp
        # Checked and counted with no await in between: every offer that passes holds a slot until
        # it is answered (then the session holds it) or refused.
        if self._count(kind, sessions) + self.opening[kind] >= self.max_sessions:
            return self._full(kind)
        self.opening[kind] += 1
        try:
            loop = asyncio.get_running_loop()
            try:
                # The limits bound what aiortc parses again on the loop; this parse, in a thread,
                # refuses what it cannot take before a connection is built.
                await loop.run_in_executor(self._sdp_pool, SessionDescription.parse, sdp)
            except Exception as e:  # aiortc's parser asserts and raises ValueError and others
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                return web.Response(status=400, text=f"cannot parse this offer ({why})\n")
            if self.relay is not None:
                return await self._relayed(kind, sdp)
            pc = RTCPeerConnection(self._rtc_configuration())
            sid = uuid.uuid4().hex
            session = Session(pc=pc, sid=sid)
            try:
                if before is not None:
                    before(pc, session)
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
                if after is not None:
                    after(pc, session)
                await pc.setLocalDescription(await pc.createAnswer())
                if first_codec(pc.localDescription.sdp) == "H264":
                    # x264's default preset costs 8 ms more a 720p frame than the one it gets here.
                    for t in pc.getTransceivers():
                        if t.kind == "video":
                            fast_h264(t.sender)
                if session.media is not None:
                    # The publisher's stream starts before the answer goes out, so that one the
                    # runtime cannot take is refused with its reason (503), not answered and dropped.
                    try:
                        await session.media.start()
                    except SwapStreamError as e:
                        await self._close_session(session)
                        return web.Response(status=getattr(e, "status", 503), text=f"{e}\n")
            except asyncio.CancelledError:
                self._spawn(self._close_session(session))  # the client left: it ends without us
                raise
            except Exception as e:  # aiortc raises ValueError and others for offers it cannot take
                await self._close_session(session)
                return web.Response(status=400, text=f"cannot use this offer: {e}\n")

            @pc.on("connectionstatechange")
            async def on_state() -> None:
                if pc.connectionState == "connected" and session.connect_timer is not None:
                    session.connect_timer.cancel()
                elif pc.connectionState in ("failed", "closed"):
                    await self._drop(sessions, sid)

            sessions[sid] = session
            session.connect_timer = loop.call_later(self.settings.connect_timeout_s, self._expire,
                                                    sessions, sid, kind)
            return web.Response(status=201, text=pc.localDescription.sdp, content_type="application/sdp",
                                headers={"Location": f"/{kind.lower()}/{sid}"})
        finally:
            self.opening[kind] -= 1

    def _count(self, kind: str, sessions: dict[str, Session]) -> int:
        """Sessions of `kind` that hold a slot: here, or in the relay's workers."""
        return self.relay.sessions(kind) if self.relay is not None else len(sessions)

    async def _relayed(self, kind: str, sdp: str) -> Any:
        """A checked offer, answered by the relay's worker: its status and answer go back as they
        are, with this server's Location for the session."""
        from aiohttp import web

        assert self.relay is not None
        status, body, sid = await self.relay.offer(kind, sdp)
        if status != 201 or sid is None:
            return web.Response(status=status, text=body)
        return web.Response(status=201, text=body, content_type="application/sdp",
                            headers={"Location": f"/{kind.lower()}/{sid}"})

    def _expire(self, sessions: dict[str, Session], sid: str, kind: str) -> None:
        """The connect timeout: a session whose connection is not up is dropped, so that offers
        never followed by ICE and DTLS do not hold slots for aiortc's own timeouts (a minute)."""
        s = sessions.get(sid)
        if s is not None and s.pc.connectionState != "connected":
            log.warning("%s session %s not connected after %g s (state %s): dropped", kind, sid,
                        self.settings.connect_timeout_s, s.pc.connectionState)
            self._spawn(self._drop(sessions, sid))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` on its own, kept referenced until it ends (the loop holds tasks weakly)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _post_whep(self, request: Any) -> Any:
        """WHEP: a viewer's recvonly offer gets the swapped video (and the audio) of the current
        publisher."""

        def prepare(pc: Any, viewer: Session) -> None:
            for t in pc.getTransceivers():
                t.sender.replaceTrack(viewer.out if t.kind == "video" else viewer.audio_out)
                t.direction = "sendonly"

        return await self._negotiate(request, "WHEP", self.viewers, after=prepare)

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ok": True, "sessions": self._count("WHIP", self.sessions)})

    async def _post(self, request: Any) -> Any:
        """WHIP: a publisher's offer; its video comes back swapped on the same connection, its
        audio as it was, in step with the video."""

        def prepare(pc: Any, session: Session) -> None:
            assert self.media is not None  # no relay: sessions are here
            sid = session.sid
            session.media = self.media(PublisherLink(sid, self._deliverer(session),
                                                     lambda: self._spawn(self._drop(self.sessions, sid))))
            session.media.prepare(pc)

            @pc.on("track")
            def on_track(track: Any) -> None:
                receiver = next((t.receiver for t in pc.getTransceivers() if t.receiver.track is track), None)
                if receiver is not None and prompt_frames(receiver, track.kind):
                    session.prompt.add(track.kind)
                if track.kind == "video":
                    pc.addTrack(session.out)
                    session.tasks.append(asyncio.ensure_future(self._consume(session, track)))
                elif track.kind == "audio":
                    pc.addTrack(session.audio_out)
                    session.tasks.append(asyncio.ensure_future(self._consume_audio(session, track)))
                    session.tasks.append(asyncio.ensure_future(self._release_audio(session)))

        return await self._negotiate(request, "WHIP", self.sessions, before=prepare)

    async def _consume(self, s: Session, track: Any) -> None:
        """Hand each received video frame to the publisher's media. aiortc's receive queue is
        unbounded: frames are taken as they come, and the media's own bounded queues drop."""
        assert s.media is not None  # made, and started, before the answer went out
        last_pts: int | None = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                s.media.end()
                return
            frame, skipped = newest(track, frame)
            s.frames_in += 1 + skipped
            s.dropped += skipped
            s.max_backlog = max(s.max_backlog, skipped)
            if last_pts is not None and frame.pts is not None and frame.time_base:
                gap = float((frame.pts - last_pts) * frame.time_base) / (1 + skipped)
                if 0 < gap < 1:  # a gap of a second or more is a pause, not the frame rate
                    s.in_interval_s = smooth(s.in_interval_s, gap, first=s.in_interval_s == 0)
            last_pts = frame.pts
            s.media.push(frame)

    def _deliverer(self, s: Session) -> Deliver:
        """The `Deliver` of publisher `s`: in the caller's thread each peer's frame is made
        (`video_copies`); the loop then hands them to the outgoing tracks and notes the delay."""
        loop = asyncio.get_running_loop()

        def hand_out(peers: list[Session], frames: list[Any], received: float | None) -> None:
            for peer, out in zip(peers, frames):
                peer.out.put(out)
            s.frames_out += 1
            if received is not None:
                delay = max(0.0, time.monotonic() - received)
                s.latency_ms.append(delay * 1e3)
                s.video_delay_s = smooth(s.video_delay_s, delay, first=len(s.latency_ms) == 1)

        def deliver(picture: np.ndarray, pts: int | None, time_base: Fraction | None,
                    received: float | None) -> None:
            peers = [s] + list(self.viewers.values())
            frames = video_copies(picture, pts, time_base, len(peers))
            try:
                loop.call_soon_threadsafe(hand_out, peers, frames, received)
            except RuntimeError:  # the server's loop has closed: nobody to send to
                pass

        return deliver

    async def _consume_audio(self, s: Session, track: Any) -> None:
        """Take every received audio frame at once (aiortc's queue is unbounded too), noting when
        it came; `_release_audio` sends it on when the video has caught up."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            s.audio_frames_in += 1
            s.audio_line.put((loop.time(), frame))

    async def _release_audio(self, s: Session) -> None:
        loop = asyncio.get_running_loop()
        while True:
            arrived, frame = await s.audio_line.get()
            # Held for the video's current delay, so that both leave as far apart as they came.
            # Frames leave in arrival order even when the delay shrinks.
            video_late = s.video_delay_s + (0.0 if "video" in s.prompt else s.in_interval_s)
            audio_late = 0.0 if "audio" in s.prompt else AIORTC_AUDIO_PREFETCH_S
            hold = min(video_late, AUDIO_HOLD_MAX_S) - audio_late
            wait = arrived + hold - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            s.audio_out.put(frame)
            for v in list(self.viewers.values()):
                v.audio_out.put(audio_copy(frame))
            s.audio_frames_out += 1

    async def _delete(self, request: Any) -> Any:
        """DELETE on a session's Location: ends it."""
        from aiohttp import web

        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        sid = request.match_info["sid"]
        sessions = self.viewers if "/whep/" in request.path else self.sessions  # under a prefix in a worker
        if self.relay is not None:
            status = await self.relay.delete("WHEP" if sessions is self.viewers else "WHIP", sid)
            return web.Response(status=status, text="no such session\n" if status == 404 else "")
        if sid not in sessions:
            return web.Response(status=404, text="no such session\n")
        await self._drop(sessions, sid)
        return web.Response(status=200)

    def _unauthorised(self, request: Any) -> Any:
        """None when the request may go on; else the 401 to answer (constant-time comparison)."""
        if self.token is None:
            return None
        from aiohttp import web

        from .auth import bearer_refusal

        why = bearer_refusal(request.headers.get("Authorization", ""), self.token)
        if why is None:
            return None
        return web.Response(status=401, text=f"{why} (Authorization: Bearer ..., OBS: the WHIP Bearer Token)\n",
                            headers={"WWW-Authenticate": 'Bearer realm="whip"'})

    async def _drop(self, sessions: dict[str, Session], sid: str) -> None:
        s = sessions.pop(sid, None)
        if s is None:
            return
        if s.connect_timer is not None:
            s.connect_timer.cancel()
        for task in s.tasks:
            task.cancel()
        await self._close_session(s)

    @staticmethod
    async def _close_session(s: Session) -> None:
        """Close a session's media (its runtime stream) and its connection."""
        try:
            if s.media is not None:
                await s.media.close()
        finally:
            await s.pc.close()

    async def _shutdown(self, app: Any) -> None:
        for sessions in (self.sessions, self.viewers):
            for sid in list(sessions):
                await self._drop(sessions, sid)
        self._sdp_pool.shutdown(wait=False)
