"""`swapstream live`: one stream of a `StreamRuntime` on one device, the same graph as a stream of
`swapstream serve` (docs/runtime.md): its reader, analysis, batched swap, compose and encode
stages, its drop-oldest queues and degradation controller; on a GPU, NVDEC, the device's analysis
and the compose stage on the device.

What the command adds is its own: the URLs are the operator's (no outbound policy), a network input
that is not publishing yet is waited for, each output may fail for the run's outage window before
the run ends, a file input plays at its own pace (once, or again and again), Ctrl+C (`stop`) ends
the run as its end does, and the figures come back as `LiveStats`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..errors import ConfigError
from ..live.streams import is_file_input
from .stream import InputSpec, OutputSpec, StreamOptions, StreamSpec

log = logging.getLogger(__name__)

POLL_S = 0.02
"""How often the run looks at `stop`, `max_frames` and the stream's state."""
LIVE_ID = "live"


@dataclass
class LiveStats:
    """What a live run did."""

    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    """Frames dropped because a stage fell behind the input (the stream's queues)."""
    dropped_at_start: int = 0
    """Of `dropped`, those before the first frame out: what arrived while the stream started and
    opened its outputs, which it skips to catch up with the live input."""
    faces_swapped: int = 0
    audio_packets: int = 0
    reconnects: int = 0
    nvdec_frames: int = 0
    """Frames NVDEC decoded (on a GPU)."""
    device: str = ""
    latency_ms: deque[float] = field(default_factory=deque)
    """Per frame, the stream's newest (`StreamPipeline.latency_timed`, 1,200): from its arrival
    (decoded, or its access unit read) to the end of its output call (x264's encode included)."""
    out_times: deque[float] = field(default_factory=deque)
    """Monotonic clock at the stream's newest output frames (`StreamPipeline.out_times`, 600), to
    see gaps (a dropped input) and when output resumed."""


class OneStreamJob:
    """A command's job as one stream of a runtime of its own on one device (`live`, `run`):
    `set_source`, then the command's own run method, then `close`. `device`: "cpu" or "cuda:N"
    (default: the config's `device`, a GPU where one is usable). `backend_factory`: the runtime's
    swap backends (tests slow them down)."""

    LIVE = True
    """Whether its outputs are live (labelled by default: disclosure.label_live)."""

    def __init__(self, config: Config, *, device: str | None = None, backend_factory: Any = None) -> None:
        from ..disclosure import Disclosure
        from ..provenance import Provenance

        self.config = config.model_copy(deep=True)
        self.live = type(self).LIVE
        # First: a wrong signing key is one error line before any model loads (provenance.py).
        self.provenance = Provenance(config.provenance)
        self.disclosure = Disclosure(self.config, live=self.live)
        """What the stream applies to every output frame: for the run's log. The stream's own is
        made from the same config, with this one's mark (its stream id, random when not configured)."""
        self.config.watermark.stream_id = self.disclosure.payload.stream_id
        self.consent: Any = None
        self.device = device
        self.backend_factory = backend_factory
        self._source: tuple[np.ndarray, str, Path | None] | None = None

    def set_source(self, path: str | os.PathLike[str]) -> None:
        """Take the identity from the largest face in an image file."""
        from ..io.image import load_image

        self.set_source_image(load_image(path), str(path), path=Path(path))

    def set_source_image(self, image: np.ndarray, name: str, *, path: str | os.PathLike[str] | None = None) -> None:
        """The source face, checked now as a job checks it (a face in it, a consent record for it)
        so that a bad one is one error line before the input is opened; the stream takes its
        identity when it starts."""
        self.consent = check_source(self.config, image, name, path)
        self._source = (image, name, Path(path) if path is not None else None)

    def _runtime(self, cfg: Config) -> Any:
        from .manager import StreamRuntime, default_backend_factory

        return StreamRuntime(cfg, devices=[self._device()],
                             backend_factory=self.backend_factory or default_backend_factory)

    async def _one_stream(self, cfg: Config, spec: StreamSpec, options: StreamOptions, stop: threading.Event,
                          on_poll: Callable[[Any], None] | None = None) -> Any:
        """Run `spec` as the one stream of a runtime until it ends or `stop` is set; returns its
        `StreamPipeline` once the runtime is closed (None: stopped while it started). The source
        face goes in after the start, unless `options.source_face` has it in before the first frame.
        `on_poll` sees the running stream every POLL_S. A failed stream raises its error."""
        if self._source is None:
            raise ConfigError("set the source face first (set_source)")
        runtime = self._runtime(cfg)
        await runtime.start()
        try:
            adding = asyncio.ensure_future(runtime.add_stream(spec, options))
            while not adding.done():
                if stop.is_set() and spec.stream_id in runtime.streams:
                    # Ctrl+C while the input is opened (or its publisher waited for): the start
                    # notices, undoes itself and raises; that is the run's end, not an error.
                    await runtime.streams[spec.stream_id].stop()
                    break
                await asyncio.wait({adding}, timeout=POLL_S)
            try:
                pipeline = await adding
            except Exception:
                if stop.is_set():
                    return None
                raise
            if options.source_face is None:
                await pipeline.set_source(*self._source)
            while not pipeline.done.is_set() and not stop.is_set():
                if on_poll is not None:
                    on_poll(pipeline)
                await asyncio.sleep(POLL_S)
            stop.set()
            await runtime.remove_stream(spec.stream_id)  # what is in flight goes out, the outputs close
        finally:
            await runtime.close()
        if pipeline.state == "failed":
            if pipeline.failure is not None:
                raise pipeline.failure  # the input's or an output's error, as the user's error
            from ..errors import SwapStreamError

            raise SwapStreamError(f"the stream failed: {pipeline.error}")
        return pipeline

    def _device(self) -> str:
        """The config's device: the CPU, or the first GPU where one is usable."""
        if self.device is not None:
            return self.device
        from .manager import default_devices
        from .metrics import GpuMonitor

        monitor = GpuMonitor()
        try:
            return default_devices(monitor, self.config.device)[0]
        finally:
            monitor.close()

    def close(self) -> None:
        """Nothing is held between runs: each run's runtime is closed at its end."""


class LiveJob(OneStreamJob):
    """Swaps faces in a live input and writes live outputs (module doc)."""

    def run_live(self, url: str, *, rtmp_out: str | None = None, hls_dir: Path | None = None,
                 max_frames: int | None = None, buffer_frames: int = 2,
                 stop: threading.Event | None = None, reconnect_seconds: float = 60.0,
                 vcam: bool = False, vcam_device: str | None = None, loop: bool = False,
                 on_wait: Callable[[], None] | None = None) -> LiveStats:
        """Run until the input ends (a file's end; a network input that stays away longer than
        `reconnect_seconds`), `max_frames` are out, or `stop` is set. A file input plays at its own
        pace, once, or again and again with `loop`.

        `reconnect_seconds` is the one outage window of the run: how long a network input that is
        not publishing yet is waited for (`on_wait` is called when that wait starts), how long a
        dropped input is reconnected to, and how long each output may fail before the run ends.
        `buffer_frames`: frames each of the stream's queues holds before it drops the oldest."""
        check_live_args(url, rtmp_out, hls_dir, vcam, vcam_device, loop)
        return asyncio.run(self._run(url, rtmp_out, hls_dir, max_frames, buffer_frames,
                                     stop or threading.Event(), reconnect_seconds, vcam, vcam_device,
                                     loop, on_wait))

    async def _run(self, url: str, rtmp_out: str | None, hls_dir: Path | None, max_frames: int | None,
                   buffer_frames: int, stop: threading.Event, reconnect_seconds: float, vcam: bool,
                   vcam_device: str | None, loop: bool, on_wait: Callable[[], None] | None) -> LiveStats:
        cfg = self.config.model_copy(deep=True)
        cfg.runtime.queue_frames = buffer_frames
        cfg.runtime.media_nice = 0  # no control API to keep answering: the stream goes first
        outputs = [OutputSpec("rtmp", rtmp_out)] if rtmp_out else []
        if hls_dir is not None:
            outputs.append(OutputSpec("hls", str(hls_dir)))
        if vcam:
            outputs.append(OutputSpec("vcam", vcam_device or ""))
        is_file = is_file_input(url)
        spec = StreamSpec(LIVE_ID, InputSpec(url, realtime=is_file, loop=loop and is_file,
                                             reconnect_seconds=reconnect_seconds),
                          tuple(outputs), swapper=cfg.swapper)
        options = StreamOptions(config=cfg, wait_seconds=0.0 if is_file else reconnect_seconds,
                                on_wait=on_wait, operator_urls=True, output_reconnect_seconds=reconnect_seconds,
                                max_frames=max_frames)
        stats = LiveStats()
        pipeline = await self._one_stream(cfg, spec, options, stop)
        if pipeline is None:
            return stats
        stats.device = pipeline.slot.name
        d = pipeline.drops()
        stats.frames_in, stats.frames_out = pipeline.frames_in, pipeline.frames_out
        stats.dropped = d["input"] + d["swap"] + d["encode"]
        stats.dropped_at_start = pipeline.dropped_at_first_out or 0
        stats.faces_swapped, stats.audio_packets = pipeline.faces_swapped, pipeline.audio_packets
        stats.reconnects = getattr(pipeline._reader, "reconnects", 0)
        stats.nvdec_frames = getattr(pipeline._decode, "nvdec_frames", 0)
        stats.latency_ms.extend(ms for _t, ms in pipeline.latency_timed)
        stats.out_times.extend(pipeline.out_times)
        return stats


def check_source(config: Config, image: np.ndarray, name: str,
                 path: str | os.PathLike[str] | None = None) -> Any:
    """A source face checked before any stream takes it, as a job checks its own: a face in it (the
    built-in analyser), then a consent record (`swapstream consent`), whose record is returned. A
    picture without a face says so rather than ask for consent. Used by `live` and `serve`."""
    from ..consent import ConsentStore
    from ..face.analyser import FaceAnalyser
    from ..swap.mesh import source_face

    analyser = FaceAnalyser(config)
    try:
        source_face(analyser.analyse_image(image), name)
    finally:
        analyser.close()
    return ConsentStore.for_config(config).require(image, name, path)


def check_live_args(url: str, rtmp_out: str | None, hls_dir: Path | None, vcam: bool,
                    vcam_device: str | None, loop: bool) -> None:
    """A live run's outputs and options, checked before anything is opened."""
    from ..live.vcam import check_vcam

    if rtmp_out is None and hls_dir is None and not vcam:
        raise ConfigError("a live run needs an output: --rtmp-out URL, --hls-dir FOLDER and/or --vcam")
    if rtmp_out is not None and not rtmp_out.lower().startswith(("rtmp://", "rtmps://")):
        # Anything else would be pushed as FLV wherever FFmpeg's protocol for it leads.
        raise ConfigError(f"--rtmp-out '{rtmp_out}' is not an RTMP URL: give "
                          f"rtmp://HOST[:PORT]/APP/KEY (or rtmps://); for HLS use --hls-dir")
    if loop and not is_file_input(url):
        raise ConfigError(f"--loop repeats a file input, and '{url}' is a network stream, which "
                          f"reconnects when it drops (--reconnect SECONDS); leave out --loop")
    if vcam:
        check_vcam(vcam_device)  # a missing device is known now, before waiting on the input

