"""The stream-key check nginx-rtmp calls on every publish (`on_publish`): 2xx accepts, 403 refuses.

It runs in its own process. nginx asks it while one of our own publishers is connecting, and PyAV
holds the GIL while FFmpeg waits for that connection: a thread in our process could not answer, and
the publish would time out.
"""

from __future__ import annotations

import hmac
import multiprocessing as mp
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs


def _serve(keys: list[str], host: str, port: int, ready: Any, refused: Any) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
            key = (form.get("name") or [""])[0]
            # Constant-time comparison: the key is a secret.
            ok = any(hmac.compare_digest(key, k) for k in keys)
            if not ok:
                refused.put(key)
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    ready.put(int(server.server_address[1]))
    server.serve_forever()


class StreamKeyAuth:
    """An HTTP server on loopback, in a child process, that accepts publishers whose key is allowed."""

    def __init__(self, keys: set[str], host: str = "127.0.0.1", port: int = 0) -> None:
        self.keys = sorted(keys)
        self.host = host
        self._port = port
        self._ctx = mp.get_context("spawn")
        self._refused_q = self._ctx.Queue()
        self._refused: list[str] = []
        self._proc: Any = None
        self.port = 0
        self.url = ""

    @property
    def refused(self) -> list[str]:
        """Keys that were refused so far."""
        while not self._refused_q.empty():
            self._refused.append(self._refused_q.get())
        return self._refused

    def __enter__(self) -> "StreamKeyAuth":
        ready = self._ctx.Queue()
        self._proc = self._ctx.Process(target=_serve, args=(self.keys, self.host, self._port, ready,
                                                            self._refused_q), daemon=True)
        self._proc.start()
        self.port = int(ready.get(timeout=20))
        self.url = f"http://{self.host}:{self.port}/on_publish"
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.refused  # collect what is pending before the queue's feeder goes away
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(timeout=5)
