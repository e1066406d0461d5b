"""`live` when peers are late, go away or are interrupted, with real peers on loopback: nginx-rtmp
(stopped and started again), ffmpeg publishers, and the `swapstream` command in a subprocess.

- An output outage lasts as long as `--reconnect` allows, not a fixed 30 s.
- An RTMP input that is not publishing yet is waited for (start SwapStream first, then OBS).
- Ctrl+C ends a run cleanly, with its summary line and exit code 130.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import pytest

av = pytest.importorskip("av")

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut  # noqa: E402
from swapstream.errors import OutputError  # noqa: E402
from swapstream.runtime.live import LiveJob  # noqa: E402
from swapstream.live.nginx import NginxRtmp  # noqa: E402

from .test_cli import _env  # noqa: E402
from .test_live_rtmp import make_clip, publish  # noqa: E402  (skips without ffmpeg and nginx-rtmp)

SUMMARY = re.compile(r"^frames in (\d+), out (\d+), dropped \d+, faces swapped \d+, audio packets \d+, "
                     r"reconnects \d+, latency p50 \d+ ms, p99 \d+ ms; dropped while starting \d+; "
                     r"on \S+, NVDEC frames \d+$", re.MULTILINE)


@pytest.fixture
def face(tmp_path: Path) -> Path:
    path = tmp_path / "face.png"
    cv2.imwrite(str(path), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    return path


class Live:
    """`python -m swapstream.cli live ARGS` running, its stderr lines collected as they come."""

    def __init__(self, *args: object, cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "swapstream.cli", "live", *map(str, args)],
                                     cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.err: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append((time.monotonic(), line.rstrip("\n")))

    def wait_line(self, start: str, timeout: float) -> float:
        """When a stderr line starting with `start` came (fails if none within `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.err):
                if line.startswith(start):
                    return t
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line starting {start!r}; stderr so far:\n" +
                             "\n".join(line for _, line in self.err))

    def finish(self, timeout: float) -> tuple[int, str, str, float]:
        """(exit code, stdout, stderr, when it exited)."""
        # Not communicate(): it would read stderr too, racing the thread that collects it.
        self.proc.wait(timeout=timeout)
        ended = time.monotonic()
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()  # a few lines: they fit the pipe while the process runs
        self._reader.join(timeout=5)
        return self.proc.returncode, out, "\n".join(line for _, line in self.err), ended

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def view(url: str, frames: int, timeout: float) -> int:
    """Frames a viewer of `url` decodes, up to `frames`, within `timeout` seconds (0 if none)."""
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline and got < frames:
        try:
            with av.open(url, options={"rtmp_live": "live"}, timeout=(3.0, 3.0)) as c:
                for _ in c.decode(video=0):
                    got += 1
                    if got >= frames or time.monotonic() > deadline:
                        break
        except (av.error.FFmpegError, OSError):
            time.sleep(0.2)
    return got


def test_output_outage_window_is_the_jobs_reconnect(tmp_path: Path) -> None:
    """--reconnect 4: an output server that comes back after 1.5 s is picked up again, and one that
    stays away ends the run with a clean OutputError 4 s after it went (not LiveWriter's 30 s)."""
    window = 4.0
    clip = tmp_path / "src.mp4"
    make_clip(clip, seconds=3.0)
    nginx = NginxRtmp(tmp_path / "nginx").start()
    port = nginx.port
    job = LiveJob(load_config())
    job.set_source_image(astronaut(), "astronaut")
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["stats"] = job.run_live(str(clip), rtmp_out=nginx.url("out"), loop=True,
                                           reconnect_seconds=window)
        except OutputError as e:
            result["error"], result["at"] = e, time.monotonic()

    worker = threading.Thread(target=run, daemon=True)
    nginx2: NginxRtmp | None = None
    try:
        worker.start()
        assert view(nginx.url("out"), 5, timeout=20) == 5, "no output before the outage"
        # A short outage, inside the window: the push reconnects and frames flow again.
        nginx.stop()
        time.sleep(1.5)
        nginx2 = NginxRtmp(tmp_path / "nginx2", rtmp_port=port).start()
        # (The viewer itself needs a keyframe and a second or two to start.)
        assert view(nginx2.url("out"), 5, timeout=10) == 5, "the output did not come back"
        assert worker.is_alive() and "error" not in result, result
        time.sleep(1.5)  # the connection has carried frames for RECOVERED_AFTER_S: the outage is over
        # Now the server stays away: the run ends once the window has passed, and not before.
        nginx2.stop()
        gone = time.monotonic()
        worker.join(timeout=window + 8)
        assert not worker.is_alive(), f"the run was still retrying {window + 8:g} s after the output went"
        assert "error" in result, result
        took = float(result["at"]) - gone  # type: ignore[arg-type]
        assert window <= took < window + 3, took
        assert f"has failed for {window:g} s" in str(result["error"])
    finally:
        nginx.stop()
        if nginx2 is not None:
            nginx2.stop()
        worker.join(timeout=40)
        job.close()


def test_live_waits_for_a_publisher_that_starts_later(face: Path, tmp_path: Path) -> None:
    clip = tmp_path / "src.mp4"
    make_clip(clip, seconds=6.0)
    hls = tmp_path / "hls"
    with NginxRtmp(tmp_path / "nginx") as nginx:
        live = Live("-s", face, "-i", nginx.url("in"), "--hls-dir", hls, "--max-frames", 20,
                    "--reconnect", 20, cwd=tmp_path)
        pub = None
        try:
            live.wait_line("waiting for", timeout=90)
            time.sleep(3.0)
            pub = publish(clip, nginx.url("in"))
            rc, out, err, _ = live.finish(timeout=60)
        finally:
            live.kill()
            if pub is not None:
                pub.terminate()
                pub.wait()
    waits = [line for line in err.splitlines() if line.startswith("waiting for")]
    assert waits == [f"waiting for rtmp://127.0.0.1:{nginx.port}/live/*** (publish from OBS now)"], err
    assert "/live/in" not in out + err  # the stream key shows nowhere
    assert rc == 0, err
    m = SUMMARY.search(out)
    assert m and int(m.group(2)) == 20, out
    assert (hls / "index.m3u8").exists()


def test_live_without_a_publisher_gives_up_after_reconnect(face: Path, tmp_path: Path) -> None:
    with NginxRtmp(tmp_path / "nginx") as nginx:
        live = Live("-s", face, "-i", nginx.url("in"), "--hls-dir", tmp_path / "hls", "--reconnect", 2,
                    cwd=tmp_path)
        try:
            started = live.wait_line("live: ", timeout=90)  # just before the input is opened
            live.wait_line("waiting for", timeout=10)
            rc, out, err, ended = live.finish(timeout=30)
        finally:
            live.kill()
    assert rc == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert f"cannot open live input 'rtmp://127.0.0.1:{nginx.port}/live/***'" in errors[0], err
    assert "/live/in" not in out + err
    # Waited for --reconnect's 2 s (and a moment to give up), not the 5 s open timeout and more.
    assert 1.8 <= ended - started <= 4.5, ended - started
    assert not (tmp_path / "hls" / "index.m3u8").exists()


def test_ctrl_c_stops_cleanly_with_the_summary(face: Path, tmp_path: Path) -> None:
    clip = tmp_path / "src.mp4"
    make_clip(clip, seconds=3.0)
    hls = tmp_path / "hls"
    live = Live("-s", face, "-i", clip, "--loop", "--hls-dir", hls, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not (hls / "index.m3u8").exists() and time.monotonic() < deadline and live.proc.poll() is None:
            time.sleep(0.1)
        assert (hls / "index.m3u8").exists(), "\n".join(line for _, line in live.err)
        time.sleep(1.5)
        live.proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rc, out, err, ended = live.finish(timeout=30)
    finally:
        live.kill()
    assert rc == 130, f"exit {rc}\n{out}\n{err}"
    assert "Traceback" not in err and "error:" not in err, err
    m = SUMMARY.search(out)
    assert m and int(m.group(2)) > 0, out
    assert ended - sent < 10
    # The outputs were closed: the playlist names segments that are all on disk and complete.
    segs = re.findall(r"^(seg_\d+\.ts)$", (hls / "index.m3u8").read_text(), re.MULTILINE)
    assert segs and all((hls / s).stat().st_size > 0 for s in segs)


def test_ctrl_c_while_waiting_for_the_publisher_ends_quietly(face: Path, tmp_path: Path) -> None:
    """Ctrl+C before anyone published: the run ends at once with its summary (nothing came), exit
    status 130, no error line and no traceback."""
    with NginxRtmp(tmp_path / "nginx") as nginx:
        live = Live("-s", face, "-i", nginx.url("in"), "--hls-dir", tmp_path / "hls", "--reconnect", 60,
                    cwd=tmp_path)
        try:
            live.wait_line("waiting for", timeout=90)
            asked = time.monotonic()
            live.proc.send_signal(signal.SIGINT)
            rc, out, err, ended = live.finish(timeout=30)
        finally:
            live.kill()
    assert rc == 130, err
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")], err
    m = SUMMARY.search(out)
    assert m and m.group(1) == m.group(2) == "0", out
    assert ended - asked < 10, ended - asked  # not the 60 s wait
