"""Disclosure: the visible label, the mark in every changed frame, the container's metadata, and
`swapstream verify` on what the jobs wrote.

Jobs run for real on short clips of the demo's portrait; outputs are decoded and checked, not only
found on disk.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream.config import Config, load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, read_frames, render_target_frame, write_demo_clip  # noqa: E402
from swapstream.disclosure import SYNTHETIC_TAGS, Disclosure, draw_label, render_label  # noqa: E402
from swapstream.runtime.live import LiveJob  # noqa: E402
from swapstream.runtime.run import RunJob  # noqa: E402
from swapstream.types import Frame  # noqa: E402
from swapstream.verify import verify  # noqa: E402
from swapstream.watermark import detect, luma_of  # noqa: E402

TIMEOUT = 120


def noisy_frame(h: int = 360, w: int = 640, seed: int | None = None) -> np.ndarray:
    """Random but smooth RGB content in 30..225 (no clipping by the label or the mark)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(30, 226, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    import cv2

    return cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)


# -- the label ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["bottom-left", "bottom-right", "top-left", "top-right"])
def test_label_sits_in_its_corner_and_touches_nothing_else(position: str) -> None:
    cfg = load_config(overrides=[f"disclosure.position={position}"]).disclosure
    h, w = 360, 640
    patch = render_label(h, w, cfg)
    assert patch is not None
    ph, pw = patch.alpha.shape
    # Text height ~4% of the frame (14 px here), so the box is a few times that, in the corner.
    assert 14 <= ph <= 40 and 60 <= pw <= 200
    top, left = position.startswith("top"), position.endswith("left")
    margin = round(0.02 * h)
    assert patch.y0 == (margin if top else h - margin - ph)
    assert patch.x0 == (margin if left else w - margin - pw)
    frame = noisy_frame(h, w)
    out = frame.copy()
    draw_label(out, patch)
    changed = np.any(out != frame, axis=2)
    ys, xs = np.nonzero(changed)
    assert ys.min() >= patch.y0 and ys.max() < patch.y0 + ph
    assert xs.min() >= patch.x0 and xs.max() < patch.x0 + pw
    box = out[patch.y0:patch.y0 + ph, patch.x0:patch.x0 + pw].astype(int)
    # White text on a darkened box: bright strokes and a darker background than the picture's.
    assert (box.min(axis=2) >= 240).sum() >= 40
    assert np.median(box) < np.median(frame[patch.y0:patch.y0 + ph, patch.x0:patch.x0 + pw])


def test_label_blend_is_the_documented_integer_formula() -> None:
    cfg = load_config().disclosure
    patch = render_label(720, 1280, cfg)
    assert patch is not None
    frame = noisy_frame(720, 1280)
    out = frame.copy()
    draw_label(out, patch)
    h, w = patch.alpha.shape
    x = frame[patch.y0:patch.y0 + h, patch.x0:patch.x0 + w].astype(np.float64)
    a = patch.alpha[..., None].astype(np.float64) / 255
    want = x * (1 - a) + patch.premul.astype(np.float64) * 1.0
    got = out[patch.y0:patch.y0 + h, patch.x0:patch.x0 + w].astype(np.float64)
    # Integer arithmetic with rounding to nearest: within half a level of the exact blend.
    assert np.abs(got - want).max() <= 0.5 + 1e-9


def test_label_text_and_size_are_configurable() -> None:
    a = render_label(720, 1280, load_config().disclosure)
    b = render_label(720, 1280, load_config(overrides=["disclosure.text=Synthetic video - deepfake",
                                                       "disclosure.size=0.08"]).disclosure)
    assert a is not None and b is not None
    assert b.alpha.shape[0] > 1.6 * a.alpha.shape[0] and b.alpha.shape[1] > 3 * a.alpha.shape[1]
    # A narrow frame shrinks the text to fit; a frame too small for 8 px text gets none.
    n = render_label(400, 120, load_config().disclosure)
    assert n is not None and n.x0 >= 2 and n.x0 + n.alpha.shape[1] <= 118
    assert render_label(20, 30, load_config().disclosure) is None


# -- what each kind of job does by default ------------------------------------------------------------


def test_defaults_label_live_outputs_only(config: Config, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="swapstream.disclosure"):
        assert Disclosure(config, live=True).label_on
        assert not Disclosure(config, live=False).label_on
        assert not caplog.records
        Disclosure(load_config(overrides=["disclosure.label_live=false"]), live=True)
        assert any("label is OFF" in r.getMessage() for r in caplog.records)
        caplog.clear()
        d = Disclosure(load_config(overrides=["watermark.enabled=false"]), live=False)
        assert d.watermarker is None
        assert any("watermark is OFF" in r.getMessage() for r in caplog.records)
    assert LiveJob.LIVE and not RunJob.LIVE


def test_apply_marks_changed_frames_only(config: Config) -> None:
    frame = noisy_frame(360, 640, seed=5)
    file_d = Disclosure(config, live=False)
    same = frame.copy()
    assert not file_d.apply(same, swapped=False)       # nothing changed: no label, no mark
    assert np.array_equal(same, frame)
    swapped = frame.copy()
    assert file_d.apply(swapped, swapped=True)
    d = detect(luma_of(swapped))
    assert d.found and d.payload == file_d.payload
    live_d = Disclosure(config, live=True)
    labelled = frame.copy()
    assert live_d.apply(labelled, swapped=False)       # the label changes it, so it is marked too
    assert detect(luma_of(labelled)).payload == live_d.payload
    assert live_d.frames_labelled == 1 and live_d.frames_marked == 1
    assert file_d.payload.stream_id != live_d.payload.stream_id   # one id per stream
    fixed = Disclosure(load_config(overrides=["watermark.stream_id=0x00C0FFEE"]), live=False)
    assert fixed.payload.stream_id == 0xC0FFEE and fixed.payload.product_id == 0x5353


@pytest.mark.parametrize("scheme", ["v1", "v2"])
def test_warm_up_builds_the_size_ahead_and_changes_nothing_else(scheme: str) -> None:
    """`warm_up` (run before a file's stream reads its first frame) builds the label and the mark for a size, counts
    nothing, and leaves `apply`'s result on a real frame what a fresh disclosure gives."""
    cfg = load_config(overrides=[f"watermark.scheme={scheme}", "watermark.stream_id=0x00ABCDEF"])
    warm, cold = Disclosure(cfg, live=True), Disclosure(cfg, live=True)
    warm.warm_up(np.zeros((360, 640, 3), np.uint8))
    assert (360, 640, -1) in warm._patches and not cold._patches
    assert warm.frames_labelled == warm.frames_marked == 0
    frame = noisy_frame(360, 640, seed=11)
    a, b = frame.copy(), frame.copy()
    assert warm.apply(a, swapped=True) and cold.apply(b, swapped=True)
    assert not np.array_equal(a, frame) and np.array_equal(a, b)
    assert warm.frames_labelled == warm.frames_marked == 1


def test_a_run_builds_the_label_and_mark_for_the_inputs_size_first(config: Config, clip: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's stream builds the disclosure for the input's size before its first frame (built on
    the first frame, the mark's pattern took 40 ms at 720p on the CPU, inside the run's time), once."""
    calls: list[tuple[str, tuple[int, ...]]] = []
    warm_up, apply = Disclosure.warm_up, Disclosure.apply

    def warming(self: Disclosure, scratch: np.ndarray) -> None:
        calls.append(("warm_up", scratch.shape))
        warm_up(self, scratch)

    def applying(self: Disclosure, data: np.ndarray, swapped: bool) -> bool:
        calls.append(("apply", data.shape))
        return apply(self, data, swapped)

    monkeypatch.setattr(Disclosure, "warm_up", warming)
    monkeypatch.setattr(Disclosure, "apply", applying)
    run_job(config, clip, tmp_path / "out.mp4")
    assert calls[0] == ("warm_up", (360, 640, 3)), calls[:3]
    assert calls[1:] == [("apply", (360, 640, 3))] * 10


def test_live_job_labels_and_marks_every_frame(config: Config, tmp_path: Path) -> None:
    """`swapstream live`'s job (a runtime stream) with the live default: every frame of its HLS
    output, decoded, shows the label over the source picture and carries the mark."""

    from .clips import concat_hls

    clip = tmp_path / "clip.mp4"
    assert write_demo_clip(clip, grace_hopper(), seconds=1.0, fps=10, size=(640, 360)) == 10
    job = LiveJob(config, device="cpu")
    job.set_source_image(astronaut(), "astronaut")
    stats = job.run_live(str(clip), hls_dir=tmp_path / "hls")
    job.close()
    assert stats.frames_out >= 8 and stats.faces_swapped >= 8, stats
    patch = render_label(360, 640, config.disclosure)
    assert patch is not None
    box = (slice(patch.y0, patch.y0 + patch.alpha.shape[0]), slice(patch.x0, patch.x0 + patch.alpha.shape[1]))
    with av.open(str(concat_hls(tmp_path / "hls"))) as c:
        frames = [(f.to_ndarray(format="rgb24"), float(f.time)) for f in c.decode(video=0)]
    assert len(frames) >= 8
    for img, t in frames:
        src = render_target_frame(grace_hopper(), t, (640, 360))
        assert np.abs(img[box].astype(int) - src[box]).mean() > 20   # the label is there
        d = detect(luma_of(img))
        assert d.found and d.payload == job.disclosure.payload


# -- files: label, mark and metadata, read back ------------------------------------------------------


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("disclosure") / "clip.mp4"
    write_demo_clip(path, grace_hopper(), seconds=1.0, fps=10, size=(640, 360))
    return path


def run_job(cfg: Config, clip: Path, out: Path) -> RunJob:
    job = RunJob(cfg, device="cpu")
    try:
        job.set_source_image(astronaut(), "astronaut")
        stats = job.run(clip, out)
        assert stats.frames == 10 and stats.frames_swapped == 10
    finally:
        job.close()
    return job


def test_file_output_is_marked_tagged_and_labelled_on_request(clip: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.mkv"   # Matroska keeps every tag
    job = run_job(load_config(overrides=["disclosure.label_files=true"]), clip, out)
    with av.open(str(out)) as c:
        tags = {k.lower(): v for k, v in c.metadata.items()}
    for key in ("comment", "description", "digital_source_type"):
        assert tags[key] == SYNTHETIC_TAGS[key], key
    rep = verify(str(out))
    assert rep.marked >= 0.95 * len(rep.frames) and len(rep.frames) == 10
    assert set(rep.payloads) == {job.disclosure.payload}
    assert rep.combined is not None and rep.combined.payload == job.disclosure.payload
    patch = render_label(360, 640, job.config.disclosure)
    assert patch is not None
    a, b = read_frames(clip, [3]), read_frames(out, [3])
    box = (slice(patch.y0, patch.y0 + patch.alpha.shape[0]), slice(patch.x0, patch.x0 + patch.alpha.shape[1]))
    assert np.abs(b[3][box].astype(int) - a[3][box]).mean() > 20


def test_file_output_by_default_is_marked_not_labelled(clip: Path, tmp_path: Path) -> None:
    out = tmp_path / "plain.mp4"
    job = run_job(load_config(), clip, out)
    with av.open(str(out)) as c:
        assert "AI-modified" in c.metadata["comment"] and "synthetic" in c.metadata["description"].lower()
    rep = verify(str(out))
    assert rep.marked >= 0.95 * len(rep.frames)
    assert set(rep.payloads) == {job.disclosure.payload}
    patch = render_label(360, 640, job.config.disclosure)
    assert patch is not None
    a, b = read_frames(clip, [3]), read_frames(out, [3])
    box = (slice(patch.y0, patch.y0 + patch.alpha.shape[0]), slice(patch.x0, patch.x0 + patch.alpha.shape[1]))
    # Only the mark and two x264 encodes there: a few levels, not a label.
    assert np.abs(b[3][box].astype(int) - a[3][box]).mean() < 6


def test_verify_keeps_few_frames_and_counts_them_all(clip: Path, tmp_path: Path) -> None:
    """A live URL without --max-frames never ends: the report keeps the first frames only, while
    the summary still counts every frame, exactly as when all are kept."""
    out = tmp_path / "swapped.mp4"
    job = run_job(load_config(), clip, out)
    full = verify(str(out), keep_frames=None)
    seen: list[int] = []
    few = verify(str(out), keep_frames=3, on_frame=lambda r: seen.append(r.index))
    assert len(full.frames) == 10 and full.frame_count == 10 and full.marked == 10
    assert [f.index for f in few.frames] == [0, 1, 2] and seen == list(range(10))
    assert few.frame_count == 10 and few.marked == 10 and few.payloads == {job.disclosure.payload: 10}
    assert few.payloads == full.payloads and few.found
    doc, whole = few.to_dict(), full.to_dict()
    assert doc["summary"] == whole["summary"] and doc["summary"]["frames"] == 10
    assert len(doc["frames"]) == 3 and doc["frames"] == whole["frames"][:3]
    assert doc["frames_omitted"] == 7 and whole["frames_omitted"] == 0
    none = verify(str(out), keep_frames=0)   # what text mode asks for: lines printed, none kept
    assert none.frames == [] and none.to_dict()["summary"] == whole["summary"]


def test_live_outputs_write_the_synthetic_tags(tmp_path: Path) -> None:
    from swapstream.live.streams import LiveWriter

    frames = [noisy_frame(240, 320, seed=i) for i in range(12)]
    flv = tmp_path / "out.flv"
    w = LiveWriter(str(flv), width=320, height=240, fps=10, time_base=Fraction(1, 10), kind="rtmp")
    for i, f in enumerate(frames):
        w.write(Frame(f, pts=i, time_base=Fraction(1, 10)))
    w.close()
    with av.open(str(flv)) as c:
        assert c.metadata.get("comment") == SYNTHETIC_TAGS["comment"]
        assert c.metadata.get("digital_source_type") == SYNTHETIC_TAGS["digital_source_type"]
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        pytest.skip("ffprobe (Debian ffmpeg) is needed to read MPEG-TS service names")
    hls = tmp_path / "hls" / "index.m3u8"
    w = LiveWriter(str(hls), width=320, height=240, fps=10, time_base=Fraction(1, 10), kind="hls")
    for i, f in enumerate(frames):
        w.write(Frame(f, pts=i, time_base=Fraction(1, 10)))
    w.close()
    seg = sorted(hls.parent.glob("*.ts"))[0]
    res = subprocess.run([ffprobe, "-v", "error", "-show_programs", "-of", "json", str(seg)],
                         capture_output=True, text=True, timeout=30)
    tags = json.loads(res.stdout)["programs"][0]["tags"]
    assert tags["service_name"] == SYNTHETIC_TAGS["service_name"]
    assert tags["service_provider"] == "SwapStream"


# -- swapstream verify, as a user runs it ------------------------------------------------------------


def cli(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "swapstream.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_verify_command(clip: Path, tmp_path: Path) -> None:
    out = tmp_path / "swapped.mp4"
    job = run_job(load_config(overrides=["watermark.stream_id=0x12345678"]), clip, out)
    assert job.disclosure.payload.stream_id == 0x12345678
    res = cli("verify", out, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("frame ")]
    assert len(lines) == 10
    assert sum("marked     product 0x5353 stream 0x12345678" in ln for ln in lines) >= 10
    assert re.search(r"^marked frames\s+10 \(100\.0%\)", res.stdout, re.M), res.stdout
    assert "SwapStream watermark FOUND" in res.stdout
    assert "comment=AI-modified" in res.stdout

    res = cli("verify", out, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["summary"]["marked_frames"] == 10 and doc["summary"]["mark_found"] is True
    assert doc["summary"]["payloads"] == [{"product_id": 0x5353, "stream_id": 0x12345678, "frames": 10}]
    assert len(doc["frames"]) == 10 and all(f["marked"] for f in doc["frames"])
    assert doc["frames_omitted"] == 0

    # The unmodified input: no mark, exit 1.
    res = cli("verify", clip, "--summary", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no SwapStream watermark found" in res.stdout
    assert not [ln for ln in res.stdout.splitlines() if ln.startswith("frame ")]

    # Bad input: exit 2 and one error line naming it.
    for bad, needle in ((tmp_path / "missing.mp4", "does not exist"), (tmp_path, "folder")):
        res = cli("verify", bad, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        errs = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(errs) == 1 and f"'{bad}'" in errs[0] and needle in errs[0], res.stderr
    text = tmp_path / "notes.mp4"
    text.write_text("not a video\n" * 50)
    res = cli("verify", text, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr and f"'{text}'" in res.stderr
