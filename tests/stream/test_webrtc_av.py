"""WebRTC audio and the late-frame policy, with real aiortc peers over loopback ICE.

A publisher sends the stamped portrait video and a tone that is on in even seconds of the same
clock; the server swaps the video (slowed down on purpose, as a heavy model would be) and sends the
audio back on the publisher's connection and to a WHEP viewer. The tone's pitch is read by FFT,
and its switch-offs are timed against the video stamps to see that audio and video stay together.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("aiortc")

from aiohttp import ClientSession  # noqa: E402

from swapstream.live.webrtc import AIORTC_AUDIO_PREFETCH_S, Session, WhipServer  # noqa: E402

from ..helpers.probe import (ProbeClock, Received, StampedVideoTrack, ToneTrack,  # noqa: E402
                             audio_lag, peak_hz, tone_edges, video_lag)
from .webrtc_peers import connect, mesh_swap, publisher, start, until, viewer, swap_media  # noqa: E402

FPS = 15
SLOW_SWAP_S = 0.3
"""Added to the real swap: the video then lags by ~0.35 s, far more than lip-sync tolerates, so
audio sent on as it comes would be ~0.3 s ahead and the sync check below would fail."""
SYNC_TOLERANCE_S = 0.15
"""Audio within 150 ms of the video. ITU-R BT.1359 finds 45 ms audio-ahead / 125 ms audio-behind
detectable and 90 / 185 ms acceptable. Measured here: within 40 ms on an idle machine, up to 140 ms
with Chromium running beside the test on two cores; without the hold, audio is ~350 ms ahead."""


def longest_tone(audio: list[tuple[np.ndarray, float]], level: float = 0.3) -> np.ndarray:
    """The samples of the longest run of frames in which the tone sounds."""
    best: list[np.ndarray] = []
    run: list[np.ndarray] = []
    for samples, _t in audio:
        if float(np.sqrt(np.mean(samples ** 2))) > 0.5 * level / np.sqrt(2):
            run.append(samples)
            best = max(best, run, key=len)
        else:
            run = []
    return np.concatenate(best) if best else np.zeros(0)


@dataclass
class Run:
    """One slowed-down WHIP session with a WHEP viewer, and what everyone saw."""

    back: Received
    seen: Received
    clock: ProbeClock
    sent: dict[int, float]
    answer: str
    session: Session
    max_queue: int
    """Most frames seen waiting in aiortc's receive queue for the publisher's video."""


@pytest.fixture(scope="module")
def run() -> Run:
    async def scenario() -> Run:
        job, swap = mesh_swap(extra_delay_s=SLOW_SWAP_S)
        server = WhipServer(swap_media(swap))
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        video = StampedVideoTrack(clock, fps=FPS)
        back, seen = Received(), Received()
        pub = publisher([video, ToneTrack(clock)], back)
        view = viewer(("video", "audio"), seen)
        max_queue = 0

        async with ClientSession() as http:
            location = await connect(http, base + "/whip", pub)
            await connect(http, base + "/whep", view)
            session = next(iter(server.sessions.values()))
            incoming = next(r.track for r in session.pc.getReceivers() if r.track.kind == "video")

            def done() -> bool:
                nonlocal max_queue
                max_queue = max(max_queue, incoming._queue.qsize())  # aiortc's unbounded queue
                # Three switch-offs (seconds 1, 3, 5, 7...) back at the publisher, two at the
                # viewer, and video throughout: some six seconds of media.
                return (len(tone_edges(back.audio)) >= 3 and len(tone_edges(seen.audio)) >= 2
                        and len(back.video) >= 10)

            await until(done, 40, "three tone switch-offs back at the publisher")
            await http.delete(base + location)
        await view.close()
        await pub.close()
        await runner.cleanup()
        job.close()
        return Run(back, seen, clock, video.sent, pub.remoteDescription.sdp, session, max_queue)

    return asyncio.run(scenario())


def test_late_video_frames_are_dropped_not_queued(run: Run) -> None:
    s = run.session
    assert s.media is not None
    dropped = s.dropped + s.media.dropped  # in aiortc's queue (the loop fell behind), and by the media
    lags = video_lag(run.back.video, run.clock, FPS, run.sent)
    half = len(lags) // 2
    early, late = statistics.median(lags[:half]), statistics.median(lags[half:])
    print(f"slow swap: {s.frames_in} frames in, {dropped} skipped as late ({s.media.dropped} by the media), "
          f"most waiting at once {s.max_backlog} (aiortc queue max {run.max_queue}); video "
          f"{early * 1e3:.0f} ms behind early, {late * 1e3:.0f} ms late in the run")
    # 15 fps in, about 3 fps swapped: most frames must have been skipped ...
    assert dropped > 0.5 * s.frames_in
    # ... so that the receive queue never holds more than one swap's worth of frames (0.33 s at
    # 15 fps is 5; 15, a second of frames, allows for a stalled machine: 11 were seen once with the
    # whole suite running on 2 cores, where queued frames would pile up to ~40 in this run) ...
    assert s.max_backlog <= 15 and run.max_queue <= 15
    # ... and the delay does not grow. Queued frames would fall behind by 0.8 s every second, the
    # second half of the run ~2.5 s more than the first (measured: 3.5 s behind at the end). A
    # loaded machine adds single frames of up to ~1.1 s.
    assert late - early < 0.5 and max(lags) < 2.0


def test_audio_comes_back_as_opus_in_step_with_slow_swapped_video(run: Run) -> None:
    # The answer sends audio back as Opus, beside the video.
    assert "m=audio" in run.answer and "opus/48000/2" in run.answer.lower()
    s = run.session
    assert s.audio_frames_in > 100 and s.audio_frames_out > 100 and s.audio_line.dropped == 0
    for name, got in (("publisher", run.back), ("WHEP viewer", run.seen)):
        tone = longest_tone(got.audio)
        assert len(tone) >= 0.5 * got.audio_rate, f"{name}: no half second of tone"
        hz = peak_hz(tone[: got.audio_rate // 2], got.audio_rate)
        assert abs(hz - 440) <= 4, f"{name}: tone at {hz:.1f} Hz, sent 440 Hz"
        v = statistics.median(video_lag(got.video, run.clock, FPS, run.sent))
        # The receiving aiortc's own audio jitter buffer adds its prefetch to every audio frame.
        a = statistics.median(audio_lag(tone_edges(got.audio), run.clock)) - AIORTC_AUDIO_PREFETCH_S
        print(f"{name}: video {v * 1e3:.0f} ms behind the source, audio {a * 1e3:.0f} ms "
              f"(A-V {1e3 * (a - v):+.0f} ms), tone {hz:.1f} Hz")
        assert v > SLOW_SWAP_S  # the video really is slow
        assert abs(a - v) < SYNC_TOLERANCE_S, f"{name}: audio {a:.3f} s vs video {v:.3f} s behind"
