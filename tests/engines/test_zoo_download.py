"""The model zoo's table, and downloads over real HTTP on loopback.

`AssetServer` stands in for facefusion-assets: a ThreadingHTTPServer on 127.0.0.1 that serves files
from a folder, answers `Range` with 206 + Content-Range, and on request drops a body part-way (a lost
connection), ignores Range (servers that answer 200), or stalls (timeouts). It records every request,
so that tests assert what went over the wire, not only what ended up on disk.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from swapstream.engines.download import (LICENCES_FILE, DownloadError, LicenceNotAcceptedError,
                                         ModelCorruptError, ModelStore)
from swapstream.engines.errors import EngineUserError, ModelMissingError
from swapstream.engines.zoo import (MODELS, TEMPLATES, ModelSpec, UnknownModelError, crc32_file,
                                    get_spec, parse_hash)
from swapstream.models_cli import app as models_app

GITHUB = "https://github.com/facefusion/facefusion-assets/releases/download"
SIZE = 300_000  # several read chunks, small enough to keep the file fast
CUT = 100_000


# --------------------------------------------------------------------------------------------------
# The server


@dataclass(frozen=True)
class Served:
    """One request the server answered."""

    path: str
    range: str | None
    status: int
    sent: int
    """Body bytes written."""


class AssetServer:
    """facefusion-assets on loopback: `{url}/{release}/{file}` served from `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log: list[Served] = []
        self.ignore_range = False
        self.cut_after: dict[str, int] = {}
        """File name -> body bytes to send before dropping the connection (once per entry)."""
        self.stall: set[str] = set()
        """File names whose requests get no answer until the server stops."""
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        # A short poll keeps shutdown() (which waits for the next poll) from adding 0.5 s per test.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def publish(self, spec: ModelSpec, data: bytes, *, hash_of: bytes | None = None) -> None:
        """Serve `data` as the spec's file, with a `.hash` of `hash_of` (default: of `data`)."""
        folder = self.root / spec.release
        folder.mkdir(parents=True, exist_ok=True)
        (folder / spec.file).write_bytes(data)
        (folder / spec.hash_file).write_text(f"{zlib.crc32(data if hash_of is None else hash_of):08x}\n")

    def requests_for(self, file: str) -> list[Served]:
        return [r for r in self.log if r.path.endswith("/" + file)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                rng = self.headers.get("Range")
                if name in server.stall:
                    server._stop.wait(10)
                    return
                file = server.root / self.path.lstrip("/")
                if not file.is_file():
                    self._reply(404, b"not found", rng)
                    return
                data = file.read_bytes()
                status, body, extra = 200, data, {}
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m and not server.ignore_range:
                    start = int(m.group(1))
                    if start >= len(data):
                        self._reply(416, b"", rng, {"Content-Range": f"bytes */{len(data)}"})
                        return
                    status, body = 206, data[start:]
                    extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                cut = server.cut_after.pop(name, None)
                self._reply(status, body, rng, extra, cut)

            def _reply(self, status: int, body: bytes, rng: str | None,
                       extra: dict[str, str] | None = None, cut: int | None = None) -> None:
                sent = body[:cut] if cut is not None else body
                # Logged before anything goes out: the client may return, and the test read the log,
                # before this thread runs again.
                server.log.append(Served(self.path, rng, status, len(sent)))
                self.send_response(status)
                # The full length is announced even when the body is cut: that is what a drop looks like.
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(sent)
                self.wfile.flush()
                self.close_connection = True

        return Handler


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AssetServer]:
    srv = AssetServer(tmp_path / "www")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def payload() -> bytes:
    return np.random.default_rng(0).bytes(SIZE)


@pytest.fixture
def make_store(tmp_path: Path, server: AssetServer) -> Callable[..., ModelStore]:
    def make(**kw: Any) -> ModelStore:
        return ModelStore(tmp_path / "models", cache_dir=tmp_path / "cache", base_url=server.url,
                          timeout=5.0, **kw)
    return make


INSWAPPER = get_spec("inswapper_128")
NEURAL_MD = (Path(__file__).resolve().parents[2] / "docs" / "neural.md").read_text()


# --------------------------------------------------------------------------------------------------
# The zoo table against docs/neural.md, "Model contracts"

# docs/neural.md, "Where the files come from" (yunet: FaceFusion 3.x fetches it from models-3.4.0).
RELEASES = {
    "models-3.0.0": "inswapper_128 inswapper_128_fp16 blendswap_256 simswap_256 simswap_unofficial_512 "
                    "ghost_1_256 ghost_2_256 ghost_3_256 uniface_256 scrfd_2.5g retinaface_10g "
                    "yoloface_8n 2dfan4 arcface_w600k_r50 bisenet_resnet_34 gfpgan_1.4 codeformer "
                    "gpen_bfr_512 restoreformer_plus_plus",
    "models-3.1.0": "hififace_unofficial_256 xseg_1 xseg_2 bisenet_resnet_18",
    "models-3.2.0": "xseg_3",
    "models-3.3.0": "hyperswap_1a_256 hyperswap_1b_256 hyperswap_1c_256",
    "models-3.4.0": "crossface_ghost crossface_hififace crossface_simswap yunet_2023_mar",
}

# docs/neural.md, "Warp templates", verbatim.
TEMPLATE_TABLE = """
| arcface_112_v1 | (.35473214,.45658929) (.64526786,.45658929) (.5,.61154464) (.37913393,.776875) (.62086607,.776875) |
| arcface_112_v2 | (.34191607,.46157411) (.65653393,.45983393) (.500225,.64050536) (.37097589,.82469196) (.63151696,.82325089) |
| arcface_128 | (.36167656,.40387734) (.63696719,.40235469) (.50019687,.56044219) (.38710391,.72160547) (.61507734,.72034453) |
| ffhq_512 | (.37691676,.46864664) (.62285697,.46912813) (.50123859,.61331904) (.39308822,.725411) (.61150205,.72490465) |
| mtcnn_512 | (.36562865,.46733799) (.63305391,.46585885) (.50019127,.61942959) (.39032951,.77598822) (.61178945,.77476328) |
"""

HALF, ZERO, ONE = (0.5,) * 3, (0.0,) * 3, (1.0,) * 3
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# docs/neural.md, "Swappers": template, size, mean, std, source input, embedding, L2, output.
SWAPPERS = {
    "inswapper_128": ("arcface_128", 128, ZERO, ONE, "embedding", "emap", True, "0_1_clip"),
    "inswapper_128_fp16": ("arcface_128", 128, ZERO, ONE, "embedding", "emap", True, "0_1_clip"),
    **{f"hyperswap_1{v}_256": ("arcface_128", 256, HALF, HALF, "embedding", "normalized", True, "std_mean")
       for v in "abc"},
    "simswap_256": ("arcface_112_v1", 256, *IMAGENET, "embedding", "converter:crossface_simswap", True,
                    "0_1_clip"),
    "simswap_unofficial_512": ("arcface_112_v1", 512, ZERO, ONE, "embedding",
                               "converter:crossface_simswap", True, "0_1_clip"),
    "hififace_unofficial_256": ("mtcnn_512", 256, HALF, HALF, "embedding", "converter:crossface_hififace",
                                True, "std_mean"),
    **{f"ghost_{v}_256": ("arcface_112_v1", 256, HALF, HALF, "embedding", "converter:crossface_ghost",
                          False, "std_mean") for v in "123"},
    "blendswap_256": ("ffhq_512", 256, ZERO, ONE, "image", "none", False, "0_1_clip"),
    "uniface_256": ("ffhq_512", 256, HALF, HALF, "image", "none", False, "std_mean"),
}


def test_every_model_of_models_md_is_in_the_zoo_with_its_release() -> None:
    expected = {name: rel for rel, names in RELEASES.items() for name in names.split()}
    assert {n: s.release for n, s in MODELS.items()} == expected


@pytest.mark.parametrize("name", list(MODELS))
def test_url_and_hash_url_format(name: str) -> None:
    spec = MODELS[name]
    assert spec.file == f"{name}.onnx"
    assert spec.url == f"{GITHUB}/{spec.release}/{name}.onnx"
    assert spec.hash_url == f"{GITHUB}/{spec.release}/{name}.hash"
    assert spec.url_for("http://mirror/x/") == f"http://mirror/x/{spec.release}/{name}.onnx"
    assert spec.template is None or spec.template in TEMPLATES
    assert spec.converter is None or MODELS[spec.converter].kind == "converter"
    assert spec.licence


def test_templates_equal_models_md() -> None:
    # The table here is the doc's, verbatim: an edit of either without the other fails.
    for line in TEMPLATE_TABLE.strip().splitlines():
        assert line in NEURAL_MD, f"docs/neural.md lost its template row: {line[:40]}"
    rows = re.findall(r"\| (\w+) \| (.+?) \|", TEMPLATE_TABLE)
    assert [r[0] for r in rows] == list(TEMPLATES)
    for name, points in rows:
        want = np.array([[float(x), float(y)] for x, y in re.findall(r"\(([\d.]+),([\d.]+)\)", points)])
        got = TEMPLATES[name]
        assert got.shape == (5, 2) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(np.float32))
        assert not got.flags.writeable


@pytest.mark.parametrize("name", list(SWAPPERS))
def test_swapper_contract_equals_models_md(name: str) -> None:
    s = MODELS[name]
    got = (s.template, s.size, s.mean, s.std, s.source_input, s.embedding, s.embedding_l2, s.output_range)
    assert got == SWAPPERS[name]
    assert s.kind == "swapper" and s.input_names == ("target", "source") and s.channels == "RGB"
    assert s.dtype == ("float16" if "fp16" in name or "hyperswap" in name else "float32")


def test_non_swapper_contracts() -> None:
    # docs/neural.md: detectors (x-127.5)/128, x/255 and raw; arcface x/127.5-1 on arcface_112_v2;
    # 2dfan4 /255.
    x = np.array([0.0, 127.5, 255.0])
    for name, want in {"scrfd_2.5g": (x - 127.5) / 128, "retinaface_10g": (x - 127.5) / 128,
                       "yoloface_8n": x / 255, "yunet_2023_mar": x, "2dfan4": x / 255,
                       "arcface_w600k_r50": x / 127.5 - 1}.items():
        s = MODELS[name]
        np.testing.assert_allclose((x / 255 - s.mean[0]) / s.std[0], want, atol=1e-9, err_msg=name)
    assert {MODELS[n].detector_family for n in ("scrfd_2.5g", "retinaface_10g", "yoloface_8n",
                                                "yunet_2023_mar")} == {"scrfd", "retinaface", "yoloface",
                                                                       "yunet"}
    assert (MODELS["arcface_w600k_r50"].template, MODELS["arcface_w600k_r50"].size) == ("arcface_112_v2", 112)


# docs/neural.md, "Occluders and parsers" and "Enhancers": size, layout, channels, and what x = 0, 127.5,
# 255 become after the normalisation.
FACE_STACK = {
    "xseg_1": (256, "NHWC", "BGR", "x / 255"), "xseg_2": (256, "NHWC", "BGR", "x / 255"),
    "xseg_3": (256, "NHWC", "BGR", "x / 255"),
    "bisenet_resnet_18": (512, "NCHW", "RGB", "imagenet"), "bisenet_resnet_34": (512, "NCHW", "RGB", "imagenet"),
    **{n: (512, "NCHW", "RGB", "x / 127.5 - 1") for n in ("gfpgan_1.4", "codeformer", "gpen_bfr_512",
                                                          "restoreformer_plus_plus")},
}


@pytest.mark.parametrize("name", list(FACE_STACK))
def test_face_stack_contracts_equal_models_md(name: str) -> None:
    s = MODELS[name]
    size, layout, channels, norm = FACE_STACK[name]
    assert (s.size, s.layout, s.channels) == (size, layout, channels)
    x = np.array([0.0, 127.5, 255.0])
    got = np.stack([(x / 255 - s.mean[c]) / s.std[c] for c in range(3)])
    want = {"x / 255": np.stack([x / 255] * 3), "x / 127.5 - 1": np.stack([x / 127.5 - 1] * 3),
            "imagenet": np.stack([(x / 255 - m) / d for m, d in zip(*IMAGENET)])}[norm]
    np.testing.assert_allclose(got, want, atol=1e-9)
    if s.kind == "enhancer":
        assert (s.template, s.output_range) == ("ffhq_512", "std_mean")
    assert name in NEURAL_MD


def test_unknown_model_lists_the_known_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_spec("inswapper_256")
    assert isinstance(info.value, KeyError) and isinstance(info.value, EngineUserError)
    msg = str(info.value)
    assert msg.startswith("unknown model 'inswapper_256'") and "inswapper_128" in msg and "2dfan4" in msg
    assert "\n" not in msg


def test_crc32_file_and_hash_text(tmp_path: Path, payload: bytes) -> None:
    (tmp_path / "f").write_bytes(payload)
    assert crc32_file(tmp_path / "f") == f"{zlib.crc32(payload):08x}"
    assert parse_hash("DEADBEEF\n") == "deadbeef"
    assert parse_hash("<html>") is None


# --------------------------------------------------------------------------------------------------
# Downloads


def test_download_then_verify(server: AssetServer, make_store: Callable[..., ModelStore],
                              payload: bytes, tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    store = make_store()
    seen: list[tuple[int, int]] = []
    path = store.download("inswapper_128", accept_licence=True, progress=lambda d, t: seen.append((d, t)))
    assert path == tmp_path / "cache" / "inswapper_128.onnx"
    assert path.read_bytes() == payload
    assert (tmp_path / "cache" / "inswapper_128.hash").read_text().strip() == f"{zlib.crc32(payload):08x}"
    assert not (tmp_path / "cache" / "inswapper_128.onnx.part").exists()
    assert seen[0] == (0, SIZE) and seen[-1] == (SIZE, SIZE)
    assert [(r.path.rsplit("/", 1)[1], r.range, r.status) for r in server.log] == [
        ("inswapper_128.hash", None, 200), ("inswapper_128.onnx", None, 200)]
    assert store.verify("inswapper_128") and store.path("inswapper_128") == path
    # Present and verified: a second download is a no-op on the network (the .hash is kept beside it).
    n = len(server.log)
    assert make_store().download("inswapper_128") == path
    assert len(server.log) == n


def test_resume_after_dropped_connection(server: AssetServer, make_store: Callable[..., ModelStore],
                                         payload: bytes) -> None:
    server.publish(INSWAPPER, payload)
    server.cut_after["inswapper_128.onnx"] = CUT
    path = make_store().download("inswapper_128", accept_licence=True)
    assert path.read_bytes() == payload
    first, second = server.requests_for("inswapper_128.onnx")
    assert (first.range, first.status, first.sent) == (None, 200, CUT)
    assert (second.range, second.status) == (f"bytes={CUT}-", 206)
    assert first.sent + second.sent == SIZE < 2 * SIZE


def test_resume_across_runs_from_the_part_file(server: AssetServer, make_store: Callable[..., ModelStore],
                                               payload: bytes, tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    server.cut_after["inswapper_128.onnx"] = CUT
    with pytest.raises(DownloadError) as info:
        make_store(retries=0).download("inswapper_128", accept_licence=True)
    assert f"{server.url}/models-3.0.0/inswapper_128.onnx" in str(info.value)
    part = tmp_path / "cache" / "inswapper_128.onnx.part"
    assert part.stat().st_size == CUT and not part.with_name("inswapper_128.onnx").exists()

    assert make_store(retries=0).download("inswapper_128").read_bytes() == payload
    requests = server.requests_for("inswapper_128.onnx")
    assert [r.range for r in requests] == [None, f"bytes={CUT}-"]
    assert sum(r.sent for r in requests) < 2 * SIZE
    assert not part.exists()


def test_server_that_ignores_range_still_gives_a_correct_file(
        server: AssetServer, make_store: Callable[..., ModelStore], payload: bytes, tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    server.ignore_range = True
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "inswapper_128.onnx.part").write_bytes(payload[:CUT])
    path = make_store().download("inswapper_128", accept_licence=True)
    assert path.read_bytes() == payload
    (req,) = server.requests_for("inswapper_128.onnx")
    assert (req.range, req.status, req.sent) == (f"bytes={CUT}-", 200, SIZE)


def test_whole_part_file_answered_416_is_kept(server: AssetServer, make_store: Callable[..., ModelStore],
                                              payload: bytes, tmp_path: Path) -> None:
    # A run that died between the last byte and the rename: nothing is downloaded again.
    server.publish(INSWAPPER, payload)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "inswapper_128.onnx.part").write_bytes(payload)
    assert make_store().download("inswapper_128", accept_licence=True).read_bytes() == payload
    (req,) = server.requests_for("inswapper_128.onnx")
    assert (req.status, req.sent) == (416, 0)


def test_corrupt_download_is_rejected_and_deleted(server: AssetServer,
                                                  make_store: Callable[..., ModelStore],
                                                  payload: bytes, tmp_path: Path) -> None:
    flipped = bytes(b ^ 0xFF for b in payload[:16]) + payload[16:]
    server.publish(INSWAPPER, flipped, hash_of=payload)
    with pytest.raises(ModelCorruptError) as info:
        make_store().download("inswapper_128", accept_licence=True)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "CRC32" in msg and f"{zlib.crc32(payload):08x}" in msg and "inswapper_128.onnx" in msg
    assert "\n" not in msg
    cache = tmp_path / "cache"
    assert not (cache / "inswapper_128.onnx").exists() and not (cache / "inswapper_128.onnx.part").exists()


def test_corrupted_cached_file_is_reported_then_replaced(
        server: AssetServer, make_store: Callable[..., ModelStore], payload: bytes) -> None:
    server.publish(INSWAPPER, payload)
    store = make_store()
    path = store.download("inswapper_128", accept_licence=True)
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01
    path.write_bytes(bytes(data))
    store = make_store(offline=True)
    assert not store.verify("inswapper_128")
    assert store.status("inswapper_128") == (path, "corrupt")
    with pytest.raises(ModelCorruptError, match="models download inswapper_128"):
        store.path("inswapper_128")
    assert make_store().download("inswapper_128").read_bytes() == payload  # licence remembered too


def test_offline_and_missing(server: AssetServer, make_store: Callable[..., ModelStore],
                             tmp_path: Path) -> None:
    store = make_store(offline=True)
    calls: list[Callable[[], Path]] = [lambda: store.path("simswap_256"),
                                       lambda: store.download("simswap_256", accept_licence=True)]
    for call in calls:
        with pytest.raises(ModelMissingError) as info:
            call()
        msg = str(info.value)
        assert "simswap_256.onnx" in msg and str(tmp_path / "models") in msg
        assert f"{server.url}/models-3.0.0/simswap_256.onnx" in msg and "\n" not in msg
    assert server.log == []


def test_file_placed_by_hand_is_found_without_network(server: AssetServer,
                                                      make_store: Callable[..., ModelStore],
                                                      payload: bytes, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "inswapper_128.onnx").write_bytes(payload)
    (models / "inswapper_128.hash").write_text(f"{zlib.crc32(payload):08x}")
    store = make_store(offline=True)
    assert store.path("inswapper_128") == models / "inswapper_128.onnx"
    assert store.download("inswapper_128") == models / "inswapper_128.onnx"
    assert store.verify("inswapper_128")
    assert server.log == []


def test_file_placed_by_hand_without_its_hash(server: AssetServer, make_store: Callable[..., ModelStore],
                                              payload: bytes, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "inswapper_128.onnx").write_bytes(payload)
    offline = make_store(offline=True)
    assert offline.status("inswapper_128") == (models / "inswapper_128.onnx", "unverified")
    with pytest.raises(ModelMissingError, match="inswapper_128.hash"):
        offline.path("inswapper_128")
    # Online, the .hash is fetched once and kept beside the file for later offline runs.
    server.publish(INSWAPPER, payload)
    assert make_store().verify("inswapper_128")
    assert [r.path.rsplit("/", 1)[1] for r in server.log] == ["inswapper_128.hash"]
    assert offline.verify("inswapper_128")


def test_corrupt_file_placed_by_hand_is_not_deleted(server: AssetServer,
                                                    make_store: Callable[..., ModelStore],
                                                    payload: bytes, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "inswapper_128.onnx").write_bytes(payload[:-1])
    (models / "inswapper_128.hash").write_text(f"{zlib.crc32(payload):08x}")
    with pytest.raises(ModelCorruptError, match="replace it with"):
        make_store().download("inswapper_128", accept_licence=True)
    assert (models / "inswapper_128.onnx").exists()


def test_licence_refused_without_accept(server: AssetServer, make_store: Callable[..., ModelStore],
                                        payload: bytes) -> None:
    server.publish(INSWAPPER, payload)
    store = make_store()
    asked: list[str] = []

    def refuse(text: str) -> bool:
        asked.append(text)
        return False

    for confirm in (None, refuse):
        with pytest.raises(LicenceNotAcceptedError) as info:
            store.download("inswapper_128", confirm=confirm)
        assert "--accept-licence" in str(info.value) and "non-commercial" in str(info.value)
    assert len(asked) == 1 and "non-commercial (InsightFace)" in asked[0]
    assert server.log == []  # refused before any request


def test_licence_is_asked_once_then_remembered(server: AssetServer, make_store: Callable[..., ModelStore],
                                               payload: bytes, tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    asked: list[str] = []

    def confirm(text: str) -> bool:
        asked.append(text)
        return True

    path = make_store().download("inswapper_128", confirm=confirm)
    assert len(asked) == 1
    path.unlink()
    make_store().download("inswapper_128", confirm=confirm)  # a new store reads the record from disk
    assert len(asked) == 1 and make_store().licence_accepted("inswapper_128")
    record = json.loads((tmp_path / "cache" / LICENCES_FILE).read_text())
    assert record == {"accepted": {"inswapper_128": "non-commercial (InsightFace)"}}
    assert not make_store().licence_accepted("inswapper_128_fp16")


def test_list_statuses(server: AssetServer, make_store: Callable[..., ModelStore], payload: bytes,
                       tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    make_store().download("inswapper_128", accept_licence=True)
    models = tmp_path / "models"
    models.mkdir()
    (models / "simswap_256.onnx").write_bytes(payload)
    (models / "simswap_256.hash").write_text("00000000")
    (models / "ghost_1_256.onnx").write_bytes(payload)  # no .hash, and we are offline
    rows = make_store(offline=True).list()
    assert [s.name for s, _p, _st in rows] == list(MODELS)
    got = {s.name: (p, st) for s, p, st in rows}
    assert got["inswapper_128"] == (tmp_path / "cache" / "inswapper_128.onnx", "ok")
    assert got["simswap_256"] == (models / "simswap_256.onnx", "corrupt")
    assert got["ghost_1_256"] == (models / "ghost_1_256.onnx", "unverified")
    assert {st for n, (_p, st) in got.items()
            if n not in ("inswapper_128", "simswap_256", "ghost_1_256")} == {"missing"}


def test_http_error_names_the_url(server: AssetServer, make_store: Callable[..., ModelStore]) -> None:
    with pytest.raises(DownloadError) as info:
        make_store().download("uniface_256", accept_licence=True)
    msg = str(info.value)
    assert msg.startswith(f"HTTP 404 Not Found from {server.url}/models-3.0.0/uniface_256.hash")
    assert "\n" not in msg


def test_timeout_names_the_url(server: AssetServer, tmp_path: Path, payload: bytes) -> None:
    server.publish(INSWAPPER, payload)
    server.stall.add("inswapper_128.hash")
    store = ModelStore(tmp_path / "models", cache_dir=tmp_path / "cache", base_url=server.url, timeout=0.3)
    with pytest.raises(DownloadError, match=r"timed out after 0\.3 s .*inswapper_128\.hash"):
        store.download("inswapper_128", accept_licence=True)


# --------------------------------------------------------------------------------------------------
# The `models` sub-app


@pytest.fixture
def cli(server: AssetServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    monkeypatch.setenv("SWAPSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SWAPSTREAM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("SWAPSTREAM_ZOO_URL", server.url)
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps tables at the console width
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(models_app, list(args), input=input)
    return invoke


def test_cli_list(cli: Callable[..., Result]) -> None:
    res = cli("list", "--offline")
    assert res.exit_code == 0, res.output
    for name in MODELS:
        assert name in res.stdout
    assert "missing" in res.stdout and "non-commercial (InsightFace)" in res.stdout


def test_cli_download_with_accept_flag_and_converter(cli: Callable[..., Result], server: AssetServer,
                                                     payload: bytes, tmp_path: Path) -> None:
    server.publish(get_spec("ghost_1_256"), payload)
    server.publish(get_spec("crossface_ghost"), payload[:5000])
    res = cli("download", "ghost_1_256", "--accept-licence")
    assert res.exit_code == 0, res.output
    assert "Apache-2.0" in res.stderr and "OpenRAIL-MS" in res.stderr
    assert "ok  ghost_1_256" in res.stdout and "ok  crossface_ghost" in res.stdout
    assert (tmp_path / "cache" / "crossface_ghost.onnx").read_bytes() == payload[:5000]


def test_cli_download_asks_the_licence_once(cli: Callable[..., Result], server: AssetServer,
                                            payload: bytes, tmp_path: Path) -> None:
    server.publish(INSWAPPER, payload)
    for answer in ("n\n", None):  # "no", then no answer at all (stdin closed)
        res = cli("download", "inswapper_128", input=answer)
        assert isinstance(res.exception, LicenceNotAcceptedError)
        assert "--accept-licence" in str(res.exception)
    assert server.log == []
    res = cli("download", "inswapper_128", input="y\n")
    assert res.exit_code == 0, res.output
    assert "non-commercial (InsightFace)" in res.stderr
    (tmp_path / "cache" / "inswapper_128.onnx").unlink()
    res = cli("download", "inswapper_128")
    assert res.exit_code == 0 and "Accept this licence" not in res.output


def test_cli_download_errors(cli: Callable[..., Result]) -> None:
    res = cli("download", "no_such_model", "--accept-licence")
    assert isinstance(res.exception, UnknownModelError)
    res = cli("download", "simswap_256", "--offline")
    assert isinstance(res.exception, ModelMissingError)
    assert "simswap_256.onnx" in str(res.exception)


def test_cli_verify(cli: Callable[..., Result], server: AssetServer, payload: bytes,
                    tmp_path: Path) -> None:
    res = cli("verify")
    assert res.exit_code == 0 and "no models" in res.stdout
    server.publish(INSWAPPER, payload)
    assert cli("download", "inswapper_128", "--accept-licence", "-q").exit_code == 0
    res = cli("verify", "--offline")
    assert res.exit_code == 0 and re.search(r"ok\s+inswapper_128", res.stdout)
    (tmp_path / "cache" / "inswapper_128.onnx").write_bytes(payload[::-1])
    res = cli("verify", "inswapper_128", "--offline")
    assert isinstance(res.exception, ModelCorruptError)
    assert "inswapper_128 (corrupt)" in str(res.exception) and "\n" not in str(res.exception)
    res = cli("verify", "simswap_256", "--offline")
    assert isinstance(res.exception, ModelMissingError)
