"""The control API of `swapstream serve`: REST over aiohttp, authenticated with a bearer token.

| method and path | what |
|---|---|
| `GET /healthz` | the process answers (no token) |
| `GET /readyz` | 200 when streams can be created, 503 with the reason otherwise (no token) |
| `GET /metrics` | Prometheus text format |
| `GET /api/streams` | every stream |
| `POST /api/streams` | create a stream (JSON: input, outputs, swapper, preset, budget) |
| `GET /api/streams/{id}` | one stream, with counts, latency and the controller's steps |
| `DELETE /api/streams/{id}` | stop it |
| `PUT /api/streams/{id}/source` | upload or replace its source face (multipart field `image`, or a raw image body) |
| `GET /api/streams/{id}/preview.jpg` | the last encoded frame |
| `GET /hls/{id}/{view_key}/{file}` | a stream's HLS output; the view key (in the stream's JSON) is the credential, so that a `<video>` or a player can open it |
| `GET /dashboard` | the dashboard page (it asks for the token) |

Nothing a request sends becomes a path unchecked: inputs are RTMP URLs, or file names resolved inside
`--media-root` and refused if they leave it, read with FFmpeg's file protocol only and the demuxers of
`live.streams.MEDIA_FORMATS` (no playlist reads what it names); every input and RTMP output URL goes
through the outbound policy (`swapstream.netpolicy`: runtime.allowed_hosts / allowed_ports), refused
with one 403 whatever the cause, and rtmps:// certificates are verified; HLS goes into
`--hls-root/<stream id>/`, with ids that match `[a-z0-9][a-z0-9_-]*`; HLS files are served only
under names the writer uses; presets are names from configs/, never paths; config overrides cannot
touch the server's settings (`models_dir`, `runtime`, `consent`, `disclosure`, `watermark`,
`webrtc`, `provenance`: every stream has the server's). Uploaded images are checked for size,
declared type and magic bytes, and their dimensions are read from the header before OpenCV decodes
them from memory.

Answers never show a stream key or token (`swapstream.redact`), and neither does the access log of
`RedactingAccessLogger`. A bearer header that is not UTF-8 is a 401. DELETE answers within
`manager.REMOVE_WAIT_S` and the stream finishes stopping after it if it must; then the HLS folder the
server made for it goes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
from aiohttp import web
from aiohttp.web_log import AccessLogger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import PRESETS_DIR
from ..errors import ConfigError, ConsentError, EngineUserError, InputError, NoFaceError, SwapStreamError
from ..live.auth import bearer_refusal
from ..live.streams import hls_playable
from ..netpolicy import OutboundPolicy, OutboundRefused, UrlSyntaxError, parse_rtmp_url
from ..redact import MASK, RedactingFilter, redact_text
from .manager import (REMOVE_WAIT_S, SERVER_SETTINGS, STREAM_ID, StreamNotFound, StreamRequestError,
                      StreamRuntime)
from .metrics import CONTENT_TYPE
from .stream import InputSpec, OutputSpec, StreamPipeline, StreamSpec

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())

STATIC = Path(__file__).resolve().parent / "static"

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp"}
# The writer names segments seg_%05d.ts: five digits at least, more after segment 99999. ASCII
# digits only, and the whole name (`fullmatch`: `$` alone would let a trailing newline through).
HLS_FILE = re.compile(r"index\.m3u8|seg_[0-9]{5,}\.ts")
# FFmpeg writes a live playlist (and, with some flags, a segment) as NAME.tmp, then renames it; a
# writer stopped in between leaves the .tmp behind.
HLS_LEFTOVER = re.compile(r"(?:index\.m3u8|seg_[0-9]{5,}\.ts)(?:\.tmp)?")
# The view key is the credential of an HLS URL: /hls/<id>/<key>/<file>.
HLS_KEY_IN_PATH = re.compile(r"(/hls/[^/\s?]+/)[^/\s?]+")
# Matched with `fullmatch` (as every id and URL here): `$` alone would let a trailing newline through.
RTMP_URL = re.compile(r"rtmps?://[A-Za-z0-9.\-\[\]:]+/[\x21-\x7e]{1,1000}")
FORBIDDEN_OVERRIDES = SERVER_SETTINGS


@dataclass
class ApiSettings:
    """What the API needs besides the runtime."""

    token: str
    """The bearer token every /api and /metrics request must carry."""
    hls_root: Path | None = None
    """Folder under which each stream's HLS output goes (`<root>/<id>/`); None: no HLS outputs."""
    media_root: Path | None = None
    """Folder whose files may be named as inputs; None: RTMP inputs only."""
    view_keys: dict[str, str] = field(default_factory=dict)
    """Stream id -> the secret in its HLS URL."""
    default_source: Path | None = None
    """Image file (`serve -s`) whose face every new stream starts with, through the same face and
    consent checks as an upload, until a face is uploaded for it; None: streams start without one."""
    default_image: np.ndarray | None = field(default=None, init=False, repr=False)
    """`default_source` read as RGB (at construction, so that a bad file fails at once)."""

    def __post_init__(self) -> None:
        if self.default_source is not None:
            from ..io.image import load_image

            self.default_image = load_image(self.default_source)
        # Printable ASCII without spaces: what a client can send in an HTTP header unchanged. The
        # upper bound keeps the whole header under aiohttp's 8190-byte line limit.
        if not re.fullmatch(r"[\x21-\x7e]{16,4096}", self.token):
            raise ConfigError("the API token must be 16 to 4096 printable ASCII characters without "
                              "spaces: set SWAPSTREAM_API_TOKEN, --api-token-file or --api-token to a "
                              "long random string (or leave them unset to get one)")


NO_FACE_IN_UPLOAD = ("no face found in the uploaded image: send a photo where one face is clearly "
                     "visible, frontal, and fills at least a fifth of the picture")
"""The answer to an uploaded image without a face (the swappers name it 'uploaded source')."""


def _no_face_message(e: NoFaceError) -> str:
    """The API's words for a NoFaceError about an uploaded image: the analysers' "no face found in
    source image 'uploaded source'" becomes NO_FACE_IN_UPLOAD; other reasons (degenerate key points,
    no dense landmarks) are kept, with the image named as the client knows it."""
    text = str(e)
    if text.startswith("no face found in source image"):
        return NO_FACE_IN_UPLOAD
    return text.replace("'uploaded source'", "the uploaded image")


# -- request bodies -------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputBody(_Body):
    url: str | None = None
    """rtmp:// or rtmps:// URL to pull."""
    file: str | None = None
    """A file name inside the server's --media-root."""
    loop: bool = False
    realtime: bool = True
    reconnect_seconds: float = Field(10.0, ge=0.0, le=3600.0)


class OutputBody(_Body):
    type: Literal["rtmp", "hls", "null"]
    url: str | None = None


class CreateBody(_Body):
    id: str | None = None
    input: str | InputBody
    outputs: list[OutputBody] = Field(min_length=1, max_length=4)
    swapper: str = "mesh"
    preset: str = "multi_stream"
    budget_ms: float | None = Field(None, gt=0.0, le=60000.0)
    set: list[str] = Field(default_factory=list, max_length=32)


def _error(status: int, message: str) -> web.Response:
    # Messages quote inputs and outputs, and an input's errors (FFmpeg's) quote its URL again: no
    # stream key or query in an answer, even to the client that sent them (proxies log answers).
    return web.json_response({"error": redact_text(message)}, status=status)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _pydantic_message(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    if err["type"] == "extra_forbidden":
        return f"unknown field '{where}' in the request body"
    if err["type"] == "missing":
        return f"field '{where}' is required"
    return f"field '{where}': {err['msg']} (got {err.get('input')!r})"


TOKEN_HINT = "send 'Authorization: Bearer TOKEN' with the token that swapstream serve printed or SWAPSTREAM_API_TOKEN holds"


def authorize(request: web.Request, token: str) -> web.Response | None:
    """None when the request carries `Authorization: Bearer TOKEN`; else the 401 to answer. For the
    routes outside `ControlApi` (the worker pool's front, a worker's load report); the check is
    `live.auth.bearer_refusal`, as everywhere."""
    why = bearer_refusal(request.headers.get("Authorization", ""), token)
    if why is None:
        return None
    resp = _error(401, f"{why}: {TOKEN_HINT}" if why.startswith("missing") else why)
    resp.headers["WWW-Authenticate"] = 'Bearer realm="swapstream"'
    return resp


# -- image uploads --------------------------------------------------------------------------------


def sniff_image(data: bytes) -> tuple[str, int, int]:
    """(kind, width, height) from the header of a PNG, JPEG or WebP image; ValueError otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return "png", w, h
    if data[:3] == b"\xff\xd8\xff":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
                i += 2 if marker != 0xFF else 1
                continue
            length = struct.unpack(">H", data[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return "jpeg", w, h
            i += 2 + length
        raise ValueError("a JPEG without a frame header")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return "webp", w & 0x3FFF, h & 0x3FFF
        if chunk == b"VP8L":
            b = int.from_bytes(data[21:25], "little")
            return "webp", (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return "webp", int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ValueError("not a PNG, JPEG or WebP image")


async def _read_limited(stream: Any, limit: int, what: str) -> bytes:
    buf = bytearray()
    while True:
        chunk = await stream.read_chunk(65536) if hasattr(stream, "read_chunk") else await stream.read(65536)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise ApiError(413, f"{what} is larger than {limit} bytes (runtime.upload_max_bytes); "
                                f"send a smaller image")


async def read_upload(request: web.Request, max_bytes: int) -> tuple[bytes, str]:
    """The uploaded image's bytes and declared type: a multipart field `image`, or a raw body."""
    length = request.content_length
    if length is not None and length > max_bytes + 64 * 1024:  # multipart framing adds a little
        raise ApiError(413, f"upload of {length} bytes is larger than {max_bytes} bytes "
                            f"(runtime.upload_max_bytes); send a smaller image")
    ctype = request.content_type
    if ctype.startswith("multipart/"):
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                raise ApiError(400, "the multipart body has no field named 'image': send the face "
                                    "as -F image=@face.jpg")
            if getattr(part, "name", None) == "image":
                declared = (part.headers.get("Content-Type") or "").split(";")[0].strip().lower()
                return await _read_limited(part, max_bytes, "the image"), declared
    if ctype in IMAGE_TYPES:
        return await _read_limited(request.content, max_bytes, "the image"), ctype
    raise ApiError(415, f"Content-Type {ctype or 'missing'!s} is not accepted: send multipart/form-data "
                        f"with a field 'image', or the image itself as image/png, image/jpeg or image/webp")


def decode_upload(data: bytes, declared: str, max_side: int) -> np.ndarray:
    """Check an uploaded image and decode it from memory to HxWx3 RGB."""
    if declared not in IMAGE_TYPES:
        raise ApiError(415, f"the image's Content-Type is {declared or 'missing'!s}; send image/png, "
                            f"image/jpeg or image/webp")
    if not data:
        raise ApiError(400, "the image is empty")
    try:
        kind, w, h = sniff_image(data)
    except ValueError as e:
        raise ApiError(415, f"the uploaded bytes are {e}: send a PNG, JPEG or WebP file") from None
    if kind != IMAGE_TYPES[declared]:
        raise ApiError(415, f"the image is declared as {declared} but its content is {kind}")
    if w < 16 or h < 16 or w > max_side or h > max_side:
        raise ApiError(422, f"the image is {w}x{h} pixels; send one between 16 and {max_side} pixels "
                            f"per side (runtime.upload_max_side)")
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    if img is None:
        raise ApiError(422, f"the {kind.upper()} image could not be decoded (truncated or corrupt)")
    return np.ascontiguousarray(img)


# -- the API --------------------------------------------------------------------------------------


API_ROUTES = (("GET", "/healthz", "healthz"), ("GET", "/readyz", "readyz"), ("GET", "/metrics", "metrics"),
              ("GET", "/dashboard", "dashboard"), ("GET", "/api/streams", "list_streams"),
              ("POST", "/api/streams", "create"), ("GET", "/api/streams/{sid}", "inspect"),
              ("DELETE", "/api/streams/{sid}", "stop"), ("PUT", "/api/streams/{sid}/source", "put_source"),
              ("GET", "/api/streams/{sid}/preview.jpg", "preview"), ("GET", "/hls/{sid}/{key}/{name}", "hls"))
"""The control API's routes and the handler method each calls: one list for the single-process API
(`ControlApi`) and the worker pool's front (`pool_api.PoolApi`), so both answer the same paths."""


def add_api_routes(app: web.Application, handlers: Any) -> None:
    """Route `API_ROUTES` to the same-named methods of `handlers`."""
    for method, path, name in API_ROUTES:
        if method == "GET":
            app.router.add_get(path, getattr(handlers, name))  # HEAD too, as aiohttp's add_get does
        else:
            app.router.add_route(method, path, getattr(handlers, name))


class ControlApi:
    """The routes, bound to one runtime."""

    def __init__(self, runtime: StreamRuntime, settings: ApiSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        runtime.on_removed.append(self._remove_hls)

    def add_routes(self, app: web.Application) -> None:
        add_api_routes(app, self)

    # -- helpers --------------------------------------------------------------------------------

    def _authorize(self, request: web.Request) -> None:
        why = bearer_refusal(request.headers.get("Authorization", ""), self.settings.token)
        if why is not None:
            raise ApiError(401, f"{why}: {TOKEN_HINT}" if why.startswith("missing") else why)

    def _stream(self, request: web.Request) -> StreamPipeline:
        sid = request.match_info["sid"]
        try:
            return self.runtime.get(sid)
        except StreamNotFound:
            raise ApiError(404, f"no stream with id {sid!r}: GET /api/streams lists them") from None

    def _info(self, p: StreamPipeline) -> dict[str, Any]:
        info = p.info()
        key = self.settings.view_keys.get(p.id)
        if key is not None and any(o.kind == "hls" for o in p.spec.outputs):
            info["hls"] = f"/hls/{p.id}/{key}/index.m3u8"
            # A player opened on a playlist too short to start fails: say when it is worth it.
            root = self.settings.hls_root
            info["hls_ready"] = root is not None and hls_playable(root / p.id / "index.m3u8")
        info["preview"] = f"/api/streams/{p.id}/preview.jpg"
        return info

    async def _guard(self, request: web.Request, handler: Any, auth: bool = True) -> web.StreamResponse:
        try:
            if auth:
                self._authorize(request)
            return await handler()
        except ApiError as e:
            resp = _error(e.status, str(e))
            if e.status == 401:
                resp.headers["WWW-Authenticate"] = 'Bearer realm="swapstream"'
            return resp
        except OutboundRefused as e:
            # Refused again when the stream connected (its name resolved elsewhere since): the same
            # answer as at the request's check.
            return _error(403, str(e))
        except StreamRequestError as e:
            return _error(e.status, str(e))
        except ConsentError as e:
            return _error(403, str(e))
        except (NoFaceError, InputError) as e:
            return _error(422, str(e))
        except EngineUserError as e:
            # The swapper the stream asked for cannot be built here (model missing and downloads off,
            # licence not accepted...): the message names the file and the fix; another swapper may do.
            return _error(422, f"swapper unavailable: {e}")
        except (ConfigError, SwapStreamError) as e:
            return _error(400, str(e))
        except web.HTTPException:
            raise
        except Exception as e:
            # A fault on our side, not in the request (a model that fails to build on this device):
            # logged with its traceback, and answered in JSON that says what failed, so that a
            # client (and serve's front, relaying a worker) has a reason rather than a bare 500.
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, f"internal error: {type(e).__name__}: {e}")

    # -- health ---------------------------------------------------------------------------------

    # Both answer from memory, on the loop, without a lock or an executor: nothing they do can wait
    # behind a stream (priority.py says what keeps the loop itself responsive under load).

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        ok, why = self.runtime.ready()
        return web.json_response({"ready": ok, "reason": why, "streams": self.runtime.active(),
                                  "stopping": len(self.runtime.stopping),
                                  "devices": [s.name for s in self.runtime.slots],
                                  "nvml": self.runtime.gpu.available or self.runtime.gpu.reason},
                                 status=200 if ok else 503)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            body = await asyncio.get_running_loop().run_in_executor(None, self.runtime.metrics.render)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

        return await self._guard(request, h)

    async def dashboard(self, request: web.Request) -> web.Response:
        # The page holds no secret: it asks for the token and sends it with every API call.
        return web.Response(text=(STATIC / "dashboard.html").read_text(), content_type="text/html")

    # -- streams --------------------------------------------------------------------------------

    async def list_streams(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            return web.json_response({"streams": [self._info(p) for p in self.runtime.streams.values()]})

        return await self._guard(request, h)

    async def inspect(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            return web.json_response(self._info(self._stream(request)))

        return await self._guard(request, h)

    async def stop(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            p = self._stream(request)
            # Bounded: a stream whose frames wait behind a busy device finishes stopping (and its
            # HLS files go, `_remove_hls`) after the answer; its state then says "stopping".
            await self.runtime.remove_stream(p.id, wait=REMOVE_WAIT_S)
            if p.id not in self.runtime.streams:  # not taken again by a new stream meanwhile
                self.settings.view_keys.pop(p.id, None)
            return web.json_response(self._info(p))

        return await self._guard(request, h)

    async def create(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            if request.content_type != "application/json":
                raise ApiError(415, "send the stream as JSON (Content-Type: application/json)")
            try:
                raw = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"the request body is not valid JSON: {e}") from None
            try:
                body = CreateBody.model_validate(raw)
            except ValidationError as e:
                raise ApiError(400, _pydantic_message(e)) from None
            spec = await self._spec(body)
            p = await self.runtime.add_stream(spec)
            await self._default_source(p)
            # The view key is set only once the stream is this request's: a create that loses the
            # id to another (409) or whose stream is removed while starting never touches the key
            # of the stream that has the id. Keys of streams the runtime has forgotten go too.
            keys = self.settings.view_keys
            keys[p.id] = secrets.token_urlsafe(16)
            for sid in [k for k in keys if k not in self.runtime.streams]:
                del keys[sid]
            return web.json_response(self._info(p), status=201,
                                     headers={"Location": f"/api/streams/{p.id}"})

        return await self._guard(request, h)

    async def _spec(self, body: CreateBody) -> StreamSpec:
        sid = body.id or f"s-{secrets.token_hex(4)}"
        if not STREAM_ID.fullmatch(sid):
            raise ApiError(400, f"field 'id': {sid!r} is not valid: use 1-63 lower-case letters, "
                                f"digits, '-' or '_', starting with a letter or digit")
        if sid in self.runtime.streams:
            raise ApiError(409, f"a stream with id {sid!r} already exists (it may have ended): delete it "
                                f"first (DELETE /api/streams/{sid}) or choose another id")
        inp = InputBody(url=body.input) if isinstance(body.input, str) else body.input
        if (inp.url is None) == (inp.file is None):
            raise ApiError(400, "field 'input': give either 'url' (rtmp://...) or 'file' (a name "
                                "inside the server's --media-root)")
        outbound: list[tuple[str, str]] = []
        """(field, URL) of every URL the stream would connect to, for the outbound policy."""
        if inp.url is not None:
            if not RTMP_URL.fullmatch(inp.url):
                raise ApiError(400, f"field 'input.url': {inp.url!r} is not an rtmp:// or rtmps:// URL "
                                    f"with a host and a path")
            self._check_url_syntax("input.url", inp.url)
            outbound.append(("input.url", inp.url))
            source = InputSpec(inp.url, realtime=False, loop=False,
                               reconnect_seconds=inp.reconnect_seconds)
        else:
            assert inp.file is not None
            source = InputSpec(str(self._media_file(inp.file)), realtime=inp.realtime, loop=inp.loop)
        outputs = []
        for i, o in enumerate(body.outputs):
            if o.type == "rtmp":
                if o.url is None or not RTMP_URL.fullmatch(o.url):
                    raise ApiError(400, f"field 'outputs.{i}.url': an rtmp output needs an rtmp:// "
                                        f"or rtmps:// URL, got {o.url!r}")
                self._check_url_syntax(f"outputs.{i}.url", o.url)
                outbound.append((f"outputs.{i}.url", o.url))
                outputs.append(OutputSpec("rtmp", o.url))
            elif o.type == "hls":
                if o.url is not None:
                    raise ApiError(400, f"field 'outputs.{i}.url': an hls output takes no url; it is "
                                        f"written under the server's --hls-root and served at /hls/")
                if self.settings.hls_root is None:
                    raise ApiError(400, f"field 'outputs.{i}': this server has no --hls-root, so it "
                                        f"cannot write HLS; use an rtmp output")
                outputs.append(OutputSpec("hls", str(self.settings.hls_root / sid)))
            else:
                outputs.append(OutputSpec("null"))
        if sum(o.kind == "hls" for o in outputs) > 1:
            raise ApiError(400, "field 'outputs': at most one hls output per stream")
        presets = sorted(x.stem for x in PRESETS_DIR.glob("*.yaml"))
        if body.preset not in presets:
            raise ApiError(400, f"field 'preset': unknown preset {body.preset!r}: choose one of "
                                f"{', '.join(presets)}")
        for item in body.set:
            key = item.split("=", 1)[0].strip()
            if key.split(".")[0] in FORBIDDEN_OVERRIDES:
                raise ApiError(400, f"field 'set': {key!r} cannot be set per stream over the API "
                                    f"(it is the server's setting)")
        # Last, once the request is otherwise valid: a name is looked up only for a stream that
        # would start. Every refusal is the same 403, whatever its cause (netpolicy's module doc).
        policy = OutboundPolicy.from_config(self.runtime.config.runtime)
        for where, url in outbound:
            try:
                await policy.check(url)
            except OutboundRefused as e:
                raise ApiError(403, f"field '{where}': {e}") from None
        return StreamSpec(sid, source, tuple(outputs), swapper=body.swapper, preset=body.preset,
                          overrides=tuple(body.set), budget_ms=body.budget_ms)

    @staticmethod
    def _check_url_syntax(where: str, url: str) -> None:
        """The URL's host and port are well formed (before any policy: a typo is the client's to fix,
        and says nothing about the network)."""
        try:
            parse_rtmp_url(url)
        except UrlSyntaxError as e:
            raise ApiError(400, f"field '{where}': {e}") from None

    def _media_file(self, name: str) -> Path:
        root = self.settings.media_root
        if root is None:
            raise ApiError(400, "field 'input.file': this server has no --media-root, so file inputs "
                                "are off; use an rtmp:// URL")
        if not name or "\x00" in name or name.startswith(("/", "\\")) or ".." in Path(name).parts:
            raise ApiError(400, f"field 'input.file': {name!r} must be a relative name inside the "
                                f"media folder, without '..'")
        base = root.resolve()
        path = (base / name).resolve()
        if not path.is_relative_to(base):
            raise ApiError(400, f"field 'input.file': {name!r} leads outside the media folder")
        if not path.is_file():
            raise ApiError(422, f"field 'input.file': no file {name!r} in the media folder")
        return path

    async def _default_source(self, p: StreamPipeline) -> None:
        """Give a new stream the server's `-s` face, if any. A face that fails its checks (no face,
        no consent record, swapper unavailable) leaves the stream running without one, as before,
        and is logged: an upload can still give it one."""
        image, path = self.settings.default_image, self.settings.default_source
        if image is None or path is None:
            return
        try:
            await p.set_source(image, f"the server's source image '{path}'", path)
        except SwapStreamError as e:
            log.warning("stream %s starts without the server's face %s: %s", p.id, path, e)

    async def put_source(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            p = self._stream(request)
            rc = self.runtime.config.runtime
            data, declared = await read_upload(request, rc.upload_max_bytes)
            image = await asyncio.get_running_loop().run_in_executor(
                None, decode_upload, data, declared, rc.upload_max_side)
            try:
                await self.runtime.set_source(p.id, image)
            except NoFaceError as e:
                raise ApiError(422, _no_face_message(e)) from None
            return web.json_response(self._info(p))

        return await self._guard(request, h)

    async def preview(self, request: web.Request) -> web.StreamResponse:
        async def h() -> web.Response:
            p = self._stream(request)
            frame = p.latest
            if frame is None:
                raise ApiError(404, f"stream {p.id!r} has not encoded a frame yet")

            def jpeg() -> bytes:
                h_, w_ = frame.shape[:2]
                img = frame if w_ <= 480 else cv2.resize(frame, (480, round(h_ * 480 / w_)),
                                                          interpolation=cv2.INTER_AREA)
                ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                                       [cv2.IMWRITE_JPEG_QUALITY, 80])
                return buf.tobytes()

            body = await asyncio.get_running_loop().run_in_executor(None, jpeg)
            return web.Response(body=body, content_type="image/jpeg",
                                headers={"Cache-Control": "no-store"})

        return await self._guard(request, h)

    async def hls(self, request: web.Request) -> web.StreamResponse:
        sid, key, name = (request.match_info[k] for k in ("sid", "key", "name"))
        expected = self.settings.view_keys.get(sid) if sid in self.runtime.streams else None
        if expected is None or not hmac.compare_digest(key.encode(), expected.encode()):
            return _error(404, "no such HLS stream (unknown stream or view key)")
        if not HLS_FILE.fullmatch(name) or self.settings.hls_root is None:
            return _error(404, f"no HLS file {name!r}")
        path = self.settings.hls_root / sid / name
        # Read in a thread: a segment is up to megabytes, and the loop answers /healthz meanwhile.
        body = await asyncio.get_running_loop().run_in_executor(None, _read_if_file, path)
        if body is None:
            return _error(404, f"HLS file {name!r} is not written yet")
        ctype = "application/vnd.apple.mpegurl" if name.endswith(".m3u8") else "video/mp2t"
        return web.Response(body=body, content_type=ctype, headers={"Cache-Control": "no-cache"})

    async def _remove_hls(self, p: StreamPipeline) -> None:
        """Once a removed stream is down (its writer closed): delete the HLS output the server made
        for it, `--hls-root/<id>/`, and nothing else."""
        root = self.settings.hls_root
        if root is None:
            return
        folder = root / p.id
        if any(o.kind == "hls" and Path(o.target) == folder for o in p.spec.outputs):
            await asyncio.get_running_loop().run_in_executor(None, remove_hls_output, folder)


def _read_if_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except FileNotFoundError:  # the writer deleted an old segment between the check and the read
        return None


def remove_hls_output(folder: Path) -> None:
    """Delete what an HLS writer left in `folder` (its playlist, segments and their .tmp files), then
    the folder if that empties it. Other files, links and subfolders stay, and so does the folder
    then: it is the server's only as far as the writer filled it."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for f in folder.iterdir():
        if HLS_LEFTOVER.fullmatch(f.name) and not f.is_symlink() and f.is_file():
            f.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        log.warning("HLS folder %s was kept: it holds files the HLS writer did not make", folder)


class RedactingAccessLogger(AccessLogger):
    """aiohttp's access log without credentials: queries (`/view?token=...`), URLs in headers (a
    Referer with a token) and HLS view keys (`/hls/<id>/<key>/...`) are masked. Give it to
    `web.run_app(..., access_log_class=RedactingAccessLogger)` or `web.AppRunner`."""

    def _format_line(self, request: web.BaseRequest, response: web.StreamResponse,
                     time: float) -> Iterable[tuple[str | tuple[str, str], str]]:
        # Each value is redacted before it is formatted into the line or passed as `extra`
        # (structured handlers read the request line and headers from there).
        return [(key, _redact_access(value) if isinstance(value, str) else value)
                for key, value in super()._format_line(request, response, time)]


def _redact_access(value: str) -> str:
    return HLS_KEY_IN_PATH.sub(lambda m: m.group(1) + MASK, redact_text(value))


def mount_runtime(app: web.Application, runtime: StreamRuntime, settings: ApiSettings) -> ControlApi:
    """Add the control API to an aiohttp app and tie the runtime's life to the app's."""
    api = ControlApi(runtime, settings)
    api.add_routes(app)
    tie_runtime(app, runtime)
    return api


def tie_runtime(app: web.Application, runtime: StreamRuntime) -> None:
    """Start `runtime` with the app and close it after (`serve --ray` ties the WHIP publishers'
    runtime this way, which has no control API of its own)."""

    async def on_startup(_app: web.Application) -> None:
        await runtime.start()

    async def on_cleanup(_app: web.Application) -> None:
        await runtime.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)


def new_token() -> str:
    """A random API token for a server started without one."""
    return secrets.token_urlsafe(24)
