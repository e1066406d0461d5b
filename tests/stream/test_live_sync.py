"""One clock per live stream: the output's audio stays with its video across a publisher that drops
and comes back with its timestamps at 0 again, and across a timestamp jump within a connection.

Real peers on loopback: nginx-rtmp, publisher processes that mux FLV with libavformat (as ffmpeg
does), `swapstream live` in a subprocess, and a receiver that pulls the output. Each source frame is
stamped with its number, and the audio's tone onsets name their source second
(`tests.helpers.avsync`), so the skew is measured on the output's own timestamps, as a player sees it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream.live.nginx import NginxRtmp  # noqa: E402

from ..helpers import avsync  # noqa: E402
from .test_live_faults import Live, face  # noqa: E402,F401  (skips without ffmpeg and nginx-rtmp)

FPS = 10
JUMP_AT = 9
"""Seconds into the second publisher's connection at which its clock jumps. The reconnect takes 3-4 s
here (the new publisher's start, nginx, the reader's back-off and probe), so 9 s leave at least two
onsets (one every 2 s) between the reconnect and the jump. At 7 s a quick first publisher left one:
the next onset fell just past the boundary."""
SKEW_S = 0.040
"""The issue's bound on output A/V skew. The measurement itself is good to about 5 ms: the onset is
found to the sample, but AAC spreads a tone's attack over its 1024-sample frame (21 ms) at most."""


def publisher(url: str, t0: float, seconds: float, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.avsync", "publish", url, "--t0", str(t0),
                             "--fps", str(FPS), "--seconds", str(seconds), *extra],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def test_audio_stays_with_video_across_a_reconnect_and_a_timestamp_jump(face: Path, tmp_path: Path) -> None:  # noqa: F811
    with NginxRtmp(tmp_path / "nginx") as nginx:
        live = Live("-s", face, "-i", nginx.url("in"), "--rtmp-out", nginx.url("out"), "--reconnect", "20",
                    cwd=tmp_path)
        # The first publisher starts once `live` waits for it: on a loaded 2-core machine the job's own
        # start (imports, models) took most of the first publisher's 9 s, and the receiver saw too
        # little before the drop (two failures in clean-clone runs of the whole suite, none alone).
        try:
            live.wait_line("waiting for", timeout=90)
        except BaseException:
            live.kill()
            raise
        t0 = time.time() + 1.0
        receiver = avsync.Receiver(nginx.url("out")).start()
        try:
            first = publisher(nginx.url("in"), t0, 9)
            assert first.wait(30) == 0, first.stderr.read() if first.stderr else ""
            dropped = time.time()
            time.sleep(2.0)  # the input is gone for 2 s; the next publisher's clock starts at 0 again
            rejoined = time.time()
            second = publisher(nginx.url("in"), t0, 18, "--jump-at", str(JUMP_AT), "--jump-by", "100")
            assert second.wait(40) == 0, second.stderr.read() if second.stderr else ""
            ended = time.time()
            time.sleep(1.5)  # the last frames reach the receiver
        finally:
            receiver.stop()
            live.proc.send_signal(signal.SIGINT)
            code, _out, err, _ = live.finish(30)
    assert code == 130, err
    sessions = [s for s in receiver.snapshot() if s.video]
    assert sessions, ("the receiver got no video", avsync.describe(receiver, t0, {}))
    # Every onset on the output, by the phase of its source second: before the drop, after the new
    # publisher, after the jump.
    phases: dict[str, list[float]] = {"before the drop": [], "after the reconnect": [], "after the jump": []}
    for s in sessions:
        for _at, source, skew in avsync.skews(s, FPS, t0):
            since = source - (rejoined - t0)
            phases["before the drop" if since < 0 else "after the reconnect" if since < JUMP_AT else
                   "after the jump"].append(skew)
    # What the receiver saw, for a failure's message.
    seen = avsync.describe(receiver, t0, {"dropped": dropped, "rejoined": rejoined, "ended": ended})
    for name, found in phases.items():
        # An onset every 2 s: 9 s, 9 s and 9 s of stream give at least 2 each, whatever the reconnect
        # took (up to 4 s). The boundary at JUMP_AT is early by the publisher's start-up: onsets just
        # before the jump count as after it, which the skew bound does not mind.
        assert len(found) >= 2, (name, phases, seen)
        assert max(abs(x) for x in found) <= SKEW_S, (name, phases)
    # One timeline: no gap of the outage or of the jump on the output (a player would stall on it).
    for s in sessions:
        pts = np.array([t for _, t, _ in s.video])
        assert np.all(np.diff(pts) > 0) and np.max(np.diff(pts)) <= 0.5, np.max(np.diff(pts))
    # Latency is back to its level before the fault within 5 s of the new publisher starting.
    lat = [(when, x) for s in sessions for when, x in avsync.latencies(s, FPS, t0)]
    before = np.median([x for when, x in lat if when < dropped])
    settled = [x for when, x in lat if rejoined + 5.0 <= when <= ended]
    assert settled and np.median(settled) <= before + 0.25 and max(settled) <= before + 1.0, (before, settled)
