"""`swapstream run`: a video file through one stream of a `StreamRuntime`, the same stage graph as
`live` and `serve` (docs/runtime.md): its reader, analysis, batched swap, compose and encode stages;
on a GPU, NVDEC, the device's analysis and the compose stage on the device.

What a file needs beyond a live stream is the stream's `lossless` option: no frame is dropped (the
reader waits for room instead), the degradation controller takes no step, and every audio packet
goes out. The source face is taken before the first frame is read, so that every frame is swapped.
The input is read as fast as the stages take it; the output is a file (`VideoWriter`, audio copied
or transcoded), or nothing for `null:`, and is signed with C2PA when configured.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..errors import ConfigError, InputError, OutputError
from ..io.video import VideoInfo, VideoReader, is_null_output, probe
from .live import OneStreamJob
from .stream import InputSpec, OutputSpec, StreamOptions, StreamSpec

log = logging.getLogger(__name__)

RUN_ID = "run"
STAGES = ("queue", "analyse", "swap_wait", "swap", "encode")
"""The stages of `JobStats.steps`, in the order a frame passes them (a file without a face in its
first frames would otherwise list the swap's last)."""
ProgressFn = Callable[[int, int], None]
"""Called with (frames done, expected total or 0 when unknown)."""
ConfirmFn = Callable[[str], bool]
"""Asked to accept a model licence (its text) before the model's first download."""
DownloadProgressFn = Callable[[str, int, int], None]
"""Called with (model name, bytes done, total bytes) while a model downloads."""


class LatencyRecord:
    """Per-frame latencies in memory that does not grow with the file: counts in bins 1% wide on a
    log scale from 10 µs to 100 s, so that a percentile is within 1% of the exact one."""

    LOW_S = 1e-5
    STEP = math.log(1.01)
    BINS = 1621
    """1.01 ** 1620 is just over 1e7: the last bin starts at 100 s and takes everything longer."""

    def __init__(self) -> None:
        self.counts = np.zeros(self.BINS, np.int64)
        self.n = 0

    def add(self, seconds: float) -> None:
        i = int(math.log(max(seconds, self.LOW_S) / self.LOW_S) / self.STEP)
        self.counts[min(i, self.BINS - 1)] += 1
        self.n += 1

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile (0-100) in milliseconds, None before any frame: the geometric middle
        of the bin that holds it."""
        if not self.n:
            return None
        rank = max(1, int(-(-q * self.n // 100)))  # ceil(q n / 100), without q / 100's rounding
        i = int(np.searchsorted(np.cumsum(self.counts), rank))
        return self.LOW_S * math.exp((i + 0.5) * self.STEP) * 1e3


@dataclass
class JobStats:
    """What a file run did, for the summary and for tests."""

    frames: int = 0
    """Video frames decoded and written."""
    frames_swapped: int = 0
    """Frames in which at least one face was swapped."""
    faces_swapped: int = 0
    """Face swaps performed, summed over frames."""
    tracks: set[int] = field(default_factory=set)
    """Distinct face track ids seen."""
    audio_packets: int = 0
    """Audio packets carried to the output."""
    seconds: float = 0.0
    """Wall time from the first decoded frame to the last one written."""
    input_info: VideoInfo | None = None
    """What the input looked like."""
    decoder: str = "pyav"
    """What decoded the video: `pyav` (FFmpeg on the host) or `nvdec` (the GPU's decoder)."""
    device: str = ""
    """Where the stream ran: `cpu` or `cuda:N`."""
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds of each stage, summed over the frames: `queue` (a decoded frame waiting for the
    analysis), `analyse`, `swap_wait` (for its batch to start), `swap`, `encode` (label, mark, and
    the output's encoder call). The stages overlap: they run in threads of their own."""
    latency: LatencyRecord = field(default_factory=LatencyRecord)
    """Each frame's time from its decoding to the end of its output call (encoded, or discarded by
    `null:`): waiting for the analysis, analysed, batched, swapped, marked, encoded."""

    def step_ms(self) -> dict[str, float]:
        """`steps` in milliseconds a frame."""
        return {k: v * 1e3 / self.frames for k, v in self.steps.items()} if self.frames else {}

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def expected_frames(info: VideoInfo) -> int:
    """Best guess of the frame count for the progress bar (0 when unknown)."""
    if info.frames:
        return info.frames
    if info.duration and info.avg_rate:
        return int(round(info.duration * float(info.avg_rate)))
    return 0


class FileSource:
    """A video file as a stream's source (`runtime.stream.Source`), read as fast as the stream takes
    it: PyAV's frames (`VideoReader`: turned upright, timestamps mended, a truncated file read to
    where it breaks), or with `packets` its H.264/HEVC access units for NVDEC, with the audio
    beside them (`LiveReader`)."""

    def __init__(self, path: Path, info: VideoInfo, *, packets: bool = False, even: bool = False) -> None:
        """`even`: the stream crops an odd width or height to even (on a GPU: `GpuDecode`)."""
        self.path, self.info = path, info
        self.packets = packets
        """Whether the stream's GPU decoder gets access units (NVDEC) rather than host frames."""
        self.info_fps = float(info.avg_rate or 30)
        self.rate: Fraction | None = info.avg_rate
        """The output file's nominal rate (`VideoWriter`)."""
        self.time_base: Fraction | None = info.time_base
        self.size = (info.width & ~1, info.height & ~1) if even else (info.width, info.height)
        """(width, height): the stream builds its label and mark for it before the first frame."""
        self.audio_stream: Any = None
        self._reader: Any = None
        self._stopped = False

    def open(self, *, wait_seconds: float = 0.0, on_wait: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> None:
        if self.packets:
            from ..live.streams import LiveReader

            self._reader = LiveReader(str(self.path), packets=True)
            self._reader.open()
            self.time_base = self._reader.time_base
        else:
            self._reader = VideoReader(self.path)
        self.audio_stream = self._reader.audio_stream

    def __iter__(self) -> Iterator[Any]:
        for item in self._reader:
            if self._stopped:
                return
            yield item

    def stop(self) -> None:
        self._stopped = True
        if self.packets and self._reader is not None:
            self._reader.stop()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


class RunJob(OneStreamJob):
    """Swaps every face of a video file into an output file (module doc): `set_source`, `run`,
    `close`. `confirm` and `download_progress`: asked before a zoo model's first download."""

    LIVE = False

    def __init__(self, config: Config, *, device: str | None = None, backend_factory: Any = None,
                 confirm: ConfirmFn | None = None, download_progress: DownloadProgressFn | None = None) -> None:
        super().__init__(config, device=device, backend_factory=backend_factory)
        if self.config.swapper != "mesh":
            from ..neural.factory import check_tracking, fetch_models

            # Its stream tracks with the zoo detector where one is configured (runtime.stream).
            check_tracking(self.config)
            # Now, where a licence can be asked for: the runtime builds the models in its device thread.
            fetch_models(self.config, confirm=confirm, progress=download_progress)

    def run(self, input_path: str | os.PathLike[str], output_path: str | os.PathLike[str],
            progress: ProgressFn | None = None) -> JobStats:
        """Swap every face of `input_path` into `output_path` (`null:` for none)."""
        inp, out = Path(input_path), Path(output_path)
        if out.exists() and inp.exists() and out.resolve() == inp.resolve():
            raise OutputError(f"output '{out}' is the input file. Choose another path with --output.")
        info = probe(inp)
        # Before the first frame: a bad signing key is an error before any work.
        sign = False if is_null_output(out) else self.provenance.plan(out)
        self.device = device = self._device()  # decided once: the runtime's device too
        gpu = device.startswith("cuda")
        source = FileSource(inp, info, packets=gpu and self._nvdec(info, device), even=gpu)
        stats = JobStats(input_info=info, device=device)
        total = expected_frames(info)
        cfg = self.config.model_copy(deep=True)
        cfg.runtime.media_nice = 0  # no control API to keep answering: the stream goes first
        spec = StreamSpec(RUN_ID, InputSpec(str(inp)),
                          (OutputSpec("null") if is_null_output(out) else OutputSpec("file", str(out)),),
                          swapper=cfg.swapper)
        options = StreamOptions(config=cfg, source=source, operator_urls=True, lossless=True, live=False,
                                source_face=self._source)

        def poll(pipeline: Any) -> None:
            if progress is not None and pipeline.frames_out:
                progress(pipeline.frames_out, total)

        pipeline = asyncio.run(self._one_stream(cfg, spec, options, threading.Event(), poll))
        stats.frames, stats.frames_swapped = pipeline.frames_out, pipeline.frames_swapped
        stats.faces_swapped, stats.audio_packets = pipeline.faces_swapped, pipeline.audio_packets
        stats.tracks = set(pipeline.track_ids)
        stats.decoder = "nvdec" if getattr(pipeline._decode, "nvdec_frames", 0) else "pyav"
        if pipeline.first_arrival is not None and pipeline.out_times:
            stats.seconds = pipeline.out_times[-1] - pipeline.first_arrival
        stats.steps = {k: pipeline.stage_seconds.get(k, 0.0) for k in STAGES}
        stats.latency = pipeline.latency_all
        if progress is not None:
            progress(stats.frames, total)
        if stats.frames == 0:
            raise InputError(f"input '{inp}' has no decodable video frames. Check that it is a complete "
                             f"video file.")
        if sign:
            self.sign_output(out, pipeline.disclosure)
        return stats

    def _nvdec(self, info: VideoInfo, device: str) -> bool:
        """Whether NVDEC decodes this input on `device` (else PyAV on the host, then an upload);
        says why not in the log, and raises it for `decoder=nvdec`."""
        mode = self.config.decoder
        if mode == "cpu":
            return False
        from ..gpu.pynvc import nvdec_available

        ok, why = nvdec_available(int(device.split(":")[1]))
        if ok and info.rotation:
            # PyAV turns such frames upright (VideoReader); the NVDEC path has no rotation step.
            ok, why = False, f"the video asks for a {info.rotation} degree display rotation"
        elif ok and info.codec not in ("h264", "hevc"):
            ok, why = False, f"its video is {info.codec}"
        if ok:
            return True
        if mode == "nvdec":
            raise ConfigError(f"decoder=nvdec, but NVDEC cannot decode '{info.path}': {why}. "
                              f"Use --set decoder=auto (PyAV when NVDEC cannot) or --set decoder=cpu")
        log.info("'%s': decoding with PyAV on the host (%s)", info.path, why)
        return False

    def sign_output(self, out: Path, disclosure: Any) -> None:
        """Sign the finished output with C2PA (after the writer closed it: the manifest's hash covers
        the complete media), declaring the mark's payload when the frames carry it."""
        from ..watermark import SCHEME as V1
        from ..watermark_v2 import SCHEME as V2

        marked = disclosure.watermarker is not None
        self.provenance.sign(out, disclosure.payload if marked else None,
                             V2 if disclosure.scheme == "v2" else V1)

