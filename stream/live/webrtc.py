"""WebRTC in and out with aiortc: a WHIP endpoint whose publisher gets the swapped video back.

`POST /whip` with an SDP offer (Content-Type application/sdp) answers `201 Created` with the SDP
answer and a `Location` for the session; `DELETE` on that location ends it (WHIP, RFC 9725). The
publisher's video comes back swapped on the same peer connection, so one page (or OBS 30+ with a
player) both publishes and previews.

aiortc's receive queue is unbounded: a swap slower than the camera would build up delay without
limit. The consumer therefore always takes the newest frame and drops the older ones, counting them.
The swap itself runs in a worker thread so that the event loop keeps serving ICE and RTP.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"

SwapFn = Callable[[np.ndarray, int], int]
"""Swaps faces in an RGB frame in place; gets the frame's index; returns faces swapped."""


def _track_class() -> type:
    from aiortc import MediaStreamTrack

    class LatestFrameTrack(MediaStreamTrack):
        """An outgoing video track that always sends the newest swapped frame (older ones dropped)."""

        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
            self.dropped = 0

        def offer(self, frame: Any) -> None:
            if self._queue.full():
                self._queue.get_nowait()
                self.dropped += 1
            self._queue.put_nowait(frame)

        async def recv(self) -> Any:
            return await self._queue.get()

    return LatestFrameTrack


@dataclass
class Session:
    """One WHIP publisher."""

    pc: Any
    out: Any
    task: asyncio.Task[None] | None = None
    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    faces: int = 0
    latency_ms: list[float] = field(default_factory=list)


def newest(track: Any, first: Any) -> tuple[Any, int]:
    """The newest frame waiting in an aiortc remote track, and how many older ones were skipped.

    Reads aiortc's internal queue (`RemoteStreamTrack._queue`): there is no public way to ask a
    track for its backlog, and draining it is what keeps a live preview live.
    """
    frame, skipped = first, 0
    q = getattr(track, "_queue", None)
    while q is not None and not q.empty():
        nxt = q.get_nowait()
        if nxt is None:  # end of track marker
            break
        frame = nxt
        skipped += 1
    return frame, skipped


class WhipServer:
    """An aiohttp application with the WHIP endpoint. `swap` does the face work for each frame."""

    def __init__(self, swap: SwapFn) -> None:
        from aiohttp import web

        self.swap = swap
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

        if request.content_type != "application/sdp":
            return web.Response(status=415, text=f"{kind} offers must be Content-Type: application/sdp\n")
        sdp = await request.text()
        if "m=video" not in sdp:
            return web.Response(status=400, text="the offer has no video section\n")
        pc = RTCPeerConnection()
        session = Session(pc=pc, out=_track_class()())
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
        """WHEP: a viewer's recvonly offer gets the swapped video of the current publisher."""

        def prepare(pc: Any, viewer: Session) -> None:
            for t in pc.getTransceivers():
                if t.kind == "video":
                    t.sender.replaceTrack(viewer.out)
                    t.direction = "sendonly"

        return await self._negotiate(request, "WHEP", self.viewers, after=prepare)

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ok": True, "sessions": len(self.sessions)})

    async def _post(self, request: Any) -> Any:
        """WHIP: a publisher's offer; its video comes back swapped on the same connection."""

        def prepare(pc: Any, session: Session) -> None:
            @pc.on("track")
            def on_track(track: Any) -> None:
                if track.kind == "video":
                    pc.addTrack(session.out)
                    session.task = asyncio.ensure_future(self._consume(session, track))

        return await self._negotiate(request, "WHIP", self.sessions, before=prepare)

    async def _consume(self, s: Session, track: Any) -> None:
        from aiortc.mediastreams import MediaStreamError
        import av

        loop = asyncio.get_running_loop()
        index = 0
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            frame, skipped = newest(track, frame)
            s.frames_in += 1 + skipped
            s.dropped += skipped
            t0 = loop.time()
            rgb = np.ascontiguousarray(frame.to_ndarray(format="rgb24"))
            s.faces += await loop.run_in_executor(self._pool, self.swap, rgb, index)
            index += 1
            out = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            out.pts = frame.pts
            out.time_base = frame.time_base or Fraction(1, 90000)
            s.out.offer(out)
            for v in list(self.viewers.values()):
                v.out.offer(out)  # frames are read-only once made: every viewer may share one
            s.frames_out += 1
            s.latency_ms.append((loop.time() - t0) * 1e3)

    async def _delete(self, request: Any) -> Any:
        from aiohttp import web

        sid = request.match_info["sid"]
        sessions = self.viewers if request.path.startswith("/whep/") else self.sessions
        if sid not in sessions:
            return web.Response(status=404, text="no such session\n")
        await self._drop(sessions, sid)
        return web.Response(status=200)

    async def _drop(self, sessions: dict[str, Session], sid: str) -> None:
        s = sessions.pop(sid, None)
        if s is None:
            return
        if s.task is not None:
            s.task.cancel()
        await s.pc.close()

    async def _shutdown(self, app: Any) -> None:
        for sessions in (self.sessions, self.viewers):
            for sid in list(sessions):
                await self._drop(sessions, sid)
        self._pool.shutdown(wait=False)
