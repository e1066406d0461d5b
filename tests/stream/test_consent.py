"""Consent: a source face is used only with a record of who agreed, when, for what, and which picture.

The store is a real JSON file in the test's own folder (SWAPSTREAM_CONSENT_STORE or the config key),
never the user's. Jobs and the CLI run for real; the CLI as a subprocess, as a user meets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from swapstream.config import Config, load_config
from swapstream.consent import BUILTIN_PATH, ConsentStore, file_digest, image_digest
from swapstream.demo import astronaut, grace_hopper
from swapstream.errors import USER_ERRORS, ConsentError, InputError
from swapstream.runtime.run import RunJob

TIMEOUT = 120


@pytest.fixture
def store_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "consent" / "consent.json"
    monkeypatch.setenv("SWAPSTREAM_CONSENT_STORE", str(path))
    return path


@pytest.fixture(scope="module")
def stranger() -> np.ndarray:
    """A face picture nobody recorded consent for: the astronaut mirrored (new pixels, same face,
    which the detector still finds)."""
    return np.ascontiguousarray(astronaut()[:, ::-1])


def save(path: Path, rgb: np.ndarray) -> Path:
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return path


# -- the built-in records ----------------------------------------------------------------------------


def test_builtin_records_match_the_demo_portraits() -> None:
    """If a pinned package ever ships different pixels, this fails here rather than the demo."""
    import matplotlib.cbook as cbook
    import skimage.data

    recs = {r.id: r for r in ConsentStore(Path("/nonexistent/consent.json")).builtin_records()}
    assert recs["builtin-astronaut"].image_sha256 == image_digest(astronaut())
    assert recs["builtin-grace-hopper"].image_sha256 == image_digest(grace_hopper())
    assert recs["builtin-astronaut"].file_sha256 == file_digest(
        Path(skimage.data.__file__).parent / "astronaut.png")
    assert recs["builtin-grace-hopper"].file_sha256 == file_digest(
        cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    assert all(r.builtin and "public domain" in r.given_by for r in recs.values())
    assert json.loads(BUILTIN_PATH.read_text())["format"] == "swapstream-consent-v1"


def test_demo_portrait_needs_no_setup(store_path: Path, config: Config) -> None:
    job = RunJob(config)
    try:
        job.set_source_image(astronaut(), "astronaut")
        assert job.consent is not None and job.consent.id == "builtin-astronaut"
    finally:
        job.close()
    assert not store_path.exists()  # looking records up writes nothing


# -- enforcement in the job --------------------------------------------------------------------------


def test_job_refuses_a_face_without_consent(store_path: Path, config: Config,
                                            stranger: np.ndarray) -> None:
    job = RunJob(config)
    try:
        with pytest.raises(ConsentError) as e:
            job.set_source_image(stranger, "uploaded face")
        msg = str(e.value)
        assert "\n" not in msg
        for needle in ("no consent record", "uploaded face", image_digest(stranger)[:12],
                       "swapstream consent add", "--by", "--purpose", str(store_path)):
            assert needle in msg, (needle, msg)
        assert isinstance(e.value, USER_ERRORS) and e.value.exit_code == 2
        assert job.consent is None
        # Recorded through the API, the same picture is then accepted, and the record is the
        # one the job keeps for its log.
        rec = ConsentStore().add(stranger, given_by="Jane Doe", purpose="unit test", given_at="2026-11-01")
        job.set_source_image(stranger, "uploaded face")
        assert job.consent == rec
        assert "Jane Doe" in job.consent.summary() and "2026-11-01" in job.consent.summary()
    finally:
        job.close()


def test_record_matches_by_pixels_and_by_file(tmp_path: Path, store_path: Path, config: Config,
                                              stranger: np.ndarray) -> None:
    jpg = save(tmp_path / "face.jpg", stranger)
    store = ConsentStore()
    store.add(cv2.cvtColor(cv2.imread(str(jpg)), cv2.COLOR_BGR2RGB), given_by="Jane Doe",
              purpose="test", path=jpg)
    job = RunJob(config)
    try:
        job.set_source(jpg)                      # the same file
        # A lossless copy of the decoded picture: other bytes, same pixels.
        png = save(tmp_path / "copy.png", cv2.cvtColor(cv2.imread(str(jpg)), cv2.COLOR_BGR2RGB))
        assert file_digest(png) != file_digest(jpg)
        job.set_source(png)
        # A re-encoded JPEG has other pixels and other bytes: it is another picture.
        again = tmp_path / "again.jpg"
        assert cv2.imwrite(str(again), cv2.imread(str(jpg)), [cv2.IMWRITE_JPEG_QUALITY, 70])
        with pytest.raises(ConsentError, match="again.jpg"):
            job.set_source(again)
    finally:
        job.close()


def test_config_key_points_at_another_store(tmp_path: Path, store_path: Path,
                                            stranger: np.ndarray) -> None:
    other = tmp_path / "elsewhere.json"
    rec = ConsentStore(other).add(stranger, given_by="Jane Doe", purpose="test")
    cfg = load_config(overrides=[f"consent.store={other}"])
    job = RunJob(cfg)
    try:
        job.set_source_image(stranger, "face")
        assert job.consent == rec  # found in the other store
    finally:
        job.close()
    job = RunJob(load_config())  # the environment's store has no record
    try:
        with pytest.raises(ConsentError):
            job.set_source_image(stranger, "face")
    finally:
        job.close()


# -- the store ---------------------------------------------------------------------------------------


def test_store_add_list_remove(store_path: Path, stranger: np.ndarray) -> None:
    store = ConsentStore()
    a = store.add(stranger, given_by="Jane Doe", purpose="first", given_at="2026-10-01")
    b = store.add(np.ascontiguousarray(stranger[::-1]), given_by="John Roe", purpose="second")
    data = json.loads(store_path.read_text())
    assert data["format"] == "swapstream-consent-v1"
    assert [r["id"] for r in data["records"]] == [a.id, b.id]
    assert {r["given_by"] for r in data["records"]} == {"Jane Doe", "John Roe"}
    ids = [r.id for r in store.records()]
    assert ids[:2] == ["builtin-astronaut", "builtin-grace-hopper"] and ids[2:] == [a.id, b.id]
    assert store.remove(a.id) == [a]
    assert [r.id for r in store.user_records()] == [b.id]
    assert store.remove(b.image_sha256[:10]) == [b]      # by the start of its image hash
    assert store.user_records() == []
    with pytest.raises(InputError, match="built in"):
        store.remove("builtin-astronaut")
    with pytest.raises(InputError, match="no consent record 'nosuch'"):
        store.remove("nosuch")


@pytest.mark.parametrize("kwargs,needle", [
    ({"given_by": " ", "purpose": "x"}, "--by"),
    ({"given_by": "Jane", "purpose": ""}, "--purpose"),
    ({"given_by": "Jane", "purpose": "x", "given_at": "yesterday"}, "YYYY-MM-DD"),
    ({"given_by": "Jane", "purpose": "x", "given_at": "2024-01-01garbage"}, "'2024-01-01garbage' is not a date"),
    ({"given_by": "Jane", "purpose": "x", "given_at": "2024-01-01T25:00"}, "YYYY-MM-DD"),
    ({"given_by": "Jane", "purpose": "x", "given_at": "2999-01-01"}, "future"),
])
def test_store_refuses_incomplete_records(store_path: Path, stranger: np.ndarray,
                                          kwargs: dict[str, str], needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        ConsentStore().add(stranger, **kwargs)
    assert not store_path.exists()


@pytest.mark.parametrize("given,stored", [
    ("2026-01-02", "2026-01-02"),
    ("20260102", "2026-01-02"),
    (" 2026-01-02 ", "2026-01-02"),
    ("2026-01-02 14:30", "2026-01-02T14:30:00"),
    ("2026-01-02T14:30:05.250+02:00", "2026-01-02T14:30:05+02:00"),
    ("2026-01-02T14:30Z", "2026-01-02T14:30:00+00:00"),
])
def test_store_keeps_the_date_in_its_normal_form(store_path: Path, stranger: np.ndarray,
                                                 given: str, stored: str) -> None:
    rec = ConsentStore().add(stranger, given_by="Jane", purpose="x", given_at=given)
    assert rec.given_at == stored
    assert json.loads(store_path.read_text())["records"][0]["given_at"] == stored


def test_a_corrupt_store_is_named(store_path: Path, stranger: np.ndarray) -> None:
    store_path.parent.mkdir(parents=True)
    store_path.write_text("{not json")
    with pytest.raises(ConsentError, match=str(store_path)):
        ConsentStore().require(stranger, "face")
    store_path.write_text(json.dumps({"something": "else"}))
    with pytest.raises(ConsentError, match="not a SwapStream consent store"):
        ConsentStore().records()


# -- the command line --------------------------------------------------------------------------------


def cli(*args: object, cwd: Path, store: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1", SWAPSTREAM_CONSENT_STORE=str(store))
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "swapstream.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    shown = f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert res.returncode == 2, shown
    assert "Traceback" not in res.stdout + res.stderr, shown
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, shown
    return lines[0]


def test_cli_refuses_then_records_then_runs(tmp_path: Path, stranger: np.ndarray) -> None:
    """The whole workflow as a user meets it: refused with the command to run, consent recorded and
    listed, the run then allowed and its log naming the record, consent withdrawn, refused again."""
    pytest.importorskip("av")
    from swapstream.demo import write_demo_clip

    store = tmp_path / "store.json"
    face = save(tmp_path / "jane.png", stranger)
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=0.4, fps=10, size=(640, 360))
    out = tmp_path / "out.mp4"

    line = one_error_line(cli("run", "-s", face, "-i", clip, "-o", out, "-q", cwd=tmp_path, store=store))
    assert "no consent record" in line and f"swapstream consent add '{face}'" in line
    assert not out.exists()

    res = cli("consent", "add", face, "--by", "Jane Doe", "--purpose", "birthday video",
              "--date", "2026-11-20", cwd=tmp_path, store=store)
    assert res.returncode == 0, res.stderr
    rec_id = json.loads(store.read_text())["records"][0]["id"]
    assert f"record {rec_id}: given by Jane Doe on 2026-11-20 for \"birthday video\"" in res.stdout

    res = cli("consent", "list", cwd=tmp_path, store=store)
    assert res.returncode == 0 and rec_id in res.stdout and "builtin-astronaut" in res.stdout
    res = cli("consent", "check", face, cwd=tmp_path, store=store)
    assert res.returncode == 0 and rec_id in res.stdout

    res = cli("run", "-s", face, "-i", clip, "-o", out, "-q", cwd=tmp_path, store=store)
    assert res.returncode == 0, res.stderr
    assert f"consent: record {rec_id}: given by Jane Doe" in res.stderr   # the run's log
    assert "watermark: product 0x5353 stream 0x" in res.stderr
    assert out.is_file()

    res = cli("consent", "remove", rec_id, cwd=tmp_path, store=store)
    assert res.returncode == 0 and f"removed record {rec_id}" in res.stdout
    one_error_line(cli("consent", "check", face, cwd=tmp_path, store=store))
    out.unlink()
    one_error_line(cli("run", "-s", face, "-i", clip, "-o", out, "-q", cwd=tmp_path, store=store))
    assert not out.exists()


def test_cli_consent_add_bad_input(tmp_path: Path) -> None:
    store = tmp_path / "store.json"
    missing = tmp_path / "nobody.png"
    line = one_error_line(cli("consent", "add", missing, "--by", "X", "--purpose", "Y", cwd=tmp_path,
                              store=store))
    assert f"'{missing}'" in line and "does not exist" in line
    face = save(tmp_path / "f.png", np.full((64, 64, 3), 90, np.uint8))
    line = one_error_line(cli("consent", "add", face, "--by", "X", "--purpose", "Y", "--date", "13/01/2026",
                              cwd=tmp_path, store=store))
    assert "YYYY-MM-DD" in line
    line = one_error_line(cli("consent", "add", face, "--by", "X", "--purpose", "Y", "--date",
                              "2024-01-01garbage", cwd=tmp_path, store=store))
    assert "--date" in line and "'2024-01-01garbage' is not a date" in line and "YYYY-MM-DD" in line
    assert not store.exists()


def test_store_errors_say_how_each_command_chooses_another(tmp_path: Path, stranger: np.ndarray) -> None:
    """`swapstream consent` takes --store; run/live/serve take the config key. Each error names the
    one the command in hand accepts."""
    store = tmp_path / "store.json"
    store.write_text("{not json")
    line = one_error_line(cli("consent", "list", "--store", store, cwd=tmp_path, store=tmp_path / "x.json"))
    assert f"'{store}'" in line and "--store PATH" in line and "consent.store" not in line, line
    line = one_error_line(cli("consent", "check", save(tmp_path / "f.png", stranger), cwd=tmp_path,
                              store=store))
    assert "--store PATH" in line and "consent.store" not in line, line
    face = save(tmp_path / "face.png", stranger)
    clip = tmp_path / "in.mp4"
    clip.write_bytes(b"")  # it exists (a missing input is found first); the store is read before it is
    line = one_error_line(cli("run", "-s", face, "-i", clip, "-o", tmp_path / "out.mp4",
                              "-q", cwd=tmp_path, store=store))
    assert f"'{store}'" in line and "--set consent.store=PATH" in line and "--store PATH" not in line, line


GOOD = {"id": "ab12cd34", "given_by": "Jane Doe", "given_at": "2026-01-02", "purpose": "test",
        "image_sha256": "0" * 64}


@pytest.mark.parametrize("record,needle", [
    (5, "not int"),
    ("ab12cd34", "not str"),
    ({"id": "ab12cd34"}, "no given_by, given_at, purpose, image_sha256"),
    ({**GOOD, "colour": "red"}, "unknown fields colour"),
    ({**GOOD, "given_by": 7}, "its given_by is 7"),
    ({**GOOD, "image_sha256": None}, "its image_sha256 is None"),
])
def test_a_malformed_record_is_named_with_the_fix(tmp_path: Path, record: object, needle: str) -> None:
    store = tmp_path / "store.json"
    store.write_text(json.dumps({"format": "swapstream-consent-v1", "records": [GOOD, record]}))
    with pytest.raises(ConsentError, match="malformed record"):
        ConsentStore(store).records()
    for args in (("list",), ("remove", "ab12cd34")):
        line = one_error_line(cli("consent", *args, "--store", store, cwd=tmp_path, store=store))
        for want in (f"'{store}'", "malformed record (number 2", needle, "Repair or delete that record",
                     "remove the file", "--store PATH"):
            assert want in line, (want, line)


def test_a_store_that_cannot_be_written_is_one_error_line(tmp_path: Path, stranger: np.ndarray) -> None:
    face = save(tmp_path / "face.png", stranger)
    lock_is_a_folder = tmp_path / "store.json"
    (tmp_path / "store.json.lock").mkdir()
    under_a_file = tmp_path / "notes.txt" / "store.json"
    (tmp_path / "notes.txt").write_text("x")
    stores = [lock_is_a_folder, under_a_file]
    if Path("/proc/self").is_dir():
        stores.append(Path("/proc/swapstream-consent.json"))   # no files can be made there, even by root
    for store in stores:
        for args in (("add", face, "--by", "Jane", "--purpose", "test"), ("remove", "ab12cd34")):
            line = one_error_line(cli("consent", *args, "--store", store, cwd=tmp_path, store=store))
            assert f"consent store '{store}'" in line and "--store PATH" in line, line


def test_a_failed_write_is_a_consent_error(store_path: Path, stranger: np.ndarray,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*_a: object, **_k: object) -> None:
        raise OSError(30, "Read-only file system")

    import swapstream.consent as consent

    with monkeypatch.context() as m:
        m.setattr(consent.tempfile, "mkstemp", read_only)
        with pytest.raises(ConsentError, match=f"cannot write in '{store_path.parent}'.*Read-only file "
                                               f"system.*--set consent.store=PATH"):
            ConsentStore().add(stranger, given_by="Jane", purpose="test")
    with monkeypatch.context() as m:
        m.setattr(consent.os, "replace", read_only)
        with pytest.raises(ConsentError, match=f"cannot write '{store_path}'.*Read-only file system"):
            ConsentStore().add(stranger, given_by="Jane", purpose="test")
    assert not store_path.exists() and not list(store_path.parent.glob(".consent-*"))
