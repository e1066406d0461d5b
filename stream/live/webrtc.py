"""WebRTC in and out with aiortc: a WHIP endpoint whose publisher gets the swapped video back, and a
WHEP endpoint for viewers of it (the view page, an OBS Browser Source).

`POST /whip` with an SDP offer (Content-Type application/sdp) answers `201 Created` with the SDP
answer and a `Location` for the session; `DELETE` on that location ends it (WHIP, RFC 9725). The
publisher's video comes back swapped on the same peer connection, so one page (or OBS 30+ with a
player) both publishes and previews.

aiortc's receive queue is unbounded: a swap slower than the camera would build up delay without
limit. The consumer therefore always takes the newest frame and drops the older ones, counting them.
The swap itself runs in a worker thread so that the event loop keeps serving ICE and RTP.

Audio is not swapped: the publisher's decoded audio frames go back out (Opus) on the publisher's
connection and to every WHEP viewer, through small drop-oldest relays of our own, each sender with
its own copy of the frame. (aiortc's MediaRelay hands one frame object to every subscriber; two
encoder threads converting one frame at once hung in PyAV here, see `video_copies`.) aiortc's RTCP sender reports map RTP time to the time a
packet is *sent*, so a receiver lines audio and video up by send time: audio sent as soon as it
arrives would play ahead of the video by the swap's delay. Each audio frame is therefore held back
by the video's measured delay: the swap stage, plus the frame interval aiortc's video jitter buffer
adds, less the 80 ms its audio jitter buffer adds.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from ..runtime.queues import DropOldestQueue

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"

SwapFn = Callable[[np.ndarray, int], int]
"""Swaps faces in an RGB frame in place; gets the frame's index; returns faces swapped."""
FrameSwapFn = Callable[[Any, int], tuple[np.ndarray, int]]
"""Swaps faces in a received frame (aiortc's, or whatever a diverted decoder delivers) given its
index; returns the swapped picture on the host, RGB (height, width, 3) or NV12 (height * 3/2,
width, as the GPU path makes it), and the faces swapped."""
PeerHook = Callable[[Any], Any]
"""Called with a publisher's RTCPeerConnection before its offer is applied (what it returns is
the caller's own: the server ignores it)."""
SessionSwapFactory = Callable[[], FrameSwapFn]
"""Makes the frame swap of one new publisher: a tracker of its own, so that the faces of two
publishers never share tracks or landmark smoothing."""

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
interval, measured per session.) Both are part of how late each medium reaches us."""
DELAY_SMOOTHING = 0.2
"""Weight of the newest measurement in the video delay's moving average: follows a change within
about five frames, while one slow frame moves the audio by a fifth of its excess."""

LATENCY_SAMPLES = 1800
"""Swap-stage latencies a session keeps: its last minute at 30 fps, enough for a median and a p99,
while a session that runs for hours holds no more."""

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
    swap: FrameSwapFn | None = None
    """This publisher's frame swap (from `WhipServer.session_swap`); None for a viewer."""
    out: RelayTrack = field(default_factory=lambda: RelayTrack("video", 1))
    """The swapped video going out to this peer."""
    audio_out: RelayTrack = field(default_factory=lambda: RelayTrack("audio", AUDIO_OUT_FRAMES))
    """The publisher's audio going out to this peer, held back to meet the video."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    """Video frames skipped because a newer one was waiting (the swap fell behind)."""
    max_backlog: int = 0
    """Most video frames found waiting in aiortc's receive queue at once."""
    faces: int = 0
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    """Per swapped frame, the newest `LATENCY_SAMPLES`: taken from the receive queue -> handed to
    the outgoing tracks."""
    video_delay_s: float = 0.0
    """Moving average of `latency_ms`, in seconds."""
    in_interval_s: float = 0.0
    """Moving average of the publisher's frame interval (from the frames' timestamps). aiortc hands
    a video frame over only when the next one starts arriving: the video reaches the swap this much
    after it was sent."""
    audio_frames_in: int = 0
    audio_frames_out: int = 0
    audio_line: DropOldestQueue[tuple[float, Any]] = field(
        default_factory=lambda: DropOldestQueue(AUDIO_LINE_FRAMES, name="audio line"))
    """Received audio frames with their arrival time, waiting for their release time."""


def first_codec(sdp: str, kind: str = "video") -> str | None:
    """The encoding name (e.g. 'H264') of the first payload type of the SDP's `kind` m-line: in
    an answer, the codec the sender will use. None when the SDP has no such line."""
    lines = sdp.splitlines()
    m = next((line.split() for line in lines if line.startswith(f"m={kind}")), [])
    if len(m) < 4:
        return None
    rtpmap = next((line for line in lines if line.startswith(f"a=rtpmap:{m[3]} ")), None)
    return rtpmap.split()[1].split("/")[0] if rtpmap else None


def _rgb_frame_swap(swap: SwapFn) -> FrameSwapFn:
    """A `FrameSwapFn` over a `SwapFn`: the received frame as RGB, swapped in place."""

    def frame_swap(frame: Any, index: int) -> tuple[np.ndarray, int]:
        rgb = np.ascontiguousarray(frame.to_ndarray(format="rgb24"))
        return rgb, swap(rgb, index)

    return frame_swap


def tracking_swap(job: Any, fps: float = 30.0) -> SessionSwapFactory:
    """Per-publisher frame swaps over one job (`FileJob`): each publisher gets a tracker of the
    job's analyser (`FaceAnalyser.tracker`: the same networks, its own tracks and smoothing), and
    the job's swapper, label and mark. An analyser without trackers (a zoo detector) is shared, as
    before. All run on the server's one swap thread, as trackers of one analyser must."""
    from ..types import Frame

    def make() -> FrameSwapFn:
        make_tracker = getattr(job.analyser, "tracker", None)
        analyser = make_tracker() if make_tracker is not None else job.analyser

        def swap(rgb: np.ndarray, index: int) -> int:
            faces = analyser.track(Frame(rgb, pts=index, time_base=Fraction(1, round(fps)), index=index))
            return int(job.swap_faces(rgb, faces))

        return _rgb_frame_swap(swap)

    return make


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
    """An aiohttp application with the WHIP endpoint. `swap` does the face work for each frame."""

    def __init__(self, swap: SwapFn | None = None, *, token: str | None = None, max_sessions: int = 16,
                 frame_swap: FrameSwapFn | None = None, on_publisher: PeerHook | None = None,
                 session_swap: SessionSwapFactory | None = None) -> None:
        """`token`: when given, POST and DELETE on /whip and /whep need `Authorization: Bearer
        TOKEN` (OBS's WHIP "Bearer Token" field); the preview pages send the one in their URL's
        `?token=`. `max_sessions`: publishers, and separately viewers, beyond
        this are answered 503, since each costs an encoder thread and a decoder. `frame_swap`
        replaces `swap` where frames need more than an RGB array (the GPU path); `on_publisher`
        prepares each publisher's connection (the GPU path prefers H.264 and routes it to NVDEC).
        `session_swap` makes a frame swap per publisher (`tracking_swap`), which `swapstream serve`
        uses: with one shared swap, two publishers' faces would share one tracker."""
        from aiohttp import web

        if sum(x is not None for x in (swap, frame_swap, session_swap)) != 1:
            raise ValueError("give exactly one of swap, frame_swap and session_swap")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.token = token
        self.max_sessions = max_sessions
        # Every form is a factory of per-publisher frame swaps; a shared one is the same each time.
        if session_swap is None:
            shared: FrameSwapFn = frame_swap if frame_swap is not None else _rgb_frame_swap(swap)  # type: ignore[arg-type]
            session_swap = lambda: shared  # noqa: E731 - the one shared swap
        self.session_swap: SessionSwapFactory = session_swap
        self.on_publisher = on_publisher
        self.sessions: dict[str, Session] = {}
        self.viewers: dict[str, Session] = {}
        """WHEP viewers: each gets the newest swapped frame of any publisher."""
        self.app = web.Application()
        self.app.router.add_post("/whip", self._post)
        self.app.router.add_delete("/whip/{sid}", self._delete)
        self.app.router.add_post("/whep", self._post_whep)
        self.app.router.add_delete("/whep/{sid}", self._delete)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/", self._page)
        self.app.router.add_get("/view", self._view_page)
        self.app.on_shutdown.append(self._shutdown)
        # One worker: frames of all sessions are swapped in order, never concurrently on one model.
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swap")

    async def _page(self, request: Any) -> Any:
        """The preview page: publishes the browser's camera over WHIP and plays the swapped video."""
        from aiohttp import web

        return web.Response(text=(STATIC / "index.html").read_text(), content_type="text/html")

    async def _view_page(self, request: Any) -> Any:
        """View-only page (WHEP), e.g. for an OBS Browser Source."""
        from aiohttp import web

        return web.Response(text=(STATIC / "view.html").read_text(), content_type="text/html")

    async def _negotiate(self, request: Any, kind: str, sessions: dict[str, Session], *,
                         before: Callable[[Any, Session], None] | None = None,
                         after: Callable[[Any, Session], None] | None = None) -> Any:
        """The WHIP/WHEP exchange: check the offer, build a peer connection, answer 201 with a
        Location, and drop the session when the connection ends. `before` runs before the offer is
        applied (to catch the "track" event it fires), `after` once its transceivers exist."""
        from aiohttp import web
        from aiortc import RTCPeerConnection, RTCSessionDescription

        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        if len(sessions) >= self.max_sessions:
            return web.Response(status=503, text=f"too many {kind} sessions ({self.max_sessions}): end one, "
                                                 f"or start `swapstream serve` with a larger --max-sessions\n")
        if request.content_type != "application/sdp":
            return web.Response(status=415, text=f"{kind} offers must be Content-Type: application/sdp\n")
        sdp = await request.text()
        if "m=video" not in sdp:
            return web.Response(status=400, text="the offer has no video section\n")
        pc = RTCPeerConnection()
        session = Session(pc=pc)
        sid = uuid.uuid4().hex
        if before is not None:
            before(pc, session)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            if after is not None:
                after(pc, session)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as e:  # aiortc raises ValueError and others for offers it cannot take
            await pc.close()
            return web.Response(status=400, text=f"cannot use this offer: {e}\n")

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self._drop(sessions, sid)

        sessions[sid] = session
        return web.Response(status=201, text=pc.localDescription.sdp, content_type="application/sdp",
                            headers={"Location": f"/{kind.lower()}/{sid}"})

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

        return web.json_response({"ok": True, "sessions": len(self.sessions)})

    async def _post(self, request: Any) -> Any:
        """WHIP: a publisher's offer; its video comes back swapped on the same connection, its
        audio as it was, in step with the video."""

        def prepare(pc: Any, session: Session) -> None:
            if self.on_publisher is not None:
                self.on_publisher(pc)

            @pc.on("track")
            def on_track(track: Any) -> None:
                if track.kind == "video":
                    pc.addTrack(session.out)
                    session.tasks.append(asyncio.ensure_future(self._consume(session, track)))
                elif track.kind == "audio":
                    pc.addTrack(session.audio_out)
                    session.tasks.append(asyncio.ensure_future(self._consume_audio(session, track)))
                    session.tasks.append(asyncio.ensure_future(self._release_audio(session)))

        return await self._negotiate(request, "WHIP", self.sessions, before=prepare)

    async def _consume(self, s: Session, track: Any) -> None:
        loop = asyncio.get_running_loop()
        if s.swap is None:
            s.swap = self.session_swap()  # this publisher's own (tracks, smoothing)
        index = 0
        last_pts: int | None = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
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
            t0 = loop.time()
            picture, faces = await loop.run_in_executor(self._pool, self._swap_frame, s, frame, index)
            s.faces += faces
            index += 1
            peers = [s] + list(self.viewers.values())
            for peer, out in zip(peers, video_copies(picture, frame.pts, frame.time_base, len(peers))):
                peer.out.put(out)
            s.frames_out += 1
            # The frame taken was the newest, so it waited at most one frame interval before t0:
            # this delay is the video's own to within that.
            delay = loop.time() - t0
            s.latency_ms.append(delay * 1e3)
            s.video_delay_s = smooth(s.video_delay_s, delay, first=s.frames_out == 1)

    @staticmethod
    def _swap_frame(s: Session, frame: Any, index: int) -> tuple[np.ndarray, int]:
        """In the swap thread: the swapped picture (RGB or NV12) and the faces swapped."""
        assert s.swap is not None  # set when the session's video consumer starts
        return s.swap(frame, index)

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
            hold = min(s.video_delay_s + s.in_interval_s, AUDIO_HOLD_MAX_S) - AIORTC_AUDIO_PREFETCH_S
            wait = arrived + hold - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            s.audio_out.put(frame)
            for v in list(self.viewers.values()):
                v.audio_out.put(audio_copy(frame))
            s.audio_frames_out += 1

    async def _delete(self, request: Any) -> Any:
        from aiohttp import web

        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        sid = request.match_info["sid"]
        sessions = self.viewers if request.path.startswith("/whep/") else self.sessions
        if sid not in sessions:
            return web.Response(status=404, text="no such session\n")
        await self._drop(sessions, sid)
        return web.Response(status=200)

    def _unauthorised(self, request: Any) -> Any:
        """None when the request may go on; else the 401 to answer (constant-time comparison)."""
        if self.token is None:
            return None
        from aiohttp import web

        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return None
        return web.Response(status=401, text="missing or wrong bearer token (Authorization: Bearer ...)\n",
                            headers={"WWW-Authenticate": 'Bearer realm="whip"'})

    async def _drop(self, sessions: dict[str, Session], sid: str) -> None:
        s = sessions.pop(sid, None)
        if s is None:
            return
        for task in s.tasks:
            task.cancel()
        await s.pc.close()

    async def _shutdown(self, app: Any) -> None:
        for sessions in (self.sessions, self.viewers):
            for sid in list(sessions):
                await self._drop(sessions, sid)
        self._pool.shutdown(wait=False)
