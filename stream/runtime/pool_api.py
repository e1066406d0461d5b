"""The control API of `swapstream serve --workers N`: the same routes as `runtime.api`, answered for
every worker's streams as one server.

Requests about a stream go to the worker that runs it (`WorkerPool.forward`), which validates them
exactly as a single-process server does, so every 4xx and its wording are the same. The parent adds
what only it knows: placement (`POST /api/streams`), the list of every worker's streams, merged
/metrics with a `worker` label, `/api/workers`, and HLS served with view keys of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from .api import HLS_FILE, STATIC, _read_if_file, add_api_routes, authorize
from .whip_relay import WHIP_ID_PREFIX
from .workers import Placed, PoolError, Worker, WorkerPool, label_text, merge_metrics

log = logging.getLogger(__name__)

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def read_body(request: web.Request, limit: int, what: str) -> bytes:
    """The whole request body, refused with 413 as soon as it passes `limit` bytes (a declared
    Content-Length that large is refused before reading)."""
    if request.content_length is not None and request.content_length > limit:
        raise PoolError(413, f"{what} is larger than {limit} bytes")
    buf = bytearray()
    while chunk := await request.content.read(65536):
        buf += chunk
        if len(buf) > limit:
            raise PoolError(413, f"{what} is larger than {limit} bytes")
    return bytes(buf)


class PoolApi:
    """The parent's routes over a `WorkerPool`."""

    def __init__(self, pool: WorkerPool, token: str, upload_max_bytes: int) -> None:
        self.pool = pool
        self.token = token
        self.upload_max_bytes = upload_max_bytes

    def add_routes(self, app: web.Application) -> None:
        add_api_routes(app, self)
        app.router.add_get("/api/workers", self.workers)

    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        refused = authorize(request, self.token)
        if refused is not None:
            return refused
        try:
            return await handler()
        except PoolError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    def _view(self, info: dict[str, Any], worker: str) -> dict[str, Any]:
        """A worker's stream info as the parent shows it: its worker (and node, in a cluster), and the
        parent's HLS URL."""
        info["worker"] = worker
        w = next((x for x in self.pool.workers if x.name == worker), None)
        if w is not None and w.node is not None:
            info["node"] = w.node
        p = self.pool.placed.get(info.get("id", ""))
        if "hls" in info and p is not None:
            info["hls"] = f"/hls/{p.id}/{p.view_key}/index.m3u8"
        return info

    async def _relay(self, sid: str, method: str, path: str, body: bytes | None = None,
                     ctype: str | None = None) -> tuple[Placed, int, dict[str, str], bytes]:
        """The stream's record (as it was when asked: a DELETE may forget it meanwhile) and its
        worker's answer."""
        p = self.pool.owner(sid)
        worker = p.worker
        status, headers, payload = await self.pool.forward(worker, method, path, body, ctype)
        return p, status, headers, payload

    def _json(self, status: int, payload: bytes, worker: str) -> web.Response:
        try:
            data = json.loads(payload)
        except ValueError:
            return web.json_response({"error": f"worker {worker} answered {status} without JSON"}, status=502)
        if status < 300 and isinstance(data, dict) and "id" in data:
            data = self._view(data, worker)
        return web.json_response(data, status=status)

    # -- routes ---------------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        ready = [w for w in self.pool.workers if w.state == "ready"]
        ok = bool(ready) and not self.pool.closing
        why = "ok" if ok else ("shutting down" if self.pool.closing else "no worker is ready")
        return web.json_response({"ready": ok, "reason": why, "streams": len(self.pool.placed),
                                  "workers": [{"name": w.name, "state": w.state, "device": w.device,
                                               "node": w.node} for w in self.pool.workers]},
                                 status=200 if ok else 503)

    async def dashboard(self, request: web.Request) -> web.Response:
        return web.Response(text=(STATIC / "dashboard.html").read_text(), content_type="text/html")

    async def workers(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            return web.json_response({"workers": [
                {"name": w.name, "device": w.device, "node": w.node, "node_ip": w.node_ip,
                 "state": w.state, "pid": w.pid, "mps_client": w.mps_client,
                 "streams": sorted(p.id for p in self.pool.placed.values() if p.worker is w),
                 "crashes": w.crashes, "last_exit": w.last_exit, "load": w.load,
                 "refusal": self.pool.refusal(w)} for w in self.pool.workers]})

        return await self._guard(request, h)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        def who(w: Worker) -> dict[str, str]:
            # A cluster's samples say which machine too: one federated /metrics for Prometheus.
            return {"node": w.node, "worker": w.name} if w.node is not None else {"worker": w.name}

        async def h() -> web.Response:
            ready = [w for w in self.pool.workers if w.state == "ready"]
            answers = await asyncio.gather(*(self.pool.forward(w, "GET", "/metrics", timeout=5.0) for w in ready),
                                           return_exceptions=True)
            texts = [(who(w), a[2].decode()) for w, a in zip(ready, answers)
                     if not isinstance(a, BaseException) and a[0] == 200]
            own = ["# HELP swapstream_worker_up 1 when the worker process is ready, 0 otherwise.",
                   "# TYPE swapstream_worker_up gauge"]
            own += [f'swapstream_worker_up{{{label_text(who(w) | {"device": w.device})}}} {int(w.state == "ready")}'
                    for w in self.pool.workers]
            own += ["# HELP swapstream_worker_crashes_total Times the worker process died.",
                    "# TYPE swapstream_worker_crashes_total counter"]
            own += [f'swapstream_worker_crashes_total{{{label_text(who(w))}}} {w.crashes}' for w in self.pool.workers]
            own += ["# HELP swapstream_streams_lost Streams whose worker died and that no worker could take.",
                    "# TYPE swapstream_streams_lost gauge",
                    f"swapstream_streams_lost {sum(1 for p in self.pool.placed.values() if p.lost)}"]
            body = "\n".join(own) + "\n" + merge_metrics(texts)
            return web.Response(text=body, headers={"Content-Type": METRICS_TYPE})

        return await self._guard(request, h)

    async def list_streams(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            ready = [w for w in self.pool.workers if w.state == "ready"]
            answers = await asyncio.gather(*(self.pool.forward(w, "GET", "/api/streams") for w in ready),
                                           return_exceptions=True)
            streams: list[dict[str, Any]] = []
            for w, a in zip(ready, answers):
                if isinstance(a, BaseException) or a[0] != 200:
                    continue
                # The API's streams the parent placed, and the WHIP publishers' streams (placed
                # through runtime.whip_relay, ended by their session).
                streams += [self._view(s, w.name) for s in json.loads(a[2])["streams"]
                            if s.get("id") in self.pool.placed or str(s.get("id")).startswith(WHIP_ID_PREFIX)]
            streams += [{"id": p.id, "state": "failed", "error": p.lost, "worker": None}
                        for p in self.pool.placed.values() if p.lost is not None]
            return web.json_response({"streams": streams})

        return await self._guard(request, h)

    async def create(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            raw = await read_body(request, CREATE_LIMIT, "the stream definition")
            status, payload = await self.pool.create(raw, request.content_type)
            p = self.pool.placed.get(json.loads(payload).get("id", "")) if status == 201 else None
            resp = self._json(status, payload, p.worker.name if p else "?")
            if p is not None:
                resp.headers["Location"] = f"/api/streams/{p.id}"
            return resp

        return await self._guard(request, h)

    async def inspect(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            sid = request.match_info["sid"]
            p, status, _, payload = await self._relay(sid, "GET", f"/api/streams/{sid}")
            return self._json(status, payload, p.worker.name)

        return await self._guard(request, h)

    async def stop(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            sid = request.match_info["sid"]
            p = self.pool.placed.get(sid)
            if p is not None and p.lost is not None:
                self.pool.forget(sid)
                return web.json_response({"id": sid, "state": "stopped", "error": p.lost})
            p, status, _, payload = await self._relay(sid, "DELETE", f"/api/streams/{sid}")
            if status in (200, 404) and self.pool.placed.get(sid) is p:  # 404: the worker forgot it too
                self.pool.forget(sid)
            return self._json(status, payload, p.worker.name)

        return await self._guard(request, h)

    async def put_source(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            sid = request.match_info["sid"]
            self.pool.owner(sid)
            limit = self.upload_max_bytes + 64 * 1024  # multipart framing adds a little
            raw = await read_body(request, limit, "the upload")
            ctype = request.headers.get("Content-Type", "")
            p, status, _, payload = await self._relay(sid, "PUT", f"/api/streams/{sid}/source", raw, ctype)
            if status == 200:
                p.source = (raw, ctype)  # to set it again if the stream moves to another worker
            return self._json(status, payload, p.worker.name)

        return await self._guard(request, h)

    async def preview(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            sid = request.match_info["sid"]
            p, status, headers, payload = await self._relay(sid, "GET", f"/api/streams/{sid}/preview.jpg")
            if status != 200:
                return self._json(status, payload, p.worker.name)
            return web.Response(body=payload, content_type="image/jpeg", headers={"Cache-Control": "no-store"})

        return await self._guard(request, h)

    async def hls(self, request: web.Request) -> web.StreamResponse:
        import hmac

        sid, key, name = (request.match_info[k] for k in ("sid", "key", "name"))
        p = self.pool.placed.get(sid)
        if p is None or not hmac.compare_digest(key.encode(), p.view_key.encode()):
            return web.json_response({"error": "no such HLS stream (unknown stream or view key)"}, status=404)
        root = self.pool.hls_root
        if not HLS_FILE.fullmatch(name) or root is None:
            return web.json_response({"error": f"no HLS file {name!r}"}, status=404)
        # Off the loop (a segment is megabytes, and the loop serves every request of every stream),
        # and gone is not an error: the writer deletes old segments while players still ask.
        body = await asyncio.get_running_loop().run_in_executor(None, _read_if_file, root / sid / name)
        if body is None:
            return web.json_response({"error": f"HLS file {name!r} is not written yet"}, status=404)
        ctype = "application/vnd.apple.mpegurl" if name.endswith(".m3u8") else "video/mp2t"
        return web.Response(body=body, content_type=ctype, headers={"Cache-Control": "no-cache"})


CREATE_LIMIT = 64 * 1024
"""The largest stream definition the parent reads."""


def mount_pool(app: web.Application, pool: WorkerPool, token: str, upload_max_bytes: int) -> PoolApi:
    """Add the pool's API to an aiohttp app and tie the workers' life to the app's."""
    api = PoolApi(pool, token, upload_max_bytes)
    api.add_routes(app)

    async def on_startup(_app: web.Application) -> None:
        await pool.start()

    async def on_shutdown(_app: web.Application) -> None:
        pool.closing = True  # workers stopping from here on are not crashes to recover from

    async def on_cleanup(_app: web.Application) -> None:
        await pool.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return api
