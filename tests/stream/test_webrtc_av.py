"""WebRTC audio and the live policy, with real aiortc peers over loopback ICE.

A publisher sends the stamped portrait video and a tone that is on in even seconds of the same
clock; the server swaps the video (slowed down on purpose, as a heavy model would be) and sends the
audio back on the publisher's connection and to a WHEP viewer. The tone's pitch is read by FFT,
and its switch-offs are timed against the video stamps to see that audio and video stay together.
"""

from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pytest

pytest.importorskip("aiortc")

from aiohttp import ClientSession  # noqa: E402

from swapstream.live.probe import (ProbeClock, Received, StampedVideoTrack, ToneTrack,  # noqa: E402
                                   audio_lag, peak_hz, tone_edges, video_lag)
from swapstream.live.webrtc import AIORTC_AUDIO_PREFETCH_S, WhipServer  # noqa: E402

from .webrtc_peers import connect, mesh_swap, publisher, start, until, viewer  # noqa: E402

FPS = 15
SLOW_SWAP_S = 0.3
"""Added to the real swap: the video then lags by ~0.35 s, far more than lip-sync tolerates, so
audio sent on as it comes would be ~0.3 s ahead and the sync check below would fail."""
SYNC_TOLERANCE_S = 0.1
"""Audio within 100 ms of the video: ITU-R BT.1359 finds 45 ms audio-ahead / 125 ms audio-behind
detectable; our measurement itself is coarse by one 20 ms audio frame and one video frame's wait."""


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


def test_audio_comes_back_as_opus_in_step_with_slow_swapped_video() -> None:
    async def scenario() -> tuple[Received, Received, dict, ProbeClock, dict[int, float]]:
        job, swap = mesh_swap(extra_delay_s=SLOW_SWAP_S)
        server = WhipServer(swap)
        runner, base = await start(server.app)
        clock = ProbeClock(asyncio.get_running_loop().time())
        video = StampedVideoTrack(clock, fps=FPS)
        back, seen = Received(), Received()
        pub = publisher([video, ToneTrack(clock)], back)
        view = viewer(("video", "audio"), seen)
        async with ClientSession() as http:
            location = await connect(http, base + "/whip", pub)
            answer = pub.remoteDescription.sdp
            await connect(http, base + "/whep", view)
            # Three switch-offs (seconds 1, 3, 5, 7...) at both receivers, and video throughout.
            await until(lambda: len(tone_edges(back.audio)) >= 3 and len(tone_edges(seen.audio)) >= 2
                        and len(back.video) >= 10, 40, "three tone switch-offs back at the publisher")
            s = next(iter(server.sessions.values()))
            stats = {"answer": answer, "dropped": s.dropped, "audio_in": s.audio_frames_in,
                     "audio_out": s.audio_frames_out, "delay": s.video_delay_s,
                     "audio_dropped": s.audio_line.dropped}
            await http.delete(base + location)
        await view.close()
        await pub.close()
        await runner.cleanup()
        job.close()
        return back, seen, stats, clock, video.sent

    back, seen, stats, clock, sent = asyncio.run(scenario())
    # The answer sends audio back as Opus, beside the video.
    assert "m=audio" in stats["answer"] and "opus/48000/2" in stats["answer"].lower()
    assert stats["audio_in"] > 100 and stats["audio_out"] > 100 and stats["audio_dropped"] == 0
    for name, got in (("publisher", back), ("WHEP viewer", seen)):
        tone = longest_tone(got.audio)
        assert len(tone) >= 0.5 * got.audio_rate, f"{name}: no half second of tone"
        hz = peak_hz(tone[: got.audio_rate // 2], got.audio_rate)
        assert abs(hz - 440) <= 4, f"{name}: tone at {hz:.1f} Hz, sent 440 Hz"
        v = statistics.median(video_lag(got.video, clock, FPS, sent))
        # The receiving aiortc's own audio jitter buffer adds its prefetch to every audio frame.
        a = statistics.median(audio_lag(tone_edges(got.audio), clock)) - AIORTC_AUDIO_PREFETCH_S
        print(f"{name}: video {v * 1e3:.0f} ms behind the source, audio {a * 1e3:.0f} ms "
              f"(A-V {1e3 * (a - v):+.0f} ms), tone {hz:.1f} Hz")
        assert v > SLOW_SWAP_S  # the video really is slow
        assert abs(a - v) < SYNC_TOLERANCE_S, f"{name}: audio {a:.3f} s vs video {v:.3f} s behind"
    assert stats["dropped"] > 0  # 15 fps in, ~3 fps swapped: late frames were skipped
