"""`swapstream live` with a file as its input: it plays once at the file's own pace and the job ends
by itself (outputs closed, summary printed, exit 0); `--loop` plays it again and again with the
timestamps carried on; a missing file is one `error:` line. Each run goes through the command line in
a subprocess with a timeout, writes HLS, and the segments are decoded and counted.

(A file's end used to be taken for a dropped network input: the reader reconnected to the file and
replayed it forever.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream.demo import astronaut, grace_hopper, write_demo_clip  # noqa: E402
from swapstream.live.streams import is_file_input  # noqa: E402

from .clips import concat_hls  # noqa: E402
from .test_cli import _env, _show, assert_user_error, cli  # noqa: E402

FPS = 10
SECONDS = 2.0
FRAMES = 20
# Long enough for start-up and a 2-3 s clip on a slow 2-core machine; short enough that a job that
# replays forever fails here rather than hanging the suite.
TIMEOUT = 40


@pytest.fixture
def face(tmp_path: Path) -> Path:
    path = tmp_path / "face.png"
    cv2.imwrite(str(path), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    return path


@pytest.fixture
def clip(tmp_path: Path) -> Path:
    path = tmp_path / "clip.mp4"
    # Small frames, so that the CPU swap keeps up with real time and no frame is dropped.
    assert write_demo_clip(path, grace_hopper(), seconds=SECONDS, fps=FPS, size=(320, 240)) == FRAMES
    return path


def live(*args: object, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """`swapstream live ARGS`, which must end by itself within TIMEOUT; returns it and its wall time."""
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "swapstream.cli", "live", *map(str, args)],
                             cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`swapstream live` did not end within {TIMEOUT} s: is the file replaying?")
    return res, time.monotonic() - t0


def summary(res: subprocess.CompletedProcess[str]) -> dict[str, int]:
    text = " ".join(res.stdout.split())  # Rich wraps the line at the terminal width
    m = re.search(r"frames in (\d+), out (\d+), dropped (\d+), faces swapped (\d+), "
                  r"audio packets (\d+), reconnects (\d+)", text)
    assert m, _show(res)
    return dict(zip(("in", "out", "dropped", "faces", "audio", "reconnects"), map(int, m.groups())))


def decode_hls(folder: Path) -> tuple[list[float], list[float]]:
    """Video frame times and audio packet times of the HLS playlist, in playlist order. The
    MPEG-TS segments are concatenated (the format allows it), so the times are continuous."""
    whole = concat_hls(folder)
    with av.open(str(whole)) as c:
        assert c.streams.audio, "the AAC audio of the clip is not in the output"
        video = [float(f.time) for f in c.decode(video=0)]
    with av.open(str(whole)) as c:
        audio = [float(p.pts * p.time_base) for p in c.demux(audio=0) if p.pts is not None]
    return video, audio


def test_file_or_network() -> None:
    files = ["clip.mp4", "/srv/clips/a b.mp4", "file:///srv/a.mp4", "FILE:///srv/a.mp4", "file:a.mp4",
             r"C:\clips\a.mp4"]
    network = ["rtmp://127.0.0.1:1935/live/k", "rtmps://x/app/k", "http://h/a.m3u8", "https://h/a.flv",
               "srt://h:9000", "udp://@:1234", "rtsp://cam/1", "RTMP://H/app/k"]
    assert [is_file_input(u) for u in files] == [True] * len(files)
    assert [is_file_input(u) for u in network] == [False] * len(network)


def test_a_file_plays_once_in_real_time_and_the_job_ends(face: Path, clip: Path, tmp_path: Path) -> None:
    hls = tmp_path / "hls"
    res, wall = live("-s", face, "-i", clip, "--hls-dir", hls, cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert "Traceback" not in res.stderr and "error:" not in res.stderr, _show(res)
    s = summary(res)
    # Every frame of the file read once (not replayed), none lost between reading and writing.
    assert s["in"] == FRAMES and s["out"] + s["dropped"] == FRAMES and s["reconnects"] == 0, s
    assert s["audio"] > 0
    # Real-time pace: the frames came out over the clip's length, not as fast as they decode.
    assert wall >= 0.9 * SECONDS, wall
    video, audio = decode_hls(hls)
    # ±1: what an HLS segmenter keeps of the very last frame is its own business.
    assert abs(len(video) - s["out"]) <= 1, (len(video), s)
    assert all(b > a for a, b in zip(video, video[1:])), video
    assert audio and audio[-1] - audio[0] >= 0.8 * SECONDS


def test_file_url_plays_once_too(face: Path, clip: Path, tmp_path: Path) -> None:
    res, _ = live("-s", face, "-i", f"file://{clip}", "--hls-dir", tmp_path / "hls", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert summary(res)["in"] == FRAMES


def test_loop_plays_the_file_again_with_time_carried_on(face: Path, clip: Path, tmp_path: Path) -> None:
    hls = tmp_path / "hls"
    want = FRAMES + FRAMES // 2  # into the second pass
    res, wall = live("-s", face, "-i", clip, "--hls-dir", hls, "--loop", "--max-frames", want,
                     cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    s = summary(res)
    assert s["out"] == want and s["reconnects"] == 0, s
    assert wall >= 0.9 * want / FPS, wall
    video, audio = decode_hls(hls)
    assert abs(len(video) - want) <= 1, (len(video), s)
    # One frame interval everywhere, the seam between the passes included: no jump back, no gap.
    steps = np.diff(video)
    assert np.allclose(steps, 1 / FPS, atol=2e-3), steps
    # The audio carries on across the seam as well (a pass's audio starting at 0 again would be
    # thrown away by the muxer as going back in time).
    assert all(b > a for a, b in zip(audio, audio[1:]))
    assert audio[-1] > SECONDS + 0.5, audio[-1]


@pytest.mark.parametrize("prefix", ["", "file://"], ids=["path", "file-url"])
def test_missing_file_is_one_error_line(face: Path, tmp_path: Path, prefix: str) -> None:
    missing = f"{prefix}{tmp_path / 'no-such-clip.mp4'}"
    res = cli("live", "-s", face, "-i", missing, "--hls-dir", tmp_path / "hls", cwd=tmp_path)
    assert res.returncode == 2, _show(res)
    assert_user_error(res, f"live input file '{missing}' does not exist", "Check the path")
    assert not (tmp_path / "hls").exists()


def test_loop_is_refused_for_a_network_input(face: Path, tmp_path: Path) -> None:
    url = "rtmp://127.0.0.1:9/live/in"
    res = cli("live", "-s", face, "-i", url, "--hls-dir", tmp_path / "hls", "--loop", cwd=tmp_path)
    assert res.returncode == 2, _show(res)
    # The stream key is masked on the console, as everywhere.
    assert_user_error(res, "--loop repeats a file input", "'rtmp://127.0.0.1:9/live/***' is a network stream",
                      "--reconnect")
