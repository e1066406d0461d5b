"""`swapstream live` with inputs it cannot use: one `error:` line naming the input and what to do,
exit 2, no traceback, and nothing written. (The same checks over a real RTMP server are in
test_live_rtmp.py; these go through the command line a user types.)"""

from __future__ import annotations

import socket
import threading
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from swapstream.demo import astronaut

from .test_cli import assert_user_error, cli


@pytest.fixture
def face(tmp_path: Path) -> Path:
    path = tmp_path / "face.png"
    cv2.imwrite(str(path), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    return path


def sorenson_flv(path: Path) -> Path:
    """FLV with Sorenson H.263 video (FLV's own pre-H.264 codec, what old encoders publish)."""
    with av.open(str(path), "w", format="flv") as c:
        v = c.add_stream("flv", rate=10)
        v.width, v.height, v.pix_fmt = 160, 120, "yuv420p"
        for i in range(10):
            f = av.VideoFrame.from_ndarray(np.full((120, 160, 3), 20 * i, np.uint8), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 10)
            c.mux(v.encode(f))
        c.mux(v.encode(None))
    return path


def test_non_h264_input_is_refused_with_the_obs_setting(face: Path, tmp_path: Path) -> None:
    clip = sorenson_flv(tmp_path / "old.flv")
    res = cli("live", "-s", face, "-i", clip, "--hls-dir", tmp_path / "hls", cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"live input '{clip}' is flv video", "publish H.264",
                      "Encoder x264 or NVENC H.264")
    assert not (tmp_path / "hls" / "index.m3u8").exists()


def test_garbage_input_is_refused(face: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.flv"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    res = cli("live", "-s", face, "-i", junk, "--hls-dir", tmp_path / "hls", cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"cannot open live input '{junk}'", "Invalid data")


def test_a_server_that_speaks_no_rtmp_is_refused(face: Path, tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = srv.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + bytes(range(256)) * 8)
        conn.close()

    threading.Thread(target=answer_garbage, daemon=True).start()
    url = f"rtmp://127.0.0.1:{port}/live/in"
    res = cli("live", "-s", face, "-i", url, "--rtmp-out", f"rtmp://127.0.0.1:{port}/live/out",
              cwd=tmp_path)
    srv.close()
    assert res.returncode == 2
    # Named without its stream key (swapstream.redact), which shows nowhere in the output.
    assert_user_error(res, f"cannot open live input 'rtmp://127.0.0.1:{port}/live/***'", "Check the URL")
    assert "/live/in" not in res.stdout + res.stderr


def test_live_needs_an_output(face: Path, tmp_path: Path) -> None:
    res = cli("live", "-s", face, "-i", "rtmp://127.0.0.1:9/live/in", cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, "a live run needs an output", "--rtmp-out", "--hls-dir", "--vcam")


@pytest.mark.parametrize("option,value", [("--max-frames", "-3"), ("--max-frames", "0"),
                                          ("--reconnect", "-1")])
def test_negative_counts_and_times_are_refused(face: Path, tmp_path: Path, option: str, value: str) -> None:
    res = cli("live", "-s", face, "-i", "rtmp://127.0.0.1:9/live/in", "--hls-dir", tmp_path / "hls",
              option, value, cwd=tmp_path)
    # A usage error from Click: exit 2, the option named, no traceback, nothing started.
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert f"Invalid value for '{option}'" in res.stderr, res.stderr
    assert not (tmp_path / "hls").exists()


@pytest.mark.parametrize("url", ["http://x/y", "srt://127.0.0.1:9000", "/tmp/out.flv"])
def test_rtmp_out_must_be_an_rtmp_url(face: Path, tmp_path: Path, url: str) -> None:
    res = cli("live", "-s", face, "-i", "rtmp://127.0.0.1:9/live/in", "--rtmp-out", url, cwd=tmp_path)
    assert res.returncode == 2
    assert_user_error(res, f"--rtmp-out '{url}' is not an RTMP URL", "rtmp://HOST[:PORT]/APP/KEY", "rtmps://")
