"""Live outputs whose frame rate is far below the input's: a swap that keeps up with about 6 of the
input's 30 frames a second (a slow CPU), with real peers: the input a file played in real time,
the outputs an HLS folder and an RTMP push to nginx-rtmp, read back by a PyAV viewer.

- RTMP: a keyframe every `encode.gop_seconds` of output time, within one frame interval: keyframes
  used to come every 30 *frames*, 7-8 s apart at this rate (new viewers waiting).
- HLS: segments of a whole number of GOPs (two here), each of at least HLS_SEGMENT_FRAMES frames (a
  browser's player fails shorter ones), under one #EXT-X-TARGETDURATION that never changes. They
  were 4-6 s with keyframes every 30 frames, then one second of 4 frames that Chromium could not
  play.
- The declared rate (FLV's framerate as nginx relays it, the H.264 stream's timing) within 15% of
  the delivered one: it used to declare the input's 30 fps.
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")
if shutil.which("ffmpeg") is None or not Path("/usr/lib/nginx/modules/ngx_rtmp_module.so").exists():
    pytest.skip("needs ffmpeg and nginx with libnginx-mod-rtmp (.ci/run installs them)",
                allow_module_level=True)

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, write_demo_clip  # noqa: E402
from swapstream.live.nginx import NginxRtmp  # noqa: E402
from swapstream.live.streams import HLS_SEGMENT_FRAMES, rtmp_input_options  # noqa: E402
from swapstream.runtime.live import LiveJob  # noqa: E402

from ..helpers.backends import slow_backends  # noqa: E402

IN_FPS = 30
SECONDS = 9.0
SWAP_S = 0.15
"""What each swap takes here: the real swap, then a wait that makes it as slow as a weak CPU's."""
GOP_S = 1.0


class HlsWatcher:
    """Reads the playlist every 0.1 s while the job runs: every #EXT-X-TARGETDURATION it showed, and
    each segment's duration and bytes, kept before the sliding window deletes them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.targets: list[int] = []
        self.durations: dict[str, float] = {}
        self.data: dict[str, bytes] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.look()

    def look(self) -> None:
        try:
            text = (self.folder / "index.m3u8").read_text()
        except OSError:
            return
        m = re.search(r"^#EXT-X-TARGETDURATION:(\d+)$", text, re.M)
        if m is None:
            return
        self.targets.append(int(m.group(1)))
        for dur, name in re.findall(r"^#EXTINF:([\d.]+),\n(\S+\.ts)$", text, re.M):
            self.durations[name] = float(dur)
            if name not in self.data:
                try:
                    self.data[name] = (self.folder / name).read_bytes()
                except OSError:
                    pass

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.look()


class RtmpViewer:
    """A viewer of the RTMP output from its start: the rate its header declares, and every video
    packet's time and keyframe flag."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.declared: float | None = None
        self.packets: list[tuple[float, bool]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            # nginx holds a player of a stream that is not published yet: a long open timeout.
            with av.open(self.url, options=rtmp_input_options(), timeout=(40, 5)) as c:
                v = c.streams.video[0]
                self.declared = float(v.average_rate) if v.average_rate else None
                for p in c.demux(v):
                    if p.pts is not None and p.size:
                        self.packets.append((float(p.pts * p.time_base), bool(p.is_keyframe)))
        except av.error.ExitError:
            pass  # the publisher ended: nginx closes the play
        except (av.error.FFmpegError, OSError) as e:
            self.error = e


def keyframe_gaps(packets: list[tuple[float, bool]]) -> tuple[list[float], float]:
    """(gaps between consecutive keyframes, the longest interval between two frames)."""
    keys = [t for t, k in packets if k]
    times = sorted(t for t, _ in packets)
    return list(np.diff(keys)), float(np.max(np.diff(times)))


def delivered_fps(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0])


@pytest.mark.slow
def test_slow_output_keyframes_every_second_and_declares_its_rate(tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=SECONDS, fps=IN_FPS, size=(320, 240))
    cfg = load_config(None, [f"encode.gop_seconds={GOP_S}"])
    job = LiveJob(cfg, backend_factory=slow_backends(SWAP_S))
    job.set_source_image(astronaut(), "astronaut")
    hls = tmp_path / "hls"
    with NginxRtmp(tmp_path / "nginx") as nginx:
        viewer = RtmpViewer(nginx.url("out"))
        watcher = HlsWatcher(hls)
        try:
            stats = job.run_live(str(clip), rtmp_out=nginx.url("out"), hls_dir=hls, reconnect_seconds=5)
        finally:
            watcher.finish()
            job.close()
        viewer.thread.join(15)
    assert viewer.error is None, viewer.error
    # The premise: the output runs far below the input's rate.
    assert stats.dropped > stats.frames_out and stats.frames_out >= 25, stats

    # RTMP: what a viewer receives.
    assert len(viewer.packets) >= 25, len(viewer.packets)
    gaps, longest = keyframe_gaps(viewer.packets)
    assert len(gaps) >= 5, (gaps, viewer.packets)
    assert all(abs(g - GOP_S) <= longest + 1e-3 for g in gaps), (gaps, longest)
    delivered = delivered_fps(sorted(t for t, _ in viewer.packets))
    assert delivered < IN_FPS / 3, delivered
    assert viewer.declared is not None and abs(viewer.declared - delivered) <= 0.15 * delivered, \
        (viewer.declared, delivered)

    # HLS: segments of two GOPs (one holds 5-6 frames at this rate, fewer than HLS_SEGMENT_FRAMES
    # with its margin), one target duration throughout.
    names = sorted(watcher.data)
    assert len(names) >= 3, watcher.durations
    assert set(watcher.targets) == {round(2 * GOP_S)}, sorted(set(watcher.targets))
    whole = tmp_path / "all.ts"
    whole.write_bytes(b"".join(watcher.data[n] for n in names))
    with av.open(str(whole)) as c:
        v = c.streams.video[0]
        packets = [(float(p.pts * p.time_base), bool(p.is_keyframe)) for p in c.demux(v)
                   if p.pts is not None and p.size]
        sps_rate = float(v.codec_context.framerate)  # the H.264 stream's own timing (SPS)
    with av.open(str(whole)) as c:
        frames = [float(f.time) for f in c.decode(video=0)]
    assert len(frames) == len(packets), "a frame of the segments did not decode"
    gaps, longest = keyframe_gaps(packets)
    assert all(abs(g - 2 * GOP_S) <= longest + 1e-3 for g in gaps), (gaps, longest)
    for name in names[:-1]:  # the last one ends where the input did
        assert abs(watcher.durations[name] - 2 * GOP_S) <= longest + 1e-3, (name, watcher.durations)
    counts = []
    for name in names[:-1]:
        seg = tmp_path / name
        seg.write_bytes(watcher.data[name])
        with av.open(str(seg)) as c:
            counts.append(sum(1 for _ in c.decode(video=0)))
    assert min(counts) >= HLS_SEGMENT_FRAMES, counts
    delivered = delivered_fps(frames)
    assert abs(sps_rate - delivered) <= 0.15 * delivered, (sps_rate, delivered)
