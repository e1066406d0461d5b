"""A fuzz test of the control API: hypothesis builds requests over its request models (the stream
definition, its input and outputs, config overrides), the path parameters, the headers and the body's
framing, and sends them over real HTTP to a real runtime on loopback.

The API has no OpenAPI description, so the strategies follow `CreateBody`, `InputBody` and
`OutputBody` in `swapstream.runtime.api` field by field, with each field's valid values, its
boundary values and garbage. What must hold for every request:
- no 5xx other than 503 (a full runtime), and never a traceback in any answer;
- every error is JSON with an `error` string;
- no accepted invalid state: a 201 means a stream whose id, input, outputs, preset and overrides
  are all valid, whose input is a file inside the media folder or a loopback URL (the outbound
  policy's default), and which the runtime really holds; it is deleted again at once.

The run is bounded (`max_examples`) and derandomized (the same examples on every run, so CI cannot
turn red by chance; change the seed locally with `--hypothesis-seed` to explore), so CI spends
seconds here, not minutes.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse
from ipaddress import ip_address
from typing import Any

import pytest

pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from swapstream.config import PRESETS_DIR  # noqa: E402
from swapstream.runtime.manager import SERVER_SETTINGS  # noqa: E402

from .conftest import TOKEN, Served  # noqa: E402

STREAM_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))

# -- strategies over the request models ------------------------------------------------------------

junk = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=True),
                 st.text(max_size=40), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
"""A value of the wrong type for any field."""

ids = st.one_of(st.from_regex(STREAM_ID, fullmatch=True), st.text(max_size=70),
                st.sampled_from(["abc\n", "ABC", "-a", "a" * 64, "", "a/b", "..", "a\x00"]))

hosts = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "10.0.0.1", "192.168.1.1", "172.16.0.5",
                         "169.254.169.254", "0.0.0.0", "[::ffff:10.0.0.1]", "[fe80::1]", "100.64.0.1",
                         "256.1.1.1", "host_name", "a..b", ""])
ports = st.one_of(st.none(), st.sampled_from([1935, 443, 22, 6379, 0, 65535, 70000]),
                  st.integers(1, 65535))
paths = st.one_of(st.sampled_from(["/live/key", "/app/", "/", "/live/key?token=x", "/a b/c", "/live/\n"]),
                  st.text(max_size=30).map(lambda s: "/" + s))


@st.composite
def urls(draw: Any) -> str:
    scheme = draw(st.sampled_from(["rtmp", "rtmps", "RTMP", "http", "file", "rtmpt", "srt", ""]))
    port = draw(ports)
    return f"{scheme}://{draw(hosts)}{'' if port is None else f':{port}'}{draw(paths)}"


inputs = st.one_of(
    urls(), junk,
    st.fixed_dictionaries({}, optional={
        "url": st.one_of(urls(), junk),
        "file": st.one_of(st.sampled_from(["clip.mp4", "../clip.mp4", "/etc/passwd", "missing.mp4",
                                           "./clip.mp4", "clip.mp4\x00", ""]), junk),
        "loop": st.one_of(st.booleans(), junk),
        "realtime": st.one_of(st.booleans(), junk),
        "reconnect_seconds": st.one_of(st.floats(-1, 4000), junk),
        "extra": junk,
    }))

outputs = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["null", "hls", "rtmp", "ftp", "NULL"])},
                          optional={"url": st.one_of(urls(), junk)}),
    junk), max_size=6)

overrides = st.lists(st.one_of(
    st.sampled_from(["detector.threads=64", "detector.threads=2", "detector.max_faces=0",
                     "detector.max_faces=2", "models_dir=/etc", "runtime.max_streams=1000",
                     "watermark.enabled=false", "disclosure.label_live=false", "encode.threads=512",
                     "nope.key=1", "detector.detect_every=3", "=", "detector", "detector.threads=1e9"]),
    st.text(max_size=30), junk), max_size=5)

bodies = st.fixed_dictionaries({}, optional={
    "id": st.one_of(ids, junk),
    "input": inputs,
    "outputs": st.one_of(outputs, junk),
    "swapper": st.one_of(st.sampled_from(["mesh", "inswapper_128", "nope", ""]), junk),
    "preset": st.one_of(st.sampled_from([*PRESETS, "../../etc/passwd", "", "LIVE"]), junk),
    "budget_ms": st.one_of(st.floats(allow_nan=True, allow_infinity=True), junk),
    "set": st.one_of(overrides, junk),
    "surprise": junk,
})

# -- the wire --------------------------------------------------------------------------------------


def send(served: Served, method: str, path: str, body: bytes | None = None,
         headers: dict[str, bytes | str] | None = None) -> tuple[int, bytes]:
    """One request with raw header values (bytes that are not UTF-8 too), over a fresh connection."""
    host, port = urllib.parse.urlsplit(served.url).netloc.split(":")
    lines = [f"{method} {path} HTTP/1.1".encode(), f"Host: {host}:{port}".encode(), b"Connection: close"]
    for k, v in (headers or {}).items():
        lines.append(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()))
    if body is not None:
        lines.append(f"Content-Length: {len(body)}".encode())
    raw = b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = dechunk(payload)
    return status, payload


def dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        size = int(data[i:j].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def auth(token: str = TOKEN) -> dict[str, bytes | str]:
    return {"Authorization": f"Bearer {token}"}


def check_answer(status: int, payload: bytes, what: str) -> None:
    """What every answer must be, whatever was sent."""
    assert status < 500 or status == 503, f"{what}: {status} {payload[:300]!r}"
    assert b"Traceback" not in payload and b'File "' not in payload, f"{what}: {payload[:300]!r}"
    if status >= 400:
        err = json.loads(payload)
        assert isinstance(err.get("error"), str) and err["error"], f"{what}: {payload[:300]!r}"


def check_accepted(served: Served, sent: Any, info: dict[str, Any]) -> None:
    """A 201's stream must be one a correct server could have accepted from what was sent."""
    sid = info["id"]
    assert STREAM_ID.fullmatch(sid), sid
    assert sid in served.runtime.streams
    spec = served.runtime.streams[sid].spec
    assert isinstance(sent, dict)
    assert spec.preset in PRESETS and spec.swapper == "mesh"
    assert 1 <= len(spec.outputs) <= 4 and sum(o.kind == "hls" for o in spec.outputs) <= 1
    for item in spec.overrides:
        assert item.split("=", 1)[0].strip().split(".")[0] not in SERVER_SETTINGS, item
    # Every value within its declared bounds: the stream's config validates again as it stands.
    stream_cfg = served.runtime.streams[sid].cfg
    type(stream_cfg).model_validate(stream_cfg.model_dump())
    targets = [spec.input.url] + [o.target for o in spec.outputs if o.kind == "rtmp"]
    media = served.settings.media_root
    assert media is not None
    for t in targets:
        if "://" in t:
            host = urllib.parse.urlsplit(t).hostname or ""
            # The outbound policy's default: loopback only. (A name was resolved and replaced, or
            # is `localhost`.)
            assert host == "localhost" or ip_address(host).is_loopback, t
            assert "\n" not in t and " " not in t, t
        else:
            assert t.startswith(str(media.resolve())), t


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(body=bodies, framing=st.sampled_from(["json", "text", "garbage", "none", "form"]))
def test_create_fuzz(served: Served, body: Any, framing: str) -> None:
    if framing == "json":
        raw, ctype = json.dumps(body).encode(), "application/json"
    elif framing == "text":
        raw, ctype = json.dumps(body).encode(), "text/plain"
    elif framing == "garbage":
        raw, ctype = json.dumps(body).encode()[::-1] + b"\xff\xfe", "application/json"
    elif framing == "form":
        raw, ctype = b"id=a&input=b", "application/x-www-form-urlencoded"
    else:
        raw, ctype = b"", "application/json"
    status, payload = send(served, "POST", "/api/streams", raw, {**auth(), "Content-Type": ctype})
    check_answer(status, payload, f"POST {body!r}")
    if status == 201:
        info = json.loads(payload)
        check_accepted(served, body, info)
        t0 = time.monotonic()
        status, payload = send(served, "DELETE", f"/api/streams/{info['id']}", headers=auth())
        check_answer(status, payload, "DELETE")
        assert status == 200 and info["id"] not in served.runtime.streams
        assert time.monotonic() - t0 < 5.0
    else:
        assert all(p.state in ("ended", "failed", "stopped") for p in served.runtime.streams.values())


path_parts = st.one_of(st.from_regex(STREAM_ID, fullmatch=True), st.text(max_size=40),
                       st.sampled_from(["..", "%2e%2e", "a%00b", "x" * 300, "%ff%fe", "a\nb"]))


# CR and LF would end the header and start another: not one header value any client can send.
header_bytes = st.binary(max_size=40).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "DELETE", "PUT", "POST", "PATCH", "OPTIONS"]),
       route=st.sampled_from(["/api/streams/{}", "/api/streams/{}/source", "/api/streams/{}/preview.jpg",
                              "/hls/{}/{}/index.m3u8", "/hls/x/{}/{}", "/metrics", "/api/streams"]),
       a=path_parts, b=path_parts,
       authorization=st.one_of(st.just(f"Bearer {TOKEN}".encode()), header_bytes,
                               header_bytes.map(lambda v: b"Bearer " + v),
                               st.sampled_from([b"Bearer \xff\xfe", "Bearer tökén".encode(),
                                                b"Basic abc", b"bearer", b""])),
       body=st.binary(max_size=200),
       ctype=st.sampled_from(["image/png", "image/jpeg", "multipart/form-data; boundary=x",
                              "application/json", "text/plain"]))
def test_routes_fuzz(served: Served, method: str, route: str, a: str, b: str, authorization: bytes,
                     body: bytes, ctype: str) -> None:
    path = route.format(urllib.parse.quote(a, safe=""), urllib.parse.quote(b, safe=""))
    status, payload = send(served, method, path, body,
                           {"Authorization": authorization, "Content-Type": ctype})
    # aiohttp itself answers in plain text: 404 and 405 for unknown routes and methods, 400 for a
    # header its parser refuses (a NUL byte, say) before any handler of ours runs. Allowed, but never
    # a 5xx or a traceback.
    if status in (400, 404, 405) and not payload.startswith(b"{"):
        assert b"Traceback" not in payload
        return
    check_answer(status, payload, f"{method} {path}")
    if authorization != f"Bearer {TOKEN}".encode() and path.startswith(("/api/", "/metrics")):
        assert status == 401, (method, path, status)
    assert served.runtime.streams == {} or all(
        p.state != "running" for p in served.runtime.streams.values())
