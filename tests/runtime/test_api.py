"""The control API over real HTTP on loopback: the token, and bad requests answered with a 4xx and
a reason that names the field and the fix."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from swapstream.demo import astronaut, grace_hopper  # noqa: E402
from swapstream.runtime.api import ApiSettings  # noqa: E402
from swapstream.runtime.manager import StreamRuntime  # noqa: E402

from .conftest import TOKEN, Served, runtime_config, serve_runtime  # noqa: E402


def request(s: Served, method: str, path: str, body: Any = None, *, token: str | None = TOKEN,
            ctype: str | None = None, raw: bytes | None = None) -> tuple[int, dict[str, Any], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if ctype or body is not None:
        headers["Content-Type"] = ctype or "application/json"
    req = urllib.request.Request(s.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            payload = r.read()
            status, hdrs = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        payload, status, hdrs = e.read(), e.code, dict(e.headers)
    return status, hdrs, payload


def error_of(payload: bytes) -> str:
    return json.loads(payload)["error"]


def png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def multipart(field: str, data: bytes, ctype: str, filename: str = "face.png") -> tuple[bytes, str]:
    boundary = "swapstreamtestboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: {ctype}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def file_stream(sid: str = "cam", **extra: Any) -> dict[str, Any]:
    return {"id": sid, "input": {"file": "clip.mp4", "loop": True}, "outputs": [{"type": "null"}]} | extra


def test_health_and_readiness_need_no_token(served: Served) -> None:
    status, _, body = request(served, "GET", "/healthz", token=None)
    assert status == 200 and json.loads(body) == {"ok": True}
    status, _, body = request(served, "GET", "/readyz", token=None)
    ready = json.loads(body)
    assert status == 200 and ready["ready"] is True and ready["devices"] == ["cpu"]
    # No NVIDIA driver here: readiness says so plainly instead of failing.
    assert "NVML" in ready["nvml"] or ready["nvml"] is True


def test_every_api_route_refuses_a_missing_or_wrong_token(served: Served) -> None:
    for method, path in (("GET", "/api/streams"), ("POST", "/api/streams"), ("GET", "/api/streams/x"),
                         ("DELETE", "/api/streams/x"), ("PUT", "/api/streams/x/source"),
                         ("GET", "/metrics"), ("GET", "/api/streams/x/preview.jpg")):
        status, hdrs, body = request(served, method, path, token=None)
        assert status == 401, (method, path)
        assert "missing bearer token" in error_of(body) and hdrs["WWW-Authenticate"].startswith("Bearer")
        status, _, body = request(served, method, path, token="not-the-token")
        assert status == 401 and error_of(body) == "invalid bearer token"
    # Nothing was created by the refused POSTs.
    assert served.runtime.streams == {}


@pytest.mark.parametrize("body, status, reason", [
    ({"input": "rtmp://127.0.0.1/live/a"}, 400, "field 'outputs' is required"),
    ({"input": "rtmp://127.0.0.1/live/a", "outputs": [{"type": "null"}], "colour": 1}, 400,
     "unknown field 'colour' in the request body"),
    ({"input": "file:///etc/passwd", "outputs": [{"type": "null"}]}, 400,
     "field 'input.url': 'file:///etc/passwd' is not an rtmp:// or rtmps:// URL"),
    ({"input": {"file": "../../etc/passwd"}, "outputs": [{"type": "null"}]}, 400,
     "must be a relative name inside the media folder, without '..'"),
    ({"input": {"file": "/etc/passwd"}, "outputs": [{"type": "null"}]}, 400,
     "must be a relative name inside the media folder"),
    ({"input": {"file": "missing.mp4"}, "outputs": [{"type": "null"}]}, 422,
     "no file 'missing.mp4' in the media folder"),
    ({"input": {"file": "clip.mp4", "url": "rtmp://h/a/b"}, "outputs": [{"type": "null"}]}, 400,
     "give either 'url' (rtmp://...) or 'file'"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "rtmp", "url": "http://x/y"}]}, 400,
     "field 'outputs.0.url': an rtmp output needs an rtmp://"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "hls", "url": "/tmp/x"}]}, 400,
     "an hls output takes no url"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "ftp"}]}, 400, "field 'outputs.0.type'"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "preset": "../../etc/x"}, 400,
     "field 'preset': unknown preset '../../etc/x': choose one of"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "set": ["models_dir=/etc"]}, 400,
     "'models_dir' cannot be set per stream over the API"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "set": ["disclosure.label_live=false"]},
     400, "'disclosure.label_live' cannot be set per stream over the API"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "set": ["detector.max_faces=0"]}, 400,
     "invalid value 0 for config key 'detector.max_faces'"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "swapper": "nope"}, 400,
     "unknown swapper 'nope': choose one of mesh"),
    ({"id": "Bad Id!", "input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}]}, 400,
     "field 'id': 'Bad Id!' is not valid"),
    ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}], "budget_ms": -5}, 400,
     "field 'budget_ms'"),
])
def test_bad_stream_definitions_get_a_4xx_naming_the_field(served: Served, body: dict[str, Any],
                                                           status: int, reason: str) -> None:
    got, _, payload = request(served, "POST", "/api/streams", body)
    assert got == status, payload
    assert reason in error_of(payload)
    assert served.runtime.streams == {}


def test_malformed_bodies_and_unreachable_inputs(served: Served) -> None:
    status, _, body = request(served, "POST", "/api/streams", raw=b"{not json", ctype="application/json")
    assert status == 400 and "not valid JSON" in error_of(body)
    status, _, body = request(served, "POST", "/api/streams", raw=b"id=x", ctype="text/plain")
    assert status == 415 and "application/json" in error_of(body)
    # Nothing listens on this port: the input cannot be opened, and the answer says so at once.
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    served.runtime.config.runtime.allowed_ports = [port]  # off rtmp's 1935: the operator allows it
    t0 = time.monotonic()
    status, _, body = request(served, "POST", "/api/streams",
                              {"input": f"rtmp://127.0.0.1:{port}/live/k", "outputs": [{"type": "null"}]})
    # The answer names the input without its stream key (swapstream.redact).
    assert status == 422 and f"cannot open live input 'rtmp://127.0.0.1:{port}/live/***'" in error_of(body)
    assert time.monotonic() - t0 < 15
    assert served.runtime.streams == {}


def _png_header(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))


def test_uploads_are_checked_for_size_type_content_and_face(served: Served) -> None:
    status, _, body = request(served, "POST", "/api/streams", file_stream())
    assert status == 201, body
    face = png(astronaut())
    limit = served.runtime.config.runtime.upload_max_bytes

    def put(raw: bytes, ctype: str) -> tuple[int, str]:
        st, _, b = request(served, "PUT", "/api/streams/cam/source", raw=raw, ctype=ctype)
        return st, (error_of(b) if st >= 400 else "")

    st, why = put(b"\0" * (limit + 200_000), "image/png")
    assert st == 413 and f"larger than {limit} bytes" in why
    st, why = put(b"hello", "text/plain")
    assert st == 415 and "Content-Type text/plain is not accepted" in why
    st, why = put(b"GIF89a" + b"\0" * 100, "image/png")
    assert st == 415 and "not a PNG, JPEG or WebP image" in why
    ok, jpg = cv2.imencode(".jpg", astronaut())
    st, why = put(jpg.tobytes(), "image/png")
    assert st == 415 and "declared as image/png but its content is jpeg" in why
    # A header that claims 20000x20000 pixels is refused before anything is decoded.
    st, why = put(_png_header(20000, 20000) + b"\0" * 64, "image/png")
    assert st == 422 and "20000x20000 pixels" in why
    st, why = put(png(np.full((200, 200, 3), 128, np.uint8)), "image/png")
    assert st == 422 and "no face found" in why
    # The whole answer, in plain words (it once read "no face found in source image the uploaded image").
    assert why == ("no face found in the uploaded image: send a photo where one face is clearly "
                   "visible, frontal, and fills at least a fifth of the picture"), why
    st, why = put(face[: len(face) // 2], "image/png")
    assert st == 422 and "could not be decoded" in why
    # A face without a consent record (the astronaut mirrored: a picture nobody recorded) is refused.
    st, why = put(png(np.ascontiguousarray(astronaut()[:, ::-1])), "image/png")
    assert st == 403 and "no consent record for the face in the uploaded image" in why
    raw, ctype = multipart("picture", face, "image/png")
    st, why = put(raw, ctype)
    assert st == 400 and "no field named 'image'" in why
    # The same face as multipart with the right field, and as a raw body: accepted.
    raw, ctype = multipart("image", face, "image/png")
    st, _ = put(raw, ctype)
    assert st == 200
    st, _ = put(face, "image/png")
    assert st == 200
    status, _, body = request(served, "GET", "/api/streams/cam")
    assert json.loads(body)["source"] == {"set": True, "version": 2}
    status, _, body = request(served, "PUT", "/api/streams/nope/source", raw=face, ctype="image/png")
    assert status == 404 and "no stream with id 'nope'" in error_of(body)
    # A duplicate id is a conflict; the first stream is untouched.
    status, _, body = request(served, "POST", "/api/streams", file_stream())
    assert status == 409 and "already exists" in error_of(body)
    status, _, body = request(served, "DELETE", "/api/streams/cam")
    assert status == 200
    status, _, body = request(served, "GET", "/api/streams/cam")
    assert status == 404 and "no stream with id 'cam'" in error_of(body)


def test_hls_files_are_served_only_with_the_view_key_and_writer_names(served: Served, tmp_path: Path) -> None:
    status, _, body = request(served, "POST", "/api/streams",
                              {"id": "h1", "input": {"file": "clip.mp4"}, "outputs": [{"type": "hls"}]})
    assert status == 201, body
    info = json.loads(body)
    hls = info["hls"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, hdrs, playlist = request(served, "GET", hls, token=None)
        if status == 200 and b".ts" in playlist:
            break
        time.sleep(0.3)
    assert status == 200 and hdrs["Content-Type"].startswith("application/vnd.apple.mpegurl")
    seg = next(line for line in playlist.decode().splitlines() if line.endswith(".ts"))
    status, _, data = request(served, "GET", hls.replace("index.m3u8", seg), token=None)
    assert status == 200 and len(data) > 1000
    wrong_key = hls.split("/")
    wrong_key[3] = "x" * len(wrong_key[3])
    assert request(served, "GET", "/".join(wrong_key), token=None)[0] == 404
    for name in ("..%2F..%2Fetc%2Fpasswd", "index.m3u8.bak", "seg_1.ts"):
        assert request(served, "GET", hls.replace("index.m3u8", name), token=None)[0] == 404
    request(served, "DELETE", "/api/streams/h1")


@pytest.fixture
def served_with_store(clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> Any:
    """A server whose own config names a consent store (with one record in it) and a label text."""
    from swapstream.consent import ConsentStore

    store = tmp_path / "consent.json"
    ConsentStore(store).add(np.ascontiguousarray(astronaut()[:, ::-1]), given_by="the test",
                            purpose="runtime test")
    runtime = StreamRuntime(runtime_config(f"consent.store={store}", "disclosure.text=Server label"),
                            devices=["cpu"])
    yield from serve_runtime(runtime, ApiSettings(TOKEN, media_root=clip[0].parent))


def test_streams_use_the_servers_consent_store_and_disclosure(served_with_store: Served) -> None:
    s = served_with_store
    status, _, body = request(s, "POST", "/api/streams", file_stream())
    assert status == 201, body
    p = s.runtime.get("cam")
    assert p.cfg.consent.store == s.runtime.config.consent.store
    assert p.cfg.disclosure.text == "Server label"
    # The mirrored astronaut is recorded only in the server's store: accepted there.
    status, _, body = request(s, "PUT", "/api/streams/cam/source",
                              raw=png(np.ascontiguousarray(astronaut()[:, ::-1])), ctype="image/png")
    assert status == 200, body
    # A face recorded nowhere is refused, and the answer names the server's store.
    status, _, body = request(s, "PUT", "/api/streams/cam/source",
                              raw=png(np.ascontiguousarray(grace_hopper()[:, ::-1])), ctype="image/png")
    assert status == 403 and f"(store: {s.runtime.config.consent.store})" in error_of(body)


def test_a_swapper_whose_model_is_missing_is_a_422_naming_the_file(clip: tuple[Path, list[np.ndarray]],
                                                                   tmp_path: Path) -> None:
    import shutil

    from swapstream.engines.builtin import BUILTIN_MODELS, builtin_model_path

    models = tmp_path / "models"  # the face analyser's models, no zoo swapper
    models.mkdir()
    for name in BUILTIN_MODELS:
        shutil.copy(builtin_model_path(name), models / name)
    runtime = StreamRuntime(runtime_config("neural.download=false", f"models_dir={models}"), devices=["cpu"])
    for s in serve_runtime(runtime, ApiSettings(TOKEN, media_root=clip[0].parent)):
        status, _, body = request(s, "POST", "/api/streams", file_stream(swapper="inswapper_128"))
        assert status == 201, body
        # The swap backend is built on first use: computing the uploaded face's identity.
        status, _, body = request(s, "PUT", "/api/streams/cam/source", raw=png(astronaut()), ctype="image/png")
        why = error_of(body)
        assert status == 422 and why.startswith("swapper unavailable: ") and "inswapper_128.onnx" in why, body
        assert str(models) in why
        # The stream carries on without a face.
        assert json.loads(request(s, "GET", "/api/streams/cam")[2])["state"] == "running"


def test_a_swapper_that_fails_to_build_is_a_500_in_json_naming_the_fault(clip: tuple[Path, list[np.ndarray]]) -> None:
    """A fault of ours, not of the request (here a backend that raises while it is built, as GFPGAN
    once did on a GPU): the answer is JSON with the fault's type and message, not aiohttp's bare
    500 page, which serve's front relayed as "answered 500 without JSON"."""
    def factory(name: str, config: Any, device: str) -> Any:
        raise RuntimeError("required rank 4 tensor to use channels_last format")

    runtime = StreamRuntime(runtime_config(), devices=["cpu"], backend_factory=factory)
    for s in serve_runtime(runtime, ApiSettings(TOKEN, media_root=clip[0].parent)):
        status, _, body = request(s, "POST", "/api/streams", file_stream())
        assert status == 201, body
        status, _, body = request(s, "PUT", "/api/streams/cam/source", raw=png(astronaut()), ctype="image/png")
        assert status == 500, body
        assert error_of(body) == "internal error: RuntimeError: required rank 4 tensor to use channels_last format"
        assert json.loads(request(s, "GET", "/api/streams/cam")[2])["state"] == "running"


def test_hls_file_names_are_the_writers_past_segment_99999() -> None:
    from swapstream.runtime.api import HLS_FILE

    for name in ("index.m3u8", "seg_00000.ts", "seg_99999.ts", "seg_100000.ts", "seg_1234567.ts"):
        assert HLS_FILE.fullmatch(name), name
    for name in ("seg_1.ts", "seg_0001.ts", "seg_00001.ts.bak", "seg_00001.m3u8", "../seg_00001.ts",
                 "seg_-0001.ts", "index.m3u8/x", "seg_00001.ts\n", "seg_\u0660\u0660\u0660\u0660\u0660.ts"):
        assert not HLS_FILE.fullmatch(name), name


class SlowToReserve(StreamRuntime):
    """A runtime that takes a moment before it reserves a stream's id (as one that asked a quota
    service first would): concurrent creates with one id all get past the API's own check."""

    async def add_stream(self, spec: Any) -> Any:
        await asyncio.sleep(0.3)
        return await super().add_stream(spec)


@pytest.fixture(params=["runtime", "slow to reserve"])
def racing(request: pytest.FixtureRequest, clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> Any:
    kind = SlowToReserve if request.param == "slow to reserve" else StreamRuntime
    runtime = kind(runtime_config(), devices=["cpu"])
    yield from serve_runtime(runtime, ApiSettings(TOKEN, hls_root=tmp_path / "hls", media_root=clip[0].parent))


def test_concurrent_creates_with_one_id_leave_the_winner_its_view_key(racing: Served) -> None:
    from concurrent.futures import ThreadPoolExecutor

    served = racing
    body = {"id": "race", "input": {"file": "clip.mp4", "loop": True}, "outputs": [{"type": "hls"}]}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: request(served, "POST", "/api/streams", body), range(4)))
    statuses = sorted(a[0] for a in answers)
    assert statuses == [201, 409, 409, 409], [(a[0], a[2][:200]) for a in answers]
    created = json.loads(next(a[2] for a in answers if a[0] == 201))
    # The losers' refusals left the winner's key alone: its HLS is served under the key it was given.
    assert "hls" in created, created
    status, _, body_ = request(served, "GET", "/api/streams/race")
    assert json.loads(body_)["hls"] == created["hls"] == f"/hls/race/{served.settings.view_keys['race']}/index.m3u8"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and request(served, "GET", created["hls"], token=None)[0] != 200:
        time.sleep(0.3)
    assert request(served, "GET", created["hls"], token=None)[0] == 200
    # Deleted: the key is gone with it, and the files are no longer served.
    assert request(served, "DELETE", "/api/streams/race")[0] == 200
    assert "race" not in served.settings.view_keys
    assert request(served, "GET", created["hls"], token=None)[0] == 404


def test_a_servers_default_face_swaps_new_streams_without_an_upload(
        clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    """`serve -s FACE`: API streams start with that face (checked for a face and consent as an
    upload is) instead of passing frames through until a face is uploaded."""
    face = tmp_path / "face.png"
    face.write_bytes(png(astronaut()))
    runtime = StreamRuntime(runtime_config(), devices=["cpu"])
    settings = ApiSettings(TOKEN, media_root=clip[0].parent, default_source=face)
    for s in serve_runtime(runtime, settings):
        status, _, body = request(s, "POST", "/api/streams", file_stream())
        assert status == 201, body
        assert json.loads(body)["source"] == {"set": True, "version": 1}
        deadline = time.monotonic() + 30
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = json.loads(request(s, "GET", "/api/streams/cam")[2])
            if info["faces_swapped"] > 0:
                break
            time.sleep(0.2)
        assert info["faces_swapped"] > 0 and info["source"]["set"] is True, info
        # An upload still replaces it.
        status, _, body = request(s, "PUT", "/api/streams/cam/source", raw=png(grace_hopper()), ctype="image/png")
        assert status == 200 and json.loads(body)["source"] == {"set": True, "version": 2}, body


def test_without_a_default_face_new_streams_start_without_one(served: Served) -> None:
    status, _, body = request(served, "POST", "/api/streams", file_stream())
    assert status == 201, body
    assert json.loads(body)["source"] == {"set": False, "version": 0}
    time.sleep(1.0)
    assert json.loads(request(served, "GET", "/api/streams/cam")[2])["faces_swapped"] == 0


def test_a_default_face_that_is_no_image_fails_when_the_server_starts(tmp_path: Path) -> None:
    from swapstream.errors import InputError

    bad = tmp_path / "face.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(InputError, match="is not an image OpenCV can read"):
        ApiSettings(TOKEN, default_source=bad)


def test_workers_start_their_streams_with_the_servers_default_face(
        clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    """`serve --workers N -s FACE`: the pool hands the image's path to each worker, whose API streams
    start with it as in one process."""
    from swapstream.runtime.workers import WorkerPool

    from .test_workers import serve_pool

    face = tmp_path / "face.png"
    face.write_bytes(png(astronaut()))
    pool = WorkerPool(runtime_config(), devices=["cpu"], per_device=1, media_root=clip[0].parent,
                      default_source=face)
    for p in serve_pool(pool):
        status, info = p.call("POST", "/api/streams", file_stream())
        assert status == 201, info
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and info.get("faces_swapped", 0) == 0:
            time.sleep(0.3)
            status, info = p.call("GET", "/api/streams/cam")
        assert info["faces_swapped"] > 0 and info["source"]["set"] is True, info
