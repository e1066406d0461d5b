"""The file job: decode a video, swap every face in it with a source identity, encode the result."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import cv2
import numpy as np

from .config import Config
from .consent import ConsentRecord, ConsentStore
from .disclosure import Disclosure
from .errors import InputError, InputNotFoundError, OutputError
from .face.analyser import FaceAnalyser
from .io.background import BackgroundCalls
from .io.video import AudioPacket, VideoInfo, VideoReader, is_null_output, open_writer, probe
from .provenance import Provenance
from .swap.mesh import MeshSwapper, source_face
from .swap.occlusion import occlusion_masker
from .types import Face, FaceSwapper, Frame

if TYPE_CHECKING:
    from .neural.factory import NeuralStages

log = logging.getLogger(__name__)


ENCODE_QUEUE = 4
"""Frames (and audio packets) that may wait for the file job's encoder thread: enough to ride out
x264's uneven per-frame times, few enough that memory stays small (four 720p RGB frames: 11 MB)."""

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
    """What a file job did, for the summary line and for tests."""

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
    """Wall time of the decode-swap-encode loop."""
    input_info: VideoInfo | None = None
    """What the input looked like."""
    decoder: str = "pyav"
    """What decoded the video: `pyav` (FFmpeg on the host) or `nvdec` (the GPU's decoder)."""
    steps: dict[str, float] = field(default_factory=dict)
    """Host seconds of the loop's steps, summed over the run: `read` (waiting for the next decoded
    frame: decoding itself on the CPU path, the reader thread's lag on the GPU one), `analyse`,
    `swap` (queueing it, on the GPU), `hand_over` (to the encoder: on the GPU the yuv420p conversion,
    the download and the wait for the frame before; on both, the wait for the encoder's queue)."""
    latency: LatencyRecord = field(default_factory=LatencyRecord)
    """Each frame's time from the loop taking it from the decoder to its hand-over to the encoder
    (its download done, on the GPU): held back for a batch, swapped, marked and converted."""
    slowest: tuple[float, str, int] = (0.0, "", 0)
    """The longest single step of the loop: (seconds, step, frames taken from the decoder when it
    ended), so that a one-time stall (a kernel compiled or a graph captured mid-run) is seen with
    where it happened. For `analyse` that count is the frame analysed; for `swap` the last frame of
    the batch; for `read` the frames before the one read."""

    def step_ms(self) -> dict[str, float]:
        """`steps` in milliseconds a frame."""
        return {k: v * 1e3 / self.frames for k, v in self.steps.items()} if self.frames else {}

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def load_image(path: str | os.PathLike[str], what: str = "source image") -> np.ndarray:
    """Read an image file as HxWx3 uint8 RGB, or raise an error naming the file and the fix."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{what} '{p}' does not exist. Check the path.")
    if p.is_dir():
        raise InputError(f"{what} '{p}' is a folder. Give the path of a PNG or JPEG file.")
    data = np.fromfile(p, dtype=np.uint8)
    img = cv2.imdecode(data, cv2.IMREAD_COLOR_RGB) if data.size else None
    if img is None:
        raise InputError(f"{what} '{p}' is not an image OpenCV can read. Give a PNG, JPEG, WebP "
                         f"or BMP file.")
    return np.ascontiguousarray(img)


def expected_frames(info: VideoInfo) -> int:
    """Best guess of the frame count for the progress bar (0 when unknown)."""
    if info.frames:
        return info.frames
    if info.duration and info.avg_rate:
        return int(round(info.duration * float(info.avg_rate)))
    return 0


@dataclass
class Decoded:
    """A decoded video frame on its way through `FileJob.run`, with what its frame path keeps for it."""

    frame: Frame
    slot: Any = None
    """The GPU path: the device ring's slot that holds the picture."""
    ready: Any = None
    """The GPU path: the event after which the picture is complete."""
    analysed: Any = None
    """The GPU path: the event after which analysis has read the picture (the swap writes it)."""


class FramePath(Protocol):
    """The part of `FileJob.run` that differs between the CPU and the GPU: where frames are decoded,
    analysed and swapped, and how they reach the encoder (`HostFrames`, `gpu.job.DeviceFrames`)."""

    @property
    def name(self) -> str:
        """For the encoder thread's name."""
        ...

    @property
    def decoder(self) -> str:
        """What decoded the video (`JobStats.decoder`), known once `items` has started."""
        ...

    @property
    def encode_queue(self) -> int:
        """Frames (and audio packets) that may wait for the encoder thread."""
        ...

    def warm_up(self) -> None:
        """Before the input is opened and the loop's clock starts: the swap's one-time work, where
        the loop will swap (`FileJob.warm_swap`)."""
        ...

    def items(self) -> Iterator[AudioPacket | Decoded]:
        """The input in file order; the first item opens the input and its decoder."""
        ...

    @property
    def audio_stream(self) -> Any:
        """The input's audio stream (None without one), known once `items` has started."""
        ...

    def analyse(self, analyser: Any, item: Decoded) -> list[Any]:
        """The tracked faces of `item`'s frame."""
        ...

    def swapping(self, batch: list[Decoded]) -> AbstractContextManager[Any]:
        """Where the swap of `batch`'s frames runs (the GPU path: its compute stream, after their
        analysis)."""
        ...

    def hand_over(self, item: Decoded, writer: Any, encoder: BackgroundCalls) -> int:
        """Send `item`'s swapped frame on to the writer; returns how many frames reached it now."""
        ...

    def finish(self, writer: Any, encoder: BackgroundCalls) -> int:
        """Send on every frame still held; returns how many."""
        ...

    def close(self) -> None:
        """Close the input (also after an error)."""
        ...


class HostFrames:
    """`FileJob.run`'s frames on the host: PyAV decodes them, the swap changes them in place, and the
    encoder thread (x264) takes each as it is while the loop goes on to the next frame."""

    name = "file"
    decoder = "pyav"
    encode_queue = ENCODE_QUEUE

    def __init__(self, job: FileJob, inp: Path, info: VideoInfo) -> None:
        self._job, self._inp, self._info = job, inp, info
        self._reader: VideoReader | None = None

    def warm_up(self) -> None:
        # One swap: the first call's one-time work (OpenCV's Lab tables for the mesh swapper's colour
        # transfer, 80 ms of a 720p run's first frame; ONNX Runtime's first run). The host has no
        # graphs per batch size to capture, so one batch size is enough.
        self._job.warm_swap(batches=1, size=(self._info.height, self._info.width))

    def items(self) -> Iterator[AudioPacket | Decoded]:
        self._reader = VideoReader(self._inp)
        for item in self._reader:
            yield item if isinstance(item, AudioPacket) else Decoded(item)

    @property
    def audio_stream(self) -> Any:
        return self._reader.audio_stream if self._reader is not None else None

    def analyse(self, analyser: Any, item: Decoded) -> list[Any]:
        return analyser.track(item.frame)  # type: ignore[no-any-return]

    def swapping(self, batch: list[Decoded]) -> AbstractContextManager[Any]:
        return nullcontext()

    def hand_over(self, item: Decoded, writer: Any, encoder: BackgroundCalls) -> int:
        # The frame's array is not touched again here.
        encoder.submit(writer.write, item.frame)
        return 1

    def finish(self, writer: Any, encoder: BackgroundCalls) -> int:
        return 0

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


class FileJob:
    """One source identity, one input video, one output video."""

    LIVE = False
    """Whether this job's outputs are live (labelled by default: see `disclosure`)."""

    def __init__(self, config: Config, *, confirm: ConfirmFn | None = None,
                 download_progress: DownloadProgressFn | None = None, live: bool | None = None) -> None:
        self.config = config
        self.live = type(self).LIVE if live is None else live
        # First: a wrong signing key is one error line before any model loads (provenance.py).
        self.provenance = Provenance(config.provenance)
        # Responsible use: every output frame goes through `disclosure` (label, mark); the source
        # face needs a consent record from `consents`, kept in `consent` for the run's log.
        self.disclosure = Disclosure(config, live=self.live)
        self.consents = ConsentStore.for_config(config)
        self.consent: ConsentRecord | None = None
        self.neural: NeuralStages | None = None
        self.mesh: MeshSwapper | None = None
        """The built-in swapper, when it is the one (`swapper` either way)."""
        self.source_image: np.ndarray | None = None
        self.source_face: Face | None = None
        self.analyser: Any
        self.swapper: FaceSwapper
        if config.swapper == "mesh":
            self.analyser = self._builtin_analyser(config)
            self.swapper = self.mesh = MeshSwapper(config.mesh, self.analyser.topology,
                                                   occlusion=occlusion_masker(config.mask, self.analyser.topology))
        else:
            # Imported here: the neural stages pull in ONNX and the runners, which the built-in
            # mesh path does not need.
            from .neural.factory import NeuralStages

            self.neural = NeuralStages(config, confirm=confirm, progress=download_progress)
            self.swapper = self.neural.swapper
            self.analyser = self.neural.analyser or self._builtin_analyser(config)

    def _builtin_analyser(self, config: Config) -> Any:
        """The built-in MediaPipe analyser; LiteRT on the CPU here, PyTorch in the GPU job."""
        return FaceAnalyser(config)

    def set_source(self, path: str | os.PathLike[str]) -> None:
        """Take the identity from the largest face in an image file."""
        self.set_source_image(load_image(path), str(path), path=path)

    def set_source_image(self, image: np.ndarray, name: str, *,
                         path: str | os.PathLike[str] | None = None) -> None:
        """Take the identity from the largest face in an RGB image; `name` is used in errors.

        The picture must have a consent record (`swapstream consent add`); `path`, the file it was
        read from, also matches a record by the file's hash. Raises ConsentError otherwise."""
        face = source_face(self.analyser.analyse_image(image), name)
        # After the face check, so that a picture without a face says so rather than ask for consent.
        self.consent = self.consents.require(image, name, path)
        log.info("source %s: %s", name, self.consent.summary())
        self.swapper.set_source(image, face)
        self.source_image = image  # a live job warms its models up on it
        self.source_face = face  # and the GPU job its swap model, without finding the face again

    def run(self, input_path: str | os.PathLike[str], output_path: str | os.PathLike[str],
            progress: ProgressFn | None = None) -> JobStats:
        """Swap every face of `input_path` into `output_path` (`null:` for none): the one file loop.
        The CPU and GPU jobs differ only in their frame path (`_frame_path`): where frames are
        decoded, analysed and swapped, and how they reach the encoder."""
        inp, out = Path(input_path), Path(output_path)
        if out.exists() and inp.exists() and out.resolve() == inp.resolve():
            raise OutputError(f"output '{out}' is the input file. Choose another path with --output.")
        info = probe(inp)
        stats = JobStats(input_info=info)
        total = expected_frames(info)
        enc = self.config.encode
        sign = self.plan_output(out)  # before the first frame: a bad key is an error before any work
        # A neural swapper batches the faces of several frames into one model call; the mesh
        # swapper takes a frame at a time. Frames wait in `pending` until theirs are swapped, audio
        # goes straight through, and frames keep their order.
        batch = self._swap_batch()
        path = self._frame_path(inp, info, out, batch)
        try:
            path.warm_up()
            items = path.items()
            first = next(items, None)  # opens the input (and its decoder) before the writer
            with open_writer(
                    out, width=info.width, height=info.height, time_base=info.time_base,
                    rate=info.avg_rate, crf=enc.crf, preset=enc.preset, codec=enc.codec,
                    audio_from=path.audio_stream, metadata=self.disclosure.tags,
                    threads=enc.threads) as writer, \
                    BackgroundCalls(depth=path.encode_queue, name=f"{path.name}-encoder") as encoder:
                pending: list[tuple[Decoded, list[Any]]] = []
                steps = stats.steps = {"read": 0.0, "analyse": 0.0, "swap": 0.0, "hand_over": 0.0}
                tick = time.perf_counter
                taken: deque[float] = deque()  # when each frame not yet handed over was taken

                def count(done: int) -> None:
                    # Frames are handed over in the order they were taken.
                    now = tick()
                    for _ in range(done):
                        stats.latency.add(now - taken.popleft())
                    stats.frames += done
                    if done and progress is not None:
                        progress(stats.frames, total)

                def spent(step: str, since: float) -> float:
                    now = tick()
                    steps[step] += now - since
                    if now - since > stats.slowest[0]:
                        stats.slowest = (now - since, step, len(taken) + stats.frames)
                    return now

                def flush() -> None:
                    if not pending:
                        return
                    t = tick()
                    with path.swapping([d for d, _ in pending]):
                        self._swap_pending([(d.frame, faces) for d, faces in pending], stats)
                    t = spent("swap", t)
                    for d, _ in pending:
                        count(path.hand_over(d, writer, encoder))
                    spent("hand_over", t)
                    pending.clear()

                t0 = tick()
                item = first
                while item is not None:
                    if isinstance(item, AudioPacket):
                        # Frames still pending (or in flight on the GPU) reach the writer after this
                        # packet; the muxer interleaves by timestamp.
                        encoder.submit(writer.write_audio, item)
                        stats.audio_packets += 1
                    else:
                        t = tick()
                        taken.append(t)
                        faces = path.analyse(self.analyser, item)
                        spent("analyse", t)
                        stats.tracks.update(f.track_id for f in faces)
                        pending.append((item, faces))
                        if len(pending) >= batch or sum(len(f) for _, f in pending) >= batch:
                            flush()
                    t = tick()
                    item = next(items, None)
                    spent("read", t)
                flush()
                t = tick()
                count(path.finish(writer, encoder))
                encoder.close()  # every frame encoded (and its error raised) before the time is taken
                spent("hand_over", t)
                stats.seconds = tick() - t0
                if stats.frames == 0:
                    # Raised inside the writer's block, so that it removes the empty output file.
                    raise InputError(f"input '{inp}' has no decodable video frames. Check that it is "
                                     f"a complete video file.")
        finally:
            path.close()  # the reader (and its thread and decoder), also after an error
        stats.decoder = path.decoder
        if sign:
            self.sign_output(out)
        return stats

    def _swap_batch(self) -> int:
        """The most frames whose faces `run` swaps together."""
        return self.neural.swapper.max_batch if self.neural is not None else 1

    def _frame_path(self, inp: Path, info: VideoInfo, out: Path, batch: int) -> FramePath:
        """Where `run` keeps its frames: on the host here (the GPU job: on the device)."""
        return HostFrames(self, inp, info)

    def warm_swap(self, batches: int = 1, size: tuple[int, int] | None = None) -> None:
        """Swap the source face on a copy of the source image before the first frame, so that the
        first frames do not wait for one-time work: the neural swap model's CUDA graph (captured,
        then replayed), the mesh swapper's workspaces and the occlusion mask's first model (on the
        CPU a live input's buffer dropped 4-5 of its first frames for them). The face is untracked
        (no colour state is kept) and the occlusion mask's per-track state is cleared after.

        `size` (height, width), the input's frame size when known: the label and the mark are built
        for it too (`Disclosure.warm_up`); built on the first frame they stalled it (40 ms at 720p on
        the CPU for the mark's pattern alone; the GPU file job's first batch likewise)."""
        if size is not None and size[0] > 0 and size[1] > 0:
            self.disclosure.warm_up(self._working_copy(np.zeros((*size, 3), np.uint8)))
        if self.source_image is not None and self.source_face is not None:
            face = replace(self.source_face, track_id=-1)
            frame = self._working_copy(self.source_image)
            if self.neural is not None:
                # Every batch size `run` will call with (`batches`): each is a graph of its own.
                self.neural.swapper.warm_up(frame, face, self.neural.swapper.identity(self.source_image, face),
                                            batches)
            else:
                self.swapper.swap(frame, [face])
                if self.mesh is not None and self.mesh.occlusion is not None:
                    self.mesh.occlusion.reset()
        self._finish_warm_up()

    def _working_copy(self, image: np.ndarray) -> Any:
        """`image` as an array of the frames this job swaps (host here; device in the GPU job)."""
        return image.copy()

    def _finish_warm_up(self) -> None:
        """Wait for the warm-up's work (the GPU job's queued kernels); nothing to wait for here."""

    def plan_output(self, out: Path) -> bool:
        """Whether `out` will be signed (C2PA), known before the first frame; never the null output."""
        return False if is_null_output(out) else self.provenance.plan(out)

    def sign_output(self, out: Path) -> None:
        """Sign the finished output with C2PA (after the writer closed it: the manifest's hash
        covers the complete media), declaring the mark's payload when the frames carry it."""
        from .watermark import SCHEME as V1
        from .watermark_v2 import SCHEME as V2

        marked = self.disclosure.watermarker is not None
        self.provenance.sign(out, self.disclosure.payload if marked else None,
                             V2 if self.disclosure.scheme == "v2" else V1)

    def _swap_pending(self, pending: list[tuple[Frame, list[Any]]], stats: JobStats) -> None:
        """Swap the faces of `pending`'s frames in place, and label and mark every one of them."""
        if self.neural is not None:
            items = [(frame.data, face) for frame, faces in pending for face in faces]
            stats.faces_swapped += self.neural.swapper.swap_many(items)
            stats.frames_swapped += sum(1 for _, faces in pending if faces)
            for frame, faces in pending:
                self.disclosure.apply(frame.data, bool(faces))
            return
        for frame, faces in pending:
            n = self.swap_faces(frame.data, faces)
            stats.frames_swapped += 1 if n else 0
            stats.faces_swapped += n

    def swap_faces(self, data: Any, faces: list[Any]) -> int:
        """Swap `faces` in the frame array `data` in place (host or GPU); returns how many.

        Every frame of the CPU mesh, GPU and live paths passes here, with or without faces, so this
        is where the label and the watermark go in (`disclosure`); the neural file path, which swaps
        a batch of frames at once, applies it in `_swap_pending`."""
        n = self.swapper.swap(data, faces) if faces else 0
        self.disclosure.apply(data, n > 0)
        return n

    def swap_frame(self, frame: Frame) -> int:
        """Track the faces of the next frame of a stream and swap them in place; returns how many."""
        return self.swap_faces(frame.data, self.analyser.track(frame))

    def close(self) -> None:
        self.analyser.close()
        if self.neural is not None:
            self.neural.close()
