"""The `swapstream` command line, run for real as a subprocess (`python -m swapstream.cli`).

Bad input of every kind must end in a non-zero exit and ONE line on stderr that starts with "error:" and
names what was wrong (the path, or the config key and value), never in a traceback. The happy path runs
one real swap on a one-second synthetic clip and decodes what it wrote.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

# The GPU machine has no PyAV; these tests run in CI.
av = pytest.importorskip("av")

from swapstream import __version__, demo

CLIP_FRAMES = 10  # write_demo_clip(seconds=1.0, fps=10)
TIMEOUT = 120


# --------------------------------------------------------------------------------------------------
# Helpers


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Plain text on the pipes, whatever the calling terminal asks for: no ANSI codes before "error:".
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        env.pop(key, None)
    env["TERM"] = "dumb"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cli(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `python -m swapstream.cli ARGS` and capture its text output."""
    return subprocess.run(
        [sys.executable, "-m", "swapstream.cli", *map(str, args)],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )


def _show(res: subprocess.CompletedProcess[str]) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"


def assert_user_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A clean user error: non-zero exit, no traceback, exactly one `error:` line holding every needle."""
    assert res.returncode != 0, _show(res)
    assert "Traceback" not in res.stdout + res.stderr, _show(res)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, f"want exactly one line starting with 'error:'\n{_show(res)}"
    line = lines[0]
    for needle in needles:
        assert needle in line, f"{needle!r} is not in the error line {line!r}\n{_show(res)}"
    assert "error:" not in res.stdout, _show(res)
    return line


def count_frames(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def _remux_faststart(src: Path, dst: Path) -> None:
    """Copy an MP4 with its index (moov) moved to the front, as web-ready files have it."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", options={"movflags": "faststart"}) as out:
        streams = {s.index: out.add_stream_from_template(s) for s in inp.streams}
        for packet in inp.demux():
            if packet.dts is None:  # demux's end-of-stream markers
                continue
            packet.stream = streams[packet.stream.index]
            out.mux(packet)


class Assets:
    """Files shared by every test (read-only; each test writes only into its own tmp_path)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.face = root / "face.png"
        self.cat = root / "cat.png"
        self.not_image = root / "face_not_an_image.png"
        self.clip = root / "clip.mp4"
        self.clip_faststart = root / "clip_faststart.mp4"

        rgb = demo.astronaut()
        assert cv2.imwrite(str(self.face), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        from skimage import data

        # Chelsea the cat: a photo with no human face (the detector finds none; see test below).
        cat = np.ascontiguousarray(data.chelsea())
        assert cv2.imwrite(str(self.cat), cv2.cvtColor(cat, cv2.COLOR_RGB2BGR))
        self.not_image.write_text("this is a text file, not a PNG\n")
        n = demo.write_demo_clip(self.clip, demo.grace_hopper(), seconds=1.0, fps=10, size=(640, 360))
        assert n == CLIP_FRAMES
        _remux_faststart(self.clip, self.clip_faststart)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    return Assets(tmp_path_factory.mktemp("cli_assets"))


# --------------------------------------------------------------------------------------------------
# Happy paths


def test_version(tmp_path: Path) -> None:
    res = cli("--version", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert res.stdout.strip() == f"swapstream {__version__}"
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]], ids=["root", "run"])
def test_help(tmp_path: Path, args: list[str]) -> None:
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert "Usage:" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    if args[0] == "run":
        for option in ("--source", "--input", "--output", "--config", "--set", "--quiet"):
            assert option in res.stdout
    else:
        for command in ("run", "demo", "setup", "config"):
            assert re.search(rf"^\W*{command}\b", res.stdout, re.M), res.stdout


def test_run_swaps_a_clip(assets: Assets, tmp_path: Path) -> None:
    out = tmp_path / "swapped.mp4"
    res = cli("run", "--source", assets.face, "--input", assets.clip, "--output", out, "--quiet", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert "Traceback" not in res.stdout + res.stderr
    # --quiet: no progress bar.
    assert "swapping" not in res.stderr, _show(res)
    # The summary: frame count and speed.
    assert re.search(rf"^frames\s+{CLIP_FRAMES}\s*$", res.stdout, re.M), res.stdout
    assert re.search(r"^frames swapped\s+[1-9]\d*\b", res.stdout, re.M), res.stdout
    assert re.search(r"^speed\s+\d+\.\d fps\s*$", res.stdout, re.M), res.stdout
    assert re.search(r"^audio\s+[1-9]\d* packets carried", res.stdout, re.M), res.stdout

    assert count_frames(assets.clip) == CLIP_FRAMES
    assert count_frames(out) == CLIP_FRAMES
    with av.open(str(out)) as c:
        assert len(c.streams.audio) == 1
        video = c.streams.video[0]
        assert (video.codec_context.width, video.codec_context.height) == (640, 360)
        # Outputs are labelled as synthetic.
        assert "AI-modified" in c.metadata.get("comment", "")


def test_the_summary_keeps_each_row_on_one_line_into_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    """Long rows (a file's batch waits past 100 ms a frame) are not wrapped at rich's 80 columns when
    the summary goes to a pipe: a benchmark reads each row whole."""
    from swapstream.cli import _summary
    from swapstream.runtime.run import JobStats

    stats = JobStats(frames=10, frames_swapped=10, faces_swapped=10, seconds=0.41, device="cpu",
                     steps={"queue": 0.4756, "analyse": 0.1379, "swap_wait": 1.5517, "swap": 0.3374,
                            "encode": 0.0043})
    for s in (0.35, 0.38, 123.456):
        stats.latency.add(s)
    _summary(stats, Path("null:"))
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    row = "stage ms/frame  queue 47.56 analyse 13.79 swap-wait 155.17 swap 33.74 encode 0.43"
    assert row in lines and len(row) > 80, lines
    assert any(re.fullmatch(r"latency ms\s+p50 \d+\.\d\d p99 \d+\.\d\d max \d+\.\d\d", line) for line in lines), lines


def test_run_to_the_null_output(assets: Assets, tmp_path: Path) -> None:
    """`-o null:` runs the whole job (decode, analyse, swap, label and mark) and writes nothing: the
    run without its encoder that the GPU benchmark times."""
    res = cli("run", "--source", assets.face, "--input", assets.clip, "--output", "null:", "--quiet", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert re.search(rf"^frames\s+{CLIP_FRAMES}\s*$", res.stdout, re.M), res.stdout
    assert re.search(r"^frames swapped\s+[1-9]\d*\b", res.stdout, re.M), res.stdout
    assert re.search(r"^audio\s+[1-9]\d* packets carried", res.stdout, re.M), res.stdout
    assert re.search(r"^decode\s+PyAV \(host\)", res.stdout, re.M), res.stdout
    assert list(tmp_path.iterdir()) == [], "the null output wrote a file"
    # Each stage's time a frame. The stages run in threads of their own, so each one's time is at
    # most the wall time a frame; the slowest sets the pace, so it takes a good part of that.
    stage = re.search(r"^stage ms/frame\s+queue ([\d.]+) analyse ([\d.]+) swap-wait ([\d.]+) swap ([\d.]+) "
                      r"encode ([\d.]+)\s*$", res.stdout, re.M)
    assert stage, res.stdout
    speed = re.search(r"^speed\s+([\d.]+) fps", res.stdout, re.M)
    assert speed, res.stdout
    queue, analyse, _wait, swap, encode = (float(v) for v in stage.groups())
    per_frame = 1e3 / float(speed.group(1))
    assert analyse > 0 and swap > 0 and encode > 0, stage.groups()  # every frame was analysed, swapped, output
    # 0.05 ms for the printed roundings.
    assert max(analyse, swap, encode) <= 1.02 * per_frame + 0.05, (stage.groups(), per_frame)
    assert max(analyse, swap, encode) >= 0.3 * per_frame, (stage.groups(), per_frame)
    # Each frame's time from its decoding to its output: each frame spends at least its own analysis
    # and swap in it, so the slowest frame at least their mean (1% for the record's bins).
    lat = re.search(r"^latency ms\s+p50 ([\d.]+) p99 ([\d.]+) max ([\d.]+)\s*$", res.stdout, re.M)
    assert lat, res.stdout
    p50, p99, top = (float(v) for v in lat.groups())
    assert 0 < p50 <= p99 <= top, (p50, p99, top)
    assert top >= 0.99 * (analyse + swap), (top, stage.groups())
    assert top <= 1.01e3 * float(re.search(r"^time\s+([\d.]+) s", res.stdout, re.M).group(1)), top


def test_null_output_still_marks_every_frame(assets: Assets, monkeypatch: pytest.MonkeyPatch) -> None:
    from swapstream.config import load_config
    from swapstream.disclosure import Disclosure
    from swapstream.runtime.run import RunJob

    job = RunJob(load_config(None, ["device=cpu"]), device="cpu")
    marked: list[bool] = []
    apply = Disclosure.apply

    def counting(self: Disclosure, data: np.ndarray, swapped: bool) -> None:
        marked.append(swapped)
        apply(self, data, swapped)  # the real label and watermark still go in

    # On the class: the stream makes its own disclosure from the job's config.
    monkeypatch.setattr(Disclosure, "apply", counting)
    try:
        job.set_source(assets.face)
        stats = job.run(assets.clip, "null:")
    finally:
        job.close()
    assert stats.frames == CLIP_FRAMES == len(marked)
    assert sum(marked) == stats.frames_swapped > 0


# --------------------------------------------------------------------------------------------------
# Bad source image


def test_cat_photo_has_no_face_for_the_detector() -> None:
    """Guards the next test: it needs a picture in which the built-in detector really finds no face."""
    from skimage import data

    from swapstream.config import load_config
    from swapstream.face.analyser import FaceAnalyser

    analyser = FaceAnalyser(load_config())
    try:
        assert analyser.analyse_image(np.ascontiguousarray(data.chelsea())) == []
        assert len(analyser.analyse_image(demo.astronaut())) == 1
    finally:
        analyser.close()


def test_source_without_a_face(assets: Assets, tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.cat, "-i", assets.clip, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{assets.cat}'", "no face")
    assert not out.exists()


def test_source_that_is_not_an_image(assets: Assets, tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.not_image, "-i", assets.clip, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{assets.not_image}'", "not an image")
    assert not out.exists()


def test_missing_source(assets: Assets, tmp_path: Path) -> None:
    source = tmp_path / "nobody.png"
    res = cli("run", "-s", source, "-i", assets.clip, "-o", tmp_path / "out.mp4", cwd=tmp_path)
    assert_user_error(res, f"'{source}'", "does not exist")


# --------------------------------------------------------------------------------------------------
# Bad input video


def test_missing_input(assets: Assets, tmp_path: Path) -> None:
    video = tmp_path / "no_such_clip.mp4"
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.face, "-i", video, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{video}'", "does not exist")
    assert not out.exists()


def test_input_is_a_text_file(assets: Assets, tmp_path: Path) -> None:
    video = tmp_path / "clip.mp4"
    video.write_text("this is a text file, not a video\n" * 20)
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.face, "-i", video, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{video}'")
    assert not out.exists()


def test_input_is_empty(assets: Assets, tmp_path: Path) -> None:
    video = tmp_path / "empty.mp4"
    video.write_bytes(b"")
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.face, "-i", video, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{video}'")
    assert not out.exists()


@pytest.mark.parametrize("layout", ["index_at_end", "faststart"])
def test_input_truncated(assets: Assets, tmp_path: Path, layout: str) -> None:
    """A real MP4 cut to 40% of its bytes is a clean input error (exit 2) naming the file, with no
    output left behind.

    With the index (moov) at the end, as FFmpeg writes by default, the cut file has no index at all;
    with it at the front the cut file has an index and the first frames' data, and the decoder still
    stops on the cut with "Invalid data found" before the run ends. Both layouts (checked: exit 2,
    one `error:` line, no out.mp4): this test pins it so that it cannot silently turn into a partial
    run. A cut file whose first frames do decode is `test_input_cut_after_its_first_frames`.
    """
    full = assets.clip if layout == "index_at_end" else assets.clip_faststart
    data = full.read_bytes()
    video = tmp_path / "cut.mp4"
    video.write_bytes(data[: int(len(data) * 0.4)])
    out = tmp_path / "out.mp4"
    res = cli("run", "-s", assets.face, "-i", video, "-o", out, "--quiet", cwd=tmp_path)
    line = assert_user_error(res, f"'{video}'", "Check that it is a complete video file")
    assert res.returncode == 2, _show(res)
    assert "cannot decode" in line, line
    assert not out.exists(), _show(res)


def _ffmpeg_clip(path: Path, frames: int, *args: str) -> None:
    """A real H.264 + AAC MP4 of `frames` frames at 25 fps, written by the ffmpeg tool."""
    import shutil

    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg tool")
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y",
                    "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25",
                    "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000",
                    "-frames:v", str(frames), "-shortest", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                    "-c:a", "aac", *args, str(path)], check=True, timeout=60)


def test_input_cut_after_its_first_frames(assets: Assets, tmp_path: Path) -> None:
    """A 100-frame MP4 with its index at the front (-movflags +faststart, as web video has it), cut
    in half: the index promises 100 frames and the data holds the first ones. The run writes those,
    says so in one `warning:` line with the counts, and exits 3 (it used to exit 0, silently)."""
    full, video, out = tmp_path / "full.mp4", tmp_path / "cut.mp4", tmp_path / "out.mp4"
    _ffmpeg_clip(full, 100, "-movflags", "+faststart")
    data = full.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    res = cli("run", "-s", assets.face, "-i", video, "-o", out, "--quiet", cwd=tmp_path)
    assert res.returncode == 3, _show(res)
    assert "Traceback" not in res.stdout + res.stderr and "error:" not in res.stderr, _show(res)
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1, _show(res)
    m = re.fullmatch(rf"warning: input '{re.escape(str(video))}' ended early: (\d+) of 100 frames "
                     rf"\(truncated\?\); wrote (\d+) frames to '{re.escape(str(out))}'", warnings[0])
    assert m and m.group(1) == m.group(2), warnings[0]
    written = int(m.group(1))
    assert 10 <= written <= 90, written
    assert count_frames(out) == written
    assert re.search(rf"^frames\s+{written}\s*$", res.stdout, re.M), res.stdout
    # The whole file runs through with exit 0 and no warning.
    res = cli("run", "-s", assets.face, "-i", full, "-o", tmp_path / "whole.mp4", "--quiet", cwd=tmp_path)
    assert res.returncode == 0 and "warning:" not in res.stderr, _show(res)
    assert count_frames(tmp_path / "whole.mp4") == 100


# --------------------------------------------------------------------------------------------------
# Missing inputs are found before the models load. With an empty models folder, loading them fails
# with its own error: an error that names the missing file shows that nothing was loaded first.


def _missing_input_commands(assets: Assets, tmp_path: Path) -> dict[str, tuple[list[object], str]]:
    nobody, no_clip = tmp_path / "nobody.png", tmp_path / "no_clip.mp4"
    out, hls = tmp_path / "out.mp4", tmp_path / "hls"
    return {
        "run-source": (["run", "-s", nobody, "-i", assets.clip, "-o", out], f"source image '{nobody}'"),
        "run-input": (["run", "-s", assets.face, "-i", no_clip, "-o", out], f"input '{no_clip}'"),
        "live-source": (["live", "-s", nobody, "-i", assets.clip, "--hls-dir", hls],
                        f"source image '{nobody}'"),
        "live-input": (["live", "-s", assets.face, "-i", no_clip, "--hls-dir", hls],
                       f"live input file '{no_clip}'"),
        "live-file-url": (["live", "-s", assets.face, "-i", f"file://{no_clip}", "--hls-dir", hls],
                          f"live input file 'file://{no_clip}'"),
        "serve-source": (["serve", "-s", nobody, "--port", "9"], f"source image '{nobody}'"),
    }


@pytest.mark.parametrize("case", ["run-source", "run-input", "live-source", "live-input",
                                  "live-file-url", "serve-source"])
def test_missing_input_is_found_before_models_load(assets: Assets, tmp_path: Path, case: str) -> None:
    args, names = _missing_input_commands(assets, tmp_path)[case]
    empty = tmp_path / "no_models"
    empty.mkdir()
    env = {**_env(), "SWAPSTREAM_MODELS_DIR": str(empty)}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", *map(str, args)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=TIMEOUT)
    took = time.monotonic() - t0
    line = assert_user_error(res, names, "does not exist")
    assert res.returncode == 2, _show(res)
    assert "model" not in line and "setup" not in res.stderr, _show(res)
    assert not (tmp_path / "out.mp4").exists() and not (tmp_path / "hls").exists()
    # Python and the command line's imports, not the models (about 3 s more): 1.9-2.3 s on this
    # 2-core machine when it ran slow (the same before and after the change that measured it), so
    # the bound is 3 s, still short of what loading the models would add.
    assert took < 3.0, took


# --------------------------------------------------------------------------------------------------
# Unwritable output


def test_output_parent_is_a_file(assets: Assets, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("I am a file\n")
    out = blocker / "out.mp4"
    res = cli("run", "-s", assets.face, "-i", assets.clip, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{out}'")
    assert blocker.read_text() == "I am a file\n"


def test_output_is_a_directory(assets: Assets, tmp_path: Path) -> None:
    out = tmp_path / "folder.mp4"
    out.mkdir()
    res = cli("run", "-s", assets.face, "-i", assets.clip, "-o", out, cwd=tmp_path)
    assert_user_error(res, f"'{out}'", "directory")
    assert out.is_dir() and not any(out.iterdir())


# --------------------------------------------------------------------------------------------------
# Bad configuration (checked before any file is touched, so run and config must both report it)


@pytest.fixture(params=["run", "config"])
def command(request: pytest.FixtureRequest, assets: Assets, tmp_path: Path) -> list[object]:
    if request.param == "run":
        return ["run", "-s", assets.face, "-i", assets.clip, "-o", tmp_path / "out.mp4"]
    return ["config"]


def test_unknown_key_in_set(command: list[object], tmp_path: Path) -> None:
    res = cli(*command, "--set", "mesh.bogus=1", cwd=tmp_path)
    line = assert_user_error(res, "'mesh.bogus'", "unknown")
    assert re.search(r"\bvalue 1\b", line), line
    assert not (tmp_path / "out.mp4").exists()


def test_bad_value_in_set(command: list[object], tmp_path: Path) -> None:
    res = cli(*command, "--set", "mesh.feather=abc", cwd=tmp_path)
    assert_user_error(res, "'mesh.feather'", "'abc'")
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("value", ["0.1", "11", "abc"])
def test_gop_seconds_out_of_bounds(tmp_path: Path, value: str) -> None:
    """encode.gop_seconds: 0.25-10 s (under it the stream is mostly keyframes, over it a new viewer
    waits that long); outside, one error line quoting the key and the value."""
    res = cli("config", "--set", f"encode.gop_seconds={value}", cwd=tmp_path)
    assert_user_error(res, "'encode.gop_seconds'", value)
    res = cli("config", "--set", "encode.gop_seconds=2.5", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert re.search(r"encode\.gop_seconds\s*│\s*2\.5\b", res.stdout), res.stdout


def test_set_without_equals(command: list[object], tmp_path: Path) -> None:
    res = cli(*command, "--set", "mesh.feather", cwd=tmp_path)
    assert_user_error(res, "mesh.feather", "key=value")


def test_unknown_key_in_preset_file(command: list[object], tmp_path: Path) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("mesh:\n  feather: 0.1\n  bogus: 7\n")
    res = cli(*command, "--config", preset, cwd=tmp_path)
    line = assert_user_error(res, "'mesh.bogus'", str(preset))
    assert re.search(r"\bvalue 7\b", line), line
    assert not (tmp_path / "out.mp4").exists()


def test_bad_value_in_preset_file(command: list[object], tmp_path: Path) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("encode:\n  crf: ninety\n")
    res = cli(*command, "--config", preset, cwd=tmp_path)
    assert_user_error(res, "'encode.crf'", "'ninety'", str(preset))


def test_missing_preset(command: list[object], tmp_path: Path) -> None:
    res = cli(*command, "--config", "nosuch", cwd=tmp_path)
    # The message names the preset and lists the ones that exist.
    assert_user_error(res, "'nosuch'", "default", "live")
    assert not (tmp_path / "out.mp4").exists()


def test_good_config_is_printed(tmp_path: Path) -> None:
    res = cli("config", "--config", "live", "--set", "mesh.feather=0.2", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert re.search(r"mesh\.feather\s*│\s*0\.2\b", res.stdout), res.stdout
    assert re.search(r"detector\.detect_every\s*│\s*5\b", res.stdout), res.stdout


# --------------------------------------------------------------------------------------------------
# Paths and values are printed verbatim: square brackets are legal in file names and YAML values,
# and must not be taken for Rich console markup.


@pytest.mark.parametrize("name", ["take[2].mp4", "take[red].mp4", "take[/].mp4"])
def test_brackets_in_a_bad_input_path(assets: Assets, tmp_path: Path, name: str) -> None:
    video = tmp_path / name  # "take[/].mp4" is a file "].mp4" in a missing folder "take[": also fine
    res = cli("run", "-s", assets.face, "-i", video, "-o", tmp_path / "out.mp4", cwd=tmp_path)
    assert_user_error(res, f"'{video}'")


def test_brackets_in_a_bad_config_key(tmp_path: Path) -> None:
    res = cli("config", "--set", "mesh.[/b]=1", cwd=tmp_path)
    assert_user_error(res, "'mesh.[/b]'")


def test_brackets_in_the_output_path_summary(assets: Assets, tmp_path: Path) -> None:
    # Relative, so that the summary table has room for the whole name on one line.
    res = cli("run", "-s", assets.face, "-i", assets.clip, "-o", "take[red].mp4", "--quiet", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert (tmp_path / "take[red].mp4").is_file()
    assert "take[red].mp4" in res.stdout, res.stdout


# --------------------------------------------------------------------------------------------------
# serve: an address or folder it cannot use ends at start-up with one error line (a server that
# started anyway would run until the timeout, and fail the test there)

SERVE_TIMEOUT = 30


def serve(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("aiohttp")
    try:
        return subprocess.run([sys.executable, "-m", "swapstream.cli", "serve", *map(str, args)],
                              cwd=cwd, env=_env(), capture_output=True, text=True, timeout=SERVE_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`swapstream serve {' '.join(map(str, args))}` started instead of refusing")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_hls_root_must_be_a_writable_folder(assets: Assets, tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    port = free_port()
    res = serve("-s", assets.face, "--port", port, "--hls-root", a_file, cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"--hls-root '{a_file}' is a file", "Give a folder")
    under_a_file = a_file / "hls"
    res = serve("-s", assets.face, "--port", port, "--hls-root", under_a_file, cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"--hls-root '{under_a_file}' cannot be written", "Give a folder you can write")
    # A missing folder is made, and serving starts (here: refused for the busy port, made to stop it).
    missing = tmp_path / "new" / "hls"
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        res = serve("-s", assets.face, "--port", busy.getsockname()[1], "--hls-root", missing, cwd=tmp_path)
    assert missing.is_dir() and "--hls-root" not in res.stderr, _show(res)


def test_serve_on_a_busy_port_is_one_error_line(assets: Assets, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = serve("-s", assets.face, "--host", "127.0.0.1", "--port", port, cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"cannot listen on 127.0.0.1:{port}", "already in use", "--port")
    # An address of no interface here (TEST-NET-2, RFC 5737): refused by bind, with no DNS query
    # (a name would be looked up, and nothing here may leave loopback). Beyond loopback, serve needs
    # a token before it tries the address.
    res = serve("-s", assets.face, "--host", "198.51.100.7", "--port", free_port(), "--whip-token",
                "t0ken", cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, "cannot listen on 198.51.100.7:", "--host")
    res = serve("-s", assets.face, "--port", 70000, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "Invalid value for '--port'" in res.stderr, _show(res)
