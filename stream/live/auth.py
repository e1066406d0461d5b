"""The stream-key check nginx-rtmp calls on every publish (`on_publish`): 2xx accepts, 403 refuses.

It runs in its own process. nginx asks it while one of our own publishers is connecting, and PyAV
holds the GIL while FFmpeg waits for that connection: a thread in our process could not answer, and
the publish would time out.

nginx posts a form: `call=publish&app=live&name=KEY&...`. A publish is accepted only when `call` is
`publish`, `app` is the one application this check guards and `name` is an allowed key, compared in
constant time. Anything else, a key that is not ASCII or a body that is not a form included, is a
quiet 403 (400 or 413 for a request that is not a form of sane size), never a traceback.
"""

from __future__ import annotations

import hmac
import multiprocessing as mp
import queue
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs

from ..errors import ConfigError
from .nginx import APP_NAME

MAX_BODY_BYTES = 8192
"""Largest form accepted: nginx-rtmp's on_publish form is a few hundred bytes (its URLs included)."""
REFUSED_KEPT = 100
"""Most refused attempts remembered (the latest); older ones are only counted."""
REFUSED_KEY_CHARS = 64
"""Refused keys are remembered cut to this many characters."""
READ_TIMEOUT_S = 5.0
"""A client that sends its request slower than this is dropped (it holds a thread meanwhile)."""


def check_publish(form: dict[str, list[str]], keys: list[bytes], app: str) -> bool:
    """Whether nginx's on_publish `form` is a publish to `app` with an allowed key. Keys are compared
    as bytes, so that a key that is not ASCII is refused like any other wrong key."""
    def one(name: str) -> str:
        values = form.get(name) or [""]
        return values[0] if len(values) == 1 else ""  # a field sent twice is not trusted either way

    if one("call") != "publish" or one("app") != app:
        return False
    given = one("name").encode("utf-8", "surrogateescape")
    # Every key is compared (no early exit), so that the time taken does not say which one matched.
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(given, k)
    return ok


def bearer_refusal(header: str, token: str) -> str | None:
    """None when an `Authorization` header value is `Bearer TOKEN`; else why not, for the 401. The
    one check of every bearer token: WHIP/WHEP, the control API, the worker pool's front. The
    comparison takes constant time; header bytes that are not UTF-8 (aiohttp hands them over as
    surrogates, which a plain encode() refuses: that was a 500) are compared as the bytes they were."""
    if not header:
        return "missing bearer token"
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "the Authorization header must be 'Bearer TOKEN'"
    try:
        raw = given.strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate outside the escape range: not what any client sent
        return "invalid bearer token"
    return None if hmac.compare_digest(raw, token.encode()) else "invalid bearer token"


def _serve(keys: list[str], app: str, host: str, port: int, ready: Any, refused: Any,
           dropped: Any) -> None:
    allowed = [k.encode() for k in keys]

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S

        def _answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                return self._answer(400)
            if length < 0:
                return self._answer(400)
            if length > MAX_BODY_BYTES:
                return self._answer(413)
            body = self.rfile.read(length).decode("utf-8", "surrogateescape")
            form = parse_qs(body, keep_blank_values=True, max_num_fields=64, errors="surrogateescape")
            ok = check_publish(form, allowed, app)
            if not ok:
                name = (form.get("name") or [""])[0]
                try:
                    refused.put_nowait(name[:REFUSED_KEY_CHARS])
                except queue.Full:  # nobody reads them: count, do not buffer without bound
                    with dropped.get_lock():
                        dropped.value += 1
            self._answer(200 if ok else 403)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the request line holds no key, but nginx's form does: nothing is logged

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    ready.put(int(server.server_address[1]))
    server.serve_forever()


class StreamKeyAuth:
    """An HTTP server on loopback, in a child process, that accepts publishers to `app` whose key is
    allowed."""

    def __init__(self, keys: set[str], host: str = "127.0.0.1", port: int = 0, app: str = "live") -> None:
        if not keys or any(not k for k in keys):
            raise ConfigError("the stream-key check needs at least one key, and no empty key: an empty "
                              "one would let a publisher without a key in")
        if not APP_NAME.fullmatch(app):
            raise ConfigError(f"the RTMP application name {app!r} is not valid: use 1-64 letters, "
                              f"digits, '_' or '-'")
        self.keys = sorted(keys)
        self.app = app
        self.host = host
        self._port = port
        self._ctx = mp.get_context("spawn")
        self._refused_q = self._ctx.Queue(REFUSED_KEPT)
        self._dropped = self._ctx.Value("q", 0)
        self._refused: deque[str] = deque(maxlen=REFUSED_KEPT)
        self._seen = 0
        self._proc: Any = None
        self.port = 0
        self.url = ""

    @property
    def refused(self) -> list[str]:
        """The latest refused keys (up to `REFUSED_KEPT`, each cut to `REFUSED_KEY_CHARS`)."""
        while True:
            try:
                self._refused.append(self._refused_q.get_nowait())
            except queue.Empty:
                return list(self._refused)
            self._seen += 1

    @property
    def refused_total(self) -> int:
        """Every refused attempt so far, remembered or not."""
        self.refused  # noqa: B018 - collects what is pending
        return self._seen + int(self._dropped.value)

    def __enter__(self) -> "StreamKeyAuth":
        ready = self._ctx.Queue()
        self._proc = self._ctx.Process(target=_serve, args=(self.keys, self.app, self.host, self._port,
                                                            ready, self._refused_q, self._dropped),
                                       daemon=True)
        self._proc.start()
        self.port = int(ready.get(timeout=20))
        self.url = f"http://{self.host}:{self.port}/on_publish"
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.refused  # noqa: B018 - collect what is pending before the queue's feeder goes away
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(timeout=5)
