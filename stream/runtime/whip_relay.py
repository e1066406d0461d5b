"""WHIP and WHEP with `serve --workers N`: each publisher's session lives in a worker, as a stream of
that worker's runtime (`runtime.rtc`), placed like the API's streams.

The parent's `WhipServer` keeps what faces the client (the token, the Host and CORS checks, the
offer's limits, the session cap, the pages) and hands each checked offer to `PoolRelay`, which
forwards it to a worker's own WHIP endpoint (`/worker/rtc/whip` on its private socket, behind its
token). The worker builds the peer connection and the stream; its answer, with its ICE candidates,
goes back to the client, whose media then flows to the worker directly (UDP on this machine's
addresses): the parent carries no media. A WHEP viewer goes to the worker of the newest publisher,
whose swapped video it is shown.

```
client ── POST /whip (SDP) ──► serve (parent) ── checks ── PoolRelay ── POST /worker/rtc/whip ──► worker
       ◄── 201 answer + Location /whip/<sid> ─────────────────────────◄── answer (worker's candidates)
       ══ RTP/RTCP (ICE, DTLS) ═══════════════════════════════════════════════════════════► worker
```

The parent learns which sessions are still up from the workers' load reports (every second): one
that ended there (its connection failed, the publisher left without a DELETE) stops counting
against `--max-sessions` then. A worker that dies takes its sessions with it; the publisher
reconnects (OBS retries) and is placed on another worker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workers import Worker, WorkerPool

log = logging.getLogger(__name__)

WHIP_ID_PREFIX = "whip-"
"""The runtime stream id of a WHIP publisher: this and the start of its session id."""
WORKER_RTC_PREFIX = "/worker/rtc"
"""Where a worker's own WHIP/WHEP endpoints are, on its private socket."""
WORKER_HOST = "worker"
"""The host name the parent's requests to a worker carry (`Worker.base`): the worker's WHIP server
answers to it alone."""
REPORT_GRACE_S = 3.0
"""A session younger than this is kept even when a load report does not list it yet: the report may
have been taken before the session was made."""


@dataclass
class RelayedSession:
    kind: str
    """"WHIP" or "WHEP"."""
    worker: Worker
    created: float


class PoolRelay:
    """`live.webrtc.SessionRelay` over a `WorkerPool`: WHIP and WHEP sessions in the workers."""

    def __init__(self, pool: WorkerPool, swapper: str) -> None:
        self.pool = pool
        self.swapper = swapper
        self.sessions_by_id: dict[str, RelayedSession] = {}
        self.offering: dict[int, Worker] = {}
        """Publishers' offers on their way to a worker: they count as its streams (placement)."""
        self._newest_publisher: Worker | None = None
        pool.relay = self  # placement counts the publishers' streams (WorkerPool.streams_on)

    def publishers_on(self, w: Worker) -> int:
        """WHIP publishers' streams on `w`, those being set up included."""
        self._prune()
        return (sum(1 for s in self.sessions_by_id.values() if s.kind == "WHIP" and s.worker is w)
                + sum(1 for x in self.offering.values() if x is w))

    def streams_of(self, w: Worker) -> list[str]:
        """The runtime stream ids of the publishers on `w` (as last known: for a crash's log line)."""
        return sorted(WHIP_ID_PREFIX + sid[:12] for sid, s in self.sessions_by_id.items()
                      if s.kind == "WHIP" and s.worker is w)

    def stream_worker(self, stream_id: str) -> Worker | None:
        """The worker of a publisher's runtime stream (`whip-` and its session id's start)."""
        self._prune()
        for sid, s in self.sessions_by_id.items():
            if s.kind == "WHIP" and WHIP_ID_PREFIX + sid[:12] == stream_id:
                return s.worker
        return None

    def sessions(self, kind: str) -> int:
        self._prune()
        return sum(1 for s in self.sessions_by_id.values() if s.kind == kind)

    def _prune(self) -> None:
        """Forget sessions whose worker is gone, or whose worker's last report no longer lists them."""
        now = time.monotonic()
        for sid, s in list(self.sessions_by_id.items()):
            listed = s.worker.load.get("rtc_sessions")
            if s.worker.state != "ready" or (isinstance(listed, list) and sid not in listed
                                             and s.worker.load_at > s.created + REPORT_GRACE_S
                                             and now > s.created + REPORT_GRACE_S):
                del self.sessions_by_id[sid]

    async def offer(self, kind: str, sdp: str) -> tuple[int, str, str | None]:
        """Place the session and forward its offer: (status, the answer SDP or an error text, the
        session id on 201)."""
        from .workers import PoolError

        token = object()
        try:
            if kind == "WHEP" and self._newest_publisher is not None and self._newest_publisher.state == "ready":
                w = self._newest_publisher  # the viewer sees the newest publisher's video
            else:
                w = self.pool.choose(swapper=self.swapper)
                if kind == "WHIP":  # a viewer is not a stream
                    self.offering[id(token)] = w
            status, headers, payload = await self.pool.forward(
                w, "POST", f"{WORKER_RTC_PREFIX}/{kind.lower()}", sdp.encode(), "application/sdp", timeout=30.0)
        except PoolError as e:
            return e.status, f"{e}\n", None
        finally:
            self.offering.pop(id(token), None)
        text = payload.decode(errors="replace")
        if status != 201:
            return status, text, None
        sid = headers.get("Location", "").rsplit("/", 1)[-1]
        self.sessions_by_id[sid] = RelayedSession(kind, w, time.monotonic())
        if kind == "WHIP":
            self._newest_publisher = w
        log.info("%s session %s on worker %s", kind, sid, w.name)
        return 201, text, sid

    async def delete(self, kind: str, sid: str) -> int:
        """End a session: the worker's status (404 when neither knows it)."""
        from .workers import PoolError

        s = self.sessions_by_id.get(sid)
        if s is None or s.kind != kind:
            return 404
        try:
            status, _, _ = await self.pool.forward(s.worker, "DELETE", f"{WORKER_RTC_PREFIX}/{kind.lower()}/{sid}")
        except PoolError as e:
            if s.worker.state == "ready":
                return e.status  # a worker that did not answer in time: the session may still run
            self.sessions_by_id.pop(sid, None)
            return 200  # its worker is gone, and the session with it
        if 200 <= status < 300 or status == 404:  # ended there, now or before: gone either way
            self.sessions_by_id.pop(sid, None)
            return 200
        return status

    def known(self, kind: str, sid: str) -> bool:
        s = self.sessions_by_id.get(sid)
        return s is not None and s.kind == kind

    def describe(self) -> dict[str, Any]:
        return {sid: {"kind": s.kind, "worker": s.worker.name} for sid, s in self.sessions_by_id.items()}
