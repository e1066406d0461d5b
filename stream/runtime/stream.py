"""One stream inside the runtime: input thread, analysis, batched swap, encoding, joined by live queues.

```
reader thread ─► in ─► analyse (own thread) ─► swap ─► batcher (device thread) ─► encode ─► sinks
 (LiveReader)   queue    tracks faces          queue   shared by every stream     queue    (own thread)
```

Each arrow is a `DropOldestQueue` of `runtime.queue_frames` frames: when a stage falls behind, the
oldest waiting frame is dropped there and counted, and frames leave in pts order. A frame's latency is
measured from the moment the reader handed it over (decoded) to the moment its encoding finished;
the degradation controller compares the p99 of that with the stream's budget.

Every blocking call runs in a thread that belongs to this stream (reader, analysis, encoding) or to its
device (the swap), so a stream that stalls stalls only itself.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ..config import Config
from ..errors import InputError, SwapStreamError
from ..io.video import AudioPacket
from ..netpolicy import Outbound
from ..queues import DropOldestQueue, QueueClosed
from ..redact import RedactingFilter, redact_text, redact_url  # noqa: F401 - redact_url: its old home
from ..types import Face, Frame
from .controller import (DETECT_LESS, ENHANCER_OFF, LOW_RES, MESH, REGION_OFF, StreamObservation,
                         ladder)
from .metrics import StreamSnapshot
from .priority import media_thread
from .batcher import batch_weight
from .swappers import SwapFailed, SwapItem

if TYPE_CHECKING:
    from .manager import DeviceSlot
    from .metrics import RuntimeMetrics

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # input and output URLs carry stream keys

LATENCY_WINDOW_S = 10.0
"""The window of a stream's `latency_window_ms` in the API: what a benchmark or a dashboard reads
as the stream's latency now."""
LATENCY_WINDOW_FRAMES = 1200
"""Output frames kept for that window: 10 s at up to 120 fps."""
FILE_BATCH_WAIT_S = 0.25
"""Longest a file's first analysed frame waits for others to fill its swap batch (`runtime.file_batch`)."""

State = Literal["starting", "running", "stopping", "stopped", "ended", "failed"]


@dataclass(frozen=True)
class InputSpec:
    """Where a stream's frames come from."""

    url: str
    """rtmp://HOST/APP/KEY, or a local video file (callers that take requests resolve and check
    file names first: see api.py)."""
    realtime: bool = False
    """Pace a file at its own frame rate, as a live source would deliver it."""
    loop: bool = False
    """Start a file again when it ends; timestamps carry on increasing."""
    reconnect_seconds: float = 10.0
    """How long to keep reconnecting to a live input that dropped."""


@dataclass(frozen=True)
class OutputSpec:
    """Where a stream's swapped frames go."""

    kind: Literal["rtmp", "hls", "null", "webrtc", "vcam", "file"]
    target: str = ""
    """RTMP URL, or the folder for HLS (index.m3u8 and segments); for `vcam` the device (empty: the
    platform's default); for `file` a video file (`swapstream run`'s output: the container from its
    suffix, see `io.video.VideoWriter`); unused for `null` and `webrtc` (a WHIP publisher's own
    connection: the sink in the stream's `StreamOptions`, `runtime.rtc`)."""


@dataclass(frozen=True)
class StreamSpec:
    """Everything that defines a stream."""

    stream_id: str
    input: InputSpec
    outputs: tuple[OutputSpec, ...] = (OutputSpec("null"),)
    swapper: str = "mesh"
    """`mesh`, a zoo swapper, or another name the runtime's backend factory knows."""
    preset: str = "multi_stream"
    """Config preset for this stream's analysis (detector cadence, faces per frame)."""
    overrides: tuple[str, ...] = ()
    """`key=value` config overrides on top of the preset."""
    budget_ms: float | None = None
    """Latency budget (arrival to encoded, p99); None: the runtime's `runtime.budget_ms`."""


@dataclass
class StreamOptions:
    """How a stream is run beyond its `StreamSpec`, for streams a command or a WHIP session makes
    (not the API's, whose streams are their specs alone)."""

    config: Config | None = None
    """The stream's whole config (a command's `--config` and `--set`), instead of the spec's preset
    and overrides; the server's settings still win (manager.SERVER_SETTINGS)."""
    source: "Source | None" = None
    """Where frames come from, instead of `spec.input`'s URL (a WHIP publisher's video)."""
    sink: Any = None
    """The object of the `webrtc` output (`runtime.rtc.RtcSink`)."""
    wait_seconds: float = 0.0
    """How long a network input that is not publishing yet is waited for (`swapstream live`: the
    operator starts SwapStream first, then OBS); 0: it must be there."""
    on_wait: Callable[[], None] | None = None
    """Called once when that wait starts."""
    operator_urls: bool = False
    """The URLs are the operator's own (typed on the command line): no outbound policy. False: they
    came with an API request, and the server's policy applies."""
    output_reconnect_seconds: float = 30.0
    """How long each output may fail before the stream fails (`LiveWriter.reconnect_seconds`)."""
    max_frames: int | None = None
    """End the stream once this many frames are out (`swapstream live --max-frames`)."""
    lossless: bool = False
    """Every frame goes out (`swapstream run`, a file): the reader waits for room rather than a queue
    dropping the oldest frame, the controller takes no step (a file has no deadline, its quality
    is what was asked for), and the audio before the first frame and after the last is kept."""
    live: bool = True
    """Its outputs are live ones: labelled by default (`disclosure.label_live`); a file is not."""
    source_face: "tuple[np.ndarray, str, Path | None] | None" = None
    """(image, name, file) of the source face, taken at the start before the first frame is read,
    so that every frame is swapped (`swapstream run`); None: `set_source` comes after the start."""


class StoppedWhileStarting(SwapStreamError):
    """`stop()` came while `start()` was opening the input: the start was abandoned and undone."""


class Source(Protocol):
    """A stream's input as its reader thread drives it: `LiveReader` (a file or an RTMP URL) or a
    source handed to the stream (`runtime.rtc.RtcSource`, a WHIP publisher's video)."""

    info_fps: float
    """The frame rate the outputs are opened with."""
    audio_stream: Any
    """The input's audio stream (a PyAV stream the outputs copy), or None."""
    time_base: Fraction | None

    def open(self, *, wait_seconds: float = 0.0, on_wait: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> None:
        """Connect; a network input not publishing yet is waited for up to `wait_seconds`
        (`on_wait` called once when that wait starts), unless `stop` is set meanwhile."""

    def __iter__(self) -> Iterator[Any]:
        """Host `Frame`s, `VideoPacket`s (access units for NVDEC) and `AudioPacket`s, until the
        input ends or `stop()`."""

    def stop(self) -> None: ...

    def close(self) -> None: ...


class NullSink:
    """Counts frames and drops them: for benchmarks that measure everything but the output."""

    def __init__(self) -> None:
        self.frames = 0

    def write(self, frame: Frame) -> None:
        self.frames += 1

    def write_audio(self, packet: AudioPacket) -> None:
        pass

    def close(self) -> None:
        pass


def _before(packet: AudioPacket, frame: Frame) -> bool:
    """Whether an audio packet starts before a video frame (both on the reader's timeline)."""
    tb = packet.packet.time_base
    if packet.pts is None or frame.pts is None or tb is None or frame.time_base is None:
        return False
    return float(packet.pts * tb) < float(frame.pts * frame.time_base)


@dataclass
class _Work:
    frame: Frame
    arrived: float
    faces: list[Face] = field(default_factory=list)
    swapped: int = 0
    analysed: float = 0.0
    """time.monotonic() when its faces came back and it went to the swap stage."""


def _batch_weight(w: _Work) -> int:
    """A queued frame's share of a swap batch, as the batcher counts it."""
    return batch_weight(len(w.faces))


class StreamPipeline:
    """A running stream. Built and driven by `StreamRuntime`; all methods run in its event loop."""

    def __init__(self, spec: StreamSpec, cfg: Config, slot: "DeviceSlot", metrics: "RuntimeMetrics",
                 budget_ms: float, options: StreamOptions | None = None) -> None:
        self.options = options or StreamOptions()
        if any(o.kind == "webrtc" for o in spec.outputs) != (self.options.sink is not None):
            raise ValueError("a webrtc output needs its sink, and a sink needs a webrtc output")
        self.spec = spec
        self.id = spec.stream_id
        self.cfg = cfg
        self.slot = slot
        self.metrics = metrics
        self.budget_ms = budget_ms
        rc = cfg.runtime
        # `low_res` rescales host frames around the swap; on a GPU the frames are swapped on the
        # device at full size, so the step would change nothing there and is left out. So is
        # `mesh` on a GPU: there the mesh swap holds the device thread longer than the neural swap
        # it replaces (3.9 ms a 1080p face with its occlusion mask, about 40 launches and host
        # work between them: tools/profile_mesh_gpu.py), and in two H200 runs of serve every
        # stream that took it was worse after it (docs/performance.md).
        on_gpu = slot.gpu_index is not None
        lossless = self.options.lossless
        self.steps = () if lossless else ladder(spec.swapper, low_res=not on_gpu, mesh=not on_gpu,
                                                enhancer=cfg.enhancer != "none",
                                                region="region" in cfg.mask.types)
        self.region = True
        """False once the controller's `region_off` step applies: this stream's faces skip the parser."""
        self.enhance = True
        """False once the controller's `enhancer_off` step applies: this stream's faces skip the enhancer."""
        self.level = 0
        self.backend_name = spec.swapper
        self.scale = 1.0
        self._base_detect_every = cfg.detector.detect_every
        self.state: State = "starting"
        self.error: str | None = None
        self.failure: SwapStreamError | None = None
        """The user's error that failed it (an `InputError`, an `OutputError`), for a command that
        reports it as such (`runtime.live`); None for other failures."""
        self.created = time.time()
        self.changed_mono = time.monotonic()
        """When this stream last put one-time work on its device (its start, a new source face's
        identity): the frames around it say nothing about the device's room (worker.load_report)."""
        self.finished: float | None = None
        """time.time() when an ended or failed stream had given back its resources."""
        pts: Any = lambda w: w.frame.pts  # noqa: E731
        # Lossless: at most `room` frames are between the reader and the outputs (the reader waits
        # for one to go out), and every queue holds that many, so none ever drops. Two batches'
        # worth and two more: the swap takes a full batch while the next one is analysed and the
        # last one encoded.
        room = max(rc.queue_frames, 2 * slot.batcher.max_batch + 2) if lossless else rc.queue_frames
        self._room: threading.Semaphore | None = threading.Semaphore(room) if lossless else None
        # A live input's frame that is not after the last one is refused; a file's goes on (its
        # writer moves a repeated pts on by a tick, and counts it: `VideoWriter.pts_bumped`).
        self.in_q: DropOldestQueue[_Work] = DropOldestQueue(room, pts_of=None if lossless else pts, name="input")
        self.swap_q: DropOldestQueue[_Work] = DropOldestQueue(room, name="swap")
        self.enc_q: DropOldestQueue[_Work] = DropOldestQueue(room, name="encode")
        # A live stream keeps its newest audio. A lossless one keeps all of it: the reader is at most
        # `room` frames ahead, so this holds what lies between them, except for a file's audio after
        # its last frame, which goes out at the end.
        self.audio: deque[AudioPacket] = deque() if lossless else deque(maxlen=2000)
        self.track_ids: set[int] = set()
        """The tracks its faces had (lossless streams only: `swapstream run`'s summary counts them;
        a live stream's would grow for as long as it runs)."""
        self.latency_all: Any = None
        """Every frame's latency (lossless streams: `swapstream run`'s percentiles are over the
        whole file, in `run.LatencyRecord`'s fixed memory)."""
        if lossless:
            from .run import LatencyRecord

            self.latency_all = LatencyRecord()
        self.first_arrival: float | None = None
        """time.monotonic() when its first frame arrived: a file's run is timed from there."""
        self.stage_seconds: Counter[str] = Counter()
        """Seconds spent per stage (queue, analyse, swap_wait, swap, encode, total) over its frames."""
        self.frames_in = 0
        self.audio_packets = 0
        self.dropped_at_first_out: int | None = None
        """Frames dropped before the first frame went out: what arrived while the stream started
        (a live command reports them apart; they are not the steady state's drops)."""
        self.arrivals: deque[float] = deque(maxlen=32)
        """The last frames' arrival times (monotonic): where in a frame period they arrive, for placement."""
        self.frames_out = 0
        self.faces_swapped = 0
        self.frames_swapped = 0
        self.frames_swap_failed = 0
        """Frames passed on unswapped because their batch failed (the stream carried on)."""
        self.pts_regressions = 0
        """Output frames whose pts was not after the previous one: must stay 0."""
        self.last_pts: int | None = None
        self.latency_recent: deque[float] = deque(maxlen=300)
        self.latency_timed: deque[tuple[float, float]] = deque(maxlen=LATENCY_WINDOW_FRAMES)
        """(output time, latency ms) of the last frames: the API's `latency_window_ms` is over the
        frames of the last `LATENCY_WINDOW_S` seconds, whatever came before (a start-up stall)."""
        self.latency_since_change: deque[float] = deque(maxlen=600)
        self.out_times: deque[float] = deque(maxlen=600)
        self.step_counts: Counter[tuple[str, str]] = Counter()
        self.history: deque[dict[str, Any]] = deque(maxlen=50)
        """The controller's steps for this stream: time, from, to, step, reason."""
        self.latest: np.ndarray | None = None
        """The last encoded frame (RGB), for previews."""
        self.source_image: np.ndarray | None = None
        self.source_version = 0
        # Responsible use, as in every job: each output frame is labelled (live outputs) and marked
        # (`disclosure`), and a source face is used only with a consent record.
        from ..consent import ConsentStore
        from ..disclosure import Disclosure

        self.disclosure = Disclosure(cfg, live=self.options.live)
        self.consents = ConsentStore.for_config(cfg)
        self.consent: Any = None
        self._identities: dict[str, Any] = {}
        self._identity_lock = asyncio.Lock()
        # Media threads run below the control loop's priority (priority.py): the API answers first.
        self._analyse_pool = ThreadPoolExecutor(1, thread_name_prefix=f"analyse-{self.id}",
                                                initializer=media_thread, initargs=(rc.media_nice,))
        self._encode_pool = ThreadPoolExecutor(1, thread_name_prefix=f"encode-{self.id}",
                                               initializer=media_thread, initargs=(rc.media_nice,))
        self._source = self.options.source
        self._reader: Any = None
        # The runtime's URLs come from API requests: every connection goes through the server's
        # outbound policy (runtime.allowed_hosts / allowed_ports), rtmps:// is verified.
        self._outbound = Outbound.from_config(rc, enforce=not self.options.operator_urls)
        self._analyser: Any = None
        self._decode: Any = None
        """On a GPU: gpu_stages.GpuDecode (frames into GPU memory); None on the CPU."""
        self._compose: Any = None
        """On a GPU: gpu_stages.GpuCompose (label, mark, NV12 on the device); None on the CPU."""
        self._sinks: list[Any] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._start_done: asyncio.Event | None = None
        """Set once `start()` has returned or raised (None: not called)."""
        self._stopping: asyncio.Future[None] | None = None
        self.done: asyncio.Event = asyncio.Event()
        # Frames encoded before this moment do not count for the controller: the first frames wait
        # for backends to build and identities to be computed, which says nothing about steady load.
        self._warm_until = time.monotonic() + 1.0
        # Frames that arrived before the last change were (partly) processed the old way: they do
        # not count for the p99 that judges the new level.
        self._changed_at = 0.0
        self.outputs_started_at: float | None = None
        """When every output had started encoding (`LiveWriter.started`; a null sink at once)."""

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the input (an unusable input raises InputError here) and start the stages.

        A `stop()` that comes meanwhile is seen after each step: what was opened is closed again and
        StoppedWhileStarting is raised, so no stage starts for a stream that was removed."""
        self._start_done = asyncio.Event()
        try:
            await self._start()
        finally:
            self._start_done.set()

    async def _start(self) -> None:
        from ..live.streams import LiveReader

        loop = asyncio.get_running_loop()
        inp = self.spec.input
        is_file = self._source is None and not re.match(r"^[a-z][a-z0-9+.-]*://", inp.url)
        if is_file and not Path(inp.url).is_file():
            self._shutdown_pools()
            raise InputError(f"input file '{inp.url}' does not exist")
        gpu = self.slot.gpu_index is not None
        nvdec = False
        if gpu:
            from .gpu_stages import HOST_NV12_MATRIX, GpuCompose, GpuDecode

            # The GPU stages of this same pipeline: NVDEC (or an upload) into GPU memory, analysis
            # with the device's other streams, label, mark and NV12 on the device.
            # Off the loop (it asks the driver for the decoder's capabilities), once per device.
            if self._source is not None:  # it decides itself what it hands over
                nvdec, why = getattr(self._source, "packets", False), "its source hands over decoded frames"
            else:
                nvdec, why = await loop.run_in_executor(None, self.slot.nvdec_available)
            if not nvdec:
                log.warning("stream %s: decoded on the CPU and uploaded (%s)", self.id, why)
            with self.slot._device():
                # A WebRTC source's resolution may change, and a failed access unit asks for a keyframe.
                self._decode = GpuDecode(self.id, nvdec, max_size=getattr(self._source, "max_size", None),
                                         on_error=getattr(self._source, "decode_failed", None),
                                         crop_odd=self._source is not None)
                # A file gets the matrix its writer tags it with (io.video.VideoWriter: BT.709).
                self._compose = GpuCompose(self.disclosure, matrix="bt709" if any(
                    o.kind == "file" for o in self.spec.outputs) else HOST_NV12_MATRIX)
        # A file ends at its end, or with `loop` LiveReader opens it again and carries the
        # timestamps on; only a network input reconnects. Pacing stays here (`_read`). With NVDEC
        # the reader hands over access units, which the decoder turns into GPU frames.
        self._reader = self._source or LiveReader(inp.url, reconnect_seconds=inp.reconnect_seconds,
                                                  loop=inp.loop and is_file, outbound=self._outbound,
                                                  media=is_file, packets=nvdec)

        def stopped_yet() -> None:
            if self._stop.is_set():
                raise StoppedWhileStarting(f"stream '{self.id}' was stopped while it was starting")

        try:
            stopped_yet()
            await loop.run_in_executor(self._analyse_pool, lambda: self._reader.open(
                wait_seconds=self.options.wait_seconds, on_wait=self.options.on_wait, stop=self._stop))
            stopped_yet()
            if gpu and self._zoo_detector():
                # On a GPU the detector runs in the device thread, between swaps: its runner may
                # capture CUDA graphs, which fails while another thread works on the GPU.
                self._analyser = await self.slot.call(self.backend_name, lambda _b: self._own_analyser())
            else:
                self._analyser = await loop.run_in_executor(self._analyse_pool, self._own_analyser)
            stopped_yet()
            if self.options.source_face is not None:
                await self.set_source(*self.options.source_face)
            if self.options.lossless and getattr(self._reader, "size", (0, 0))[0] > 0:
                await loop.run_in_executor(self._encode_pool, self._warm_disclosure)
            stopped_yet()
        except BaseException:
            self._close_unstarted()
            raise
        self._thread = threading.Thread(target=self._read, args=(loop, inp.realtime and is_file),
                                        name=f"read-{self.id}", daemon=True)
        # Its decoder and first frames come now (opening a network input can take seconds).
        self.changed_mono = time.monotonic()
        self.state = "running"
        self._thread.start()
        self._tasks = [loop.create_task(self._analyse(), name=f"analyse-{self.id}"),
                       loop.create_task(self._swap(), name=f"swap-{self.id}"),
                       loop.create_task(self._encode(), name=f"encode-{self.id}")]

    def _own_analyser(self) -> Any:
        """This stream's own face analyser (built in, and used in, its analysis thread), or None where
        its device's analysis serves it: the built-in networks on a GPU (`DeviceSlot.analyse`). A
        neural swapper with a zoo detector (`neural.detector`) has its own on either device."""
        from ..face.analyser import FaceAnalyser

        if self._zoo_detector():
            from ..neural.factory import detector_analyser

            return detector_analyser(self.cfg)
        return None if self.slot.gpu_index is not None else FaceAnalyser(self.cfg)

    def _zoo_detector(self) -> bool:
        """Whether this stream's faces come from the zoo detector of `neural.detector`: `run`'s
        (lossless) streams with a neural swapper, as the file job before the runtime tracked them.
        Live streams keep the built-in analyser whatever the preset says: their faces carry the mesh
        that an `area` mask and the controller's `mesh` step need."""
        return (self.options.lossless and self.spec.swapper != "mesh"
                and self.cfg.neural.detector != "builtin")

    def _warm_disclosure(self) -> None:
        """Build the label and the mark for the input's frame size before the first frame (a file's
        run, whose time counts from there): on the first frame they took 40 ms at 720p on the CPU."""
        w, h = self._reader.size
        if self._compose is None:
            self.disclosure.warm_up(np.zeros((h, w, 3), np.uint8))
            return
        import cupy

        with self.slot._device(), self._compose.stream:
            self.disclosure.warm_up(cupy.zeros((h, w, 3), cupy.uint8))
            self._compose.stream.synchronize()

    def _close_unstarted(self) -> None:
        """Undo a start that did not get to the stages: the opened input, the analyser, the pools."""
        # The opened input was never iterated: its container is the reader's template, which
        # `close` releases.
        if self._reader is not None:
            try:
                self._reader.close()
            except Exception:
                log.exception("stream %s: closing the input", self.id)
        if self._analyser is not None:
            self._analyser.close()
            self._analyser = None
        self._shutdown_pools()

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop reading, let the few frames in flight finish (up to `timeout`), close the outputs.
        Safe to call more than once and concurrently: every caller returns when the stream is down.
        During `start()`, it waits for the start to notice and undo itself."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_now(timeout))
        await asyncio.shield(self._stopping)

    async def _stop_now(self, timeout: float) -> None:
        if self.state in ("stopped", "ended", "failed") and not self._tasks:
            return
        if self.state in ("starting", "running"):
            self.state = "stopping"
        self._stop.set()
        if self._reader is not None:
            self._reader.stop()
        self.in_q.close()
        if self._start_done is not None:
            await self._start_done.wait()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
        loop = asyncio.get_running_loop()
        if self._thread is not None:
            # The reader notices the stop between two reads (at most its 2 s read timeout). Polled,
            # not joined in the default executor: its few workers also serve /metrics, and streams
            # stopping together queued there behind each other's joins.
            deadline = loop.time() + 5.0
            while self._thread.is_alive() and loop.time() < deadline:
                await asyncio.sleep(0.02)
        if self._reader is not None and (self._thread is None or not self._thread.is_alive()):
            self._reader.close()  # the writers are closed: their audio template may go
        if self._analyser is not None:
            await loop.run_in_executor(self._analyse_pool, self._analyser.close)
            self._analyser = None
        if self._decode is not None:
            await self.slot.forget(self.id)
            if self._thread is None:
                self._decode.close()  # no reader thread ever used it (the reader closes its own)
        self._shutdown_pools()
        if self.state == "stopping":
            self.state = "stopped"
        self.done.set()

    def _shutdown_pools(self) -> None:
        self._analyse_pool.shutdown(wait=False)
        self._encode_pool.shutdown(wait=False)

    def _fail(self, message: str, exc: SwapStreamError | None = None) -> None:
        # The message becomes the stream's `error` in the API: the input's errors quote its URL.
        message = redact_text(message)
        if self.state not in ("stopped", "failed"):
            log.error("stream %s failed: %s", self.id, message)
            self.state = "failed"
            self.error = message
            self.failure = exc
        self._stop.set()
        if self._reader is not None:
            self._reader.stop()

    # -- the source face ------------------------------------------------------------------------

    async def set_source(self, image: np.ndarray, name: str = "the uploaded image",
                         path: str | Path | None = None) -> None:
        """Use the largest face of `image` from the next frame on; NoFaceError leaves the old one.
        `name` and `path` (the file it was read from, if any) are for the consent check."""
        async with self._identity_lock:
            ident = await self.slot.call(self.backend_name, lambda b: b.identity(image))
            # After the face check, so that a picture without a face says so rather than ask for
            # consent. ConsentError leaves the old face in place.
            self.consent = self.consents.require(image, name, path)
            log.info("stream %s: source face: %s", self.id, self.consent.summary())
            self.source_image = image
            self._identities = {self.backend_name: ident}
            self.source_version += 1
            self._after_one_time_work(time.monotonic())  # frames of the old face judge nothing

    async def _identity(self, backend: str) -> Any:
        """This stream's identity for `backend`, computed on first use (after a switch to mesh)."""
        ident = self._identities.get(backend)
        if ident is not None:
            return ident
        async with self._identity_lock:
            if backend not in self._identities and self.source_image is not None:
                image = self.source_image
                self._identities[backend] = await self.slot.call(backend, lambda b: b.identity(image))
                # One-time device work (the identity, perhaps the backend itself).
                self._after_one_time_work(time.monotonic())
            return self._identities.get(backend)

    def _after_one_time_work(self, now: float, stall_s: float = 0.0) -> None:
        """One-time work just ended: the frames that waited behind it judge neither the controller's
        last step nor the worker's room for more streams (`changed_mono`), and those that arrive
        while its backlog drains (about as long as the stall, at most 2 s) not the controller."""
        self.latency_since_change.clear()
        self._changed_at = max(self._changed_at, now + min(stall_s, 2.0))
        self.changed_mono = now

    # -- the controller's steps -----------------------------------------------------------------

    def observation(self) -> StreamObservation:
        lat = sorted(self.latency_since_change)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
        return StreamObservation(self.id, p99, len(lat), self.budget_ms, self.level, self.steps)

    def apply_level(self, level: int) -> None:
        """Set the stream to `level` steps down its ladder (0: as configured)."""
        applied = set(self.steps[:level])
        rc = self.cfg.runtime
        # The analyser reads the config on every frame, so this takes effect on the next one.
        self.cfg.detector.detect_every = (self._base_detect_every * rc.detect_less_factor
                                          if DETECT_LESS in applied else self._base_detect_every)
        self.backend_name = "mesh" if MESH in applied else self.spec.swapper
        self.scale = rc.low_res_scale if LOW_RES in applied else 1.0
        self.region = REGION_OFF not in applied
        self.enhance = ENHANCER_OFF not in applied
        self.level = level
        # The p99 that decides the next step must be measured at this level only. Frames that arrive
        # shortly after the change still wait behind work of the old level (a slow batch in flight
        # on the device thread): as long as the old p99, capped at 2 s, they do not count either.
        before = self.observation().p99_ms or 0.0
        self.latency_since_change.clear()
        self._changed_at = time.monotonic() + min(before / 1e3, 2.0)

    # -- the stages -----------------------------------------------------------------------------

    def _read(self, loop: asyncio.AbstractEventLoop, pace: bool) -> None:
        """Reader thread: decode, stamp the arrival time, hand over to the loop."""
        media_thread(self.cfg.runtime.media_nice)
        t0: float | None = None
        time0 = 0.0
        if self._decode is not None:
            import cupy

            cupy.cuda.Device(self.slot.gpu_index).use()  # this thread's GPU: the stream's device
        try:
            for item in self._reader:
                if self._stop.is_set():
                    break
                if isinstance(item, AudioPacket):
                    self.audio_packets += 1  # this thread is its only writer
                    loop.call_soon_threadsafe(self.audio.append, item)
                    continue
                if pace:
                    ft = (item.time if isinstance(item, Frame) and item.time is not None
                          else float(item.pts * item.time_base) if getattr(item, "time_base", None)
                          else item.index / 30.0)
                    now = time.monotonic()
                    if t0 is None or now - (t0 + ft - time0) > 0.1:
                        # Start, or fell behind (a file reopened when looping): re-anchor the clock
                        # instead of delivering a burst, as a live source would.
                        t0, time0 = now, ft
                    wait = t0 + ft - time0 - now
                    if wait > 0 and self._stop.wait(wait):
                        break
                frames = [item] if self._decode is None else self._decode.decode(item)
                if not self._hand_over(loop, frames):
                    break
            if self._decode is not None and not self._stop.is_set():
                # What a reordering decoder held back.
                self._hand_over(loop, self._decode.flush(self._reader.time_base))
        except SwapStreamError as e:
            self._tell(loop, self._fail, str(e), e)
        except Exception as e:  # a decoder failure we did not expect: this stream ends, not the process
            if isinstance(e, RuntimeError) and loop.is_closed():
                return  # call_soon_threadsafe on a closed loop: the runtime is gone, nobody to tell
            log.exception("stream %s: reader failed", self.id)
            self._tell(loop, self._fail, f"reading the input failed: {e}")
        finally:
            if self._decode is not None:
                self._decode.close()  # in the thread that used it, whenever it ends (its NVDEC session)
        self._tell(loop, self.in_q.close)

    def _hand_over(self, loop: asyncio.AbstractEventLoop, frames: list[Frame]) -> bool:
        """Reader thread: the frames to the analysis, each stamped with its arrival (after the wait
        for room, on a lossless stream: the wait is not the pipeline's latency). False: stopped."""
        for f in frames:
            if not self._wait_for_room():
                return False
            f.stream_id = self.id
            loop.call_soon_threadsafe(self._arrive, _Work(f, time.monotonic()))
        return True

    @staticmethod
    def _tell(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` in the loop, from another thread, unless the loop has closed meanwhile."""
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            if not loop.is_closed():
                raise

    def _observe(self, stage: str, seconds: float) -> None:
        self.metrics.observe_stage(self.id, stage, seconds)
        self.stage_seconds[stage] += seconds

    def _wait_for_room(self) -> bool:
        """Lossless: wait until fewer than `room` frames are on their way (False: stopped meanwhile)."""
        if self._room is None:
            return True
        while not self._room.acquire(timeout=0.1):
            if self._stop.is_set():
                return False
        return True

    def _arrive(self, w: _Work) -> None:
        if self.first_arrival is None:
            self.first_arrival = w.arrived
        self.frames_in += 1
        self.arrivals.append(w.arrived)
        if self.in_q.put(w) is not None and self._room is not None:
            self._room.release()  # refused (the stream is stopping): its room is free again

    async def _analyse(self) -> None:
        # Frames whose analysis was asked for, oldest first, up to `runtime.analysis_depth`. Past
        # 1, a frame that arrives while the one before is analysed is asked for at once, so that
        # the analysis thread goes on to it without a trip through this loop. Every path below runs
        # in one thread, in the order asked (the device's analysis batcher takes one frame of a
        # stream per batch), so each frame is tracked after the one before.
        ahead: deque[tuple[_Work, float, Awaitable[list[Face]]]] = deque()
        depth = self.cfg.runtime.analysis_depth
        getter: asyncio.Future[_Work] | None = None
        """The next frame's `in_q.get()` while an answer is awaited too (depth above 1)."""
        closed = False
        done_at = 0.0
        try:
            while ahead or not closed:
                oldest = ahead[0][2] if ahead else None
                answered = isinstance(oldest, asyncio.Future) and oldest.done()
                if oldest is not None and (closed or len(ahead) >= depth or answered):
                    w, asked, faces = ahead.popleft()
                    w.faces = await faces
                    now = time.monotonic()
                    # The stage's time for this frame: from when it was asked for, or from the last
                    # frame's answer if it was asked for before that (the stages' sum stays wall time).
                    self._observe("analyse", now - max(asked, done_at))
                    done_at = now
                    if self.options.lossless:
                        self.track_ids.update(f.track_id for f in w.faces)
                    w.analysed = now
                    self.swap_q.put(w)
                    continue
                try:
                    if oldest is None and getter is None:
                        w = await self.in_q.get()
                    else:
                        # The next frame or the oldest frame's answer, whichever comes first.
                        getter = getter or asyncio.ensure_future(self.in_q.get())
                        await asyncio.wait([f for f in (getter, oldest) if isinstance(f, asyncio.Future)],
                                           return_when=asyncio.FIRST_COMPLETED)
                        if not getter.done():
                            continue
                        w, getter = getter.result(), None
                except QueueClosed:
                    closed, getter = True, None
                    continue
                t = time.monotonic()
                self._observe("queue", t - w.arrived)
                faces = self._ask_faces(w)
                # Ahead of its turn it must be asked for now (a task); in turn it is awaited next,
                # in this task, which spares the loop a round.
                ahead.append((w, t, asyncio.ensure_future(faces) if depth > 1 else faces))
        except Exception as e:
            log.exception("stream %s: analysis failed", self.id)
            self._fail(f"face analysis failed: {e}")
        finally:
            if getter is not None:
                getter.cancel()
            for _w, _t, faces in ahead:  # a failed stream's frames asked for ahead go nowhere
                if isinstance(faces, asyncio.Future):
                    faces.cancel()
                elif inspect.iscoroutine(faces):
                    faces.close()
            self.swap_q.close()

    def _ask_faces(self, w: _Work) -> Awaitable[list[Face]]:
        """A frame's faces: from the GPU's analysis batcher, a zoo detector in the swap thread, or
        this stream's analyser in its thread (asked for at once: a future)."""
        if self._analyser is None:
            return self.slot.analyse(self.id, w.frame, self.cfg, w.arrived + self.budget_ms / 1e3)
        if self._decode is not None:  # a zoo detector on a GPU (`_start`)
            return self.slot.call(self.backend_name, lambda _b, f=w.frame: self._analyser.track(f))
        return asyncio.get_running_loop().run_in_executor(self._analyse_pool, self._analyser.track, w.frame)

    async def _swap(self) -> None:
        try:
            while True:
                first = await self.swap_q.get()
                # Frames that queued up while the last batch ran go to the batcher together (one
                # stream alone can then still fill a batch), counted in faces as the batcher counts.
                room = self.slot.batcher.max_batch - _batch_weight(first)
                if room > 0 and self.options.lossless and self.cfg.runtime.file_batch:
                    # A file's frames are not on a clock: one model call for a batch of them costs
                    # the host and the GPU less than a call each (`runtime.file_batch`).
                    await self.swap_q.wait_for_items(room, FILE_BATCH_WAIT_S, _batch_weight)
                ws = [first] + self.swap_q.drain(room, _batch_weight)
                await asyncio.gather(*(self._swap_one(w) for w in ws))
                for w in ws:
                    self.enc_q.put(w)
        except QueueClosed:
            pass
        except SwapStreamError as e:
            self._fail(str(e), e)
        except Exception as e:
            log.exception("stream %s: swap failed", self.id)
            self._fail(f"swap failed: {e}")
        finally:
            self.enc_q.close()

    async def _swap_one(self, w: _Work) -> None:
        if not w.faces or self.source_image is None:
            return
        backend = self.backend_name
        identity = await self._identity(backend)
        if identity is None:
            return
        item = SwapItem(w.frame.data, w.faces, identity, self.scale, region=self.region,
                        enhance=self.enhance, stream_id=self.id)
        try:
            w.swapped = await self.slot.batcher.submit(self.id, backend, len(w.faces),
                                                       w.arrived + self.budget_ms / 1e3, item)
        except SwapFailed as e:
            if self.options.lossless:
                # A file is not written with frames left unswapped as if it were complete.
                raise SwapStreamError(f"swapping the faces of frame {w.frame.index} failed: {e}") from None
            # The frame is as it came; it is labelled and marked on its way out like any other.
            self.frames_swap_failed += 1
            w.swapped = 0
        if item.ended:
            # From the end of its analysis: its wait in the swap queue (behind the last batch, or
            # for a file's batch to fill) and then in the batcher.
            self._observe("swap_wait", max(0.0, item.started - w.analysed))
            self.metrics.observe_stage(self.id, "swap", item.ended - item.started)
            self.stage_seconds["swap"] += item.share  # a batch of n frames is not n frames' work

    async def _encode(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                w = await self.enc_q.get()
                audio = list(self.audio)
                self.audio.clear()
                t = time.monotonic()
                await loop.run_in_executor(self._encode_pool, self._write, w.frame, w.swapped > 0, audio)
                now = time.monotonic()
                self._observe("encode", now - t)
                self._observe("total", now - w.arrived)
                if self.outputs_started_at is None and all(getattr(s, "started", True) for s in self._sinks):
                    # The outputs' start (held frames encoded at once, an RTMP connect) is one-time
                    # work, as an identity is: on the H200 with 16 RTMP outputs it put 230-470 ms p99s
                    # into the first window and stepped healthy streams down to mesh.
                    self.outputs_started_at = now
                    self._after_one_time_work(now, now - t)
                ms = (now - w.arrived) * 1e3
                if self.latency_all is not None:
                    self.latency_all.add(now - w.arrived)
                self.latency_recent.append(ms)
                self.latency_timed.append((now, ms))
                if now >= self._warm_until and w.arrived >= self._changed_at:
                    self.latency_since_change.append(ms)
                self.out_times.append(now)
                if w.frame.pts is not None:
                    if self.last_pts is not None and w.frame.pts <= self.last_pts:
                        self.pts_regressions += 1
                    self.last_pts = w.frame.pts
                if self.frames_out == 0:
                    d = self.drops()
                    self.dropped_at_first_out = d["input"] + d["swap"] + d["encode"]
                self.frames_out += 1
                if self._room is not None:
                    self._room.release()
                self.faces_swapped += w.swapped
                self.frames_swapped += 1 if w.swapped else 0
                if self.options.max_frames is not None and self.frames_out >= self.options.max_frames:
                    self._stop.set()  # the frames behind it are not written: the stream has ended
                    if self._reader is not None:
                        self._reader.stop()
                    self.in_q.close()
                    raise QueueClosed
                if self._compose is None:  # a GPU stream's preview comes from _write, now and then
                    self.latest = w.frame.data
        except QueueClosed:
            if self.state == "running":
                if self.options.lossless and self._sinks and self.audio:
                    # A file's audio after its last frame (a live stream's outputs end with the video).
                    audio = list(self.audio)
                    self.audio.clear()
                    await loop.run_in_executor(self._encode_pool, self._write_audio, audio)
                self.state = "ended"  # the input ended and every frame went out
        except SwapStreamError as e:
            self._fail(str(e), e)
        except Exception as e:
            log.exception("stream %s: encoding failed", self.id)
            self._fail(f"encoding failed: {e}")
        finally:
            sinks, self._sinks = self._sinks, []
            try:
                try:
                    await loop.run_in_executor(self._encode_pool, self._close_sinks, sinks)
                except RuntimeError:  # the pool is already shut down: close here
                    self._close_sinks(sinks)
            finally:
                self.done.set()  # whatever the closes did: a command waits for this

    def _close_sinks(self, sinks: list[Any]) -> None:
        """Close every output, each even when one before it fails; the first failure fails the stream
        (a file whose end could not be written, a full disk: the user's error, `OutputError`)."""
        for s in sinks:
            try:
                s.close()
            except SwapStreamError as e:
                self._fail(str(e), e)
            except Exception as e:
                log.exception("stream %s: closing an output failed", self.id)
                self._fail(f"closing an output failed: {e}")

    def _write(self, frame: Frame, swapped: bool, audio: list[AudioPacket]) -> None:
        if not self._sinks:
            self._sinks = self._open_sinks(frame)
            # The audio that came while the first frame was on its way (the stream's start: its
            # analyser, its source face) is not sent ahead of it: a player that joined then probed
            # a burst of audio alone and played no video (nginx-rtmp, PyAV's probe); the live job
            # before the runtime dropped it too.
            # A file (lossless) keeps it: its writer interleaves by time, and nothing may be lost.
            if not self.options.lossless:
                audio = [p for p in audio if not _before(p, frame)]
        if self._compose is not None:
            self._write_gpu(frame, swapped, audio)
            return
        self.disclosure.apply(frame.data, swapped)
        for s in self._sinks:
            s.write(frame)
        self._write_audio(audio)

    def _write_audio(self, audio: list[AudioPacket]) -> None:
        for s in self._sinks:
            for p in audio:
                s.write_audio(p)

    def _write_gpu(self, frame: Frame, swapped: bool, audio: list[AudioPacket]) -> None:
        """Label and mark on the device; the encoders get NV12 from one download, a null sink
        nothing (its frame is done when the device work is)."""
        with self.slot._device():
            nv12 = self._compose.compose(frame, swapped,
                                         download=any(not isinstance(s, NullSink) for s in self._sinks))
            preview = self._compose.preview(frame)
        if preview is not None:
            self.latest = preview
        for s in self._sinks:
            if isinstance(s, NullSink):
                s.write(frame)
            else:
                s.write_nv12(nv12, frame.pts, frame.time_base)
        self._write_audio(audio)

    def _open_sinks(self, first: Frame) -> list[Any]:
        from ..live.streams import LiveWriter

        h, w = first.data.shape[:2]
        common: dict[str, Any] = dict(width=w, height=h, fps=self._reader.info_fps,
                                      time_base=first.time_base, audio_from=self._reader.audio_stream,
                                      crf=self.cfg.encode.crf, gop_seconds=self.cfg.encode.gop_seconds,
                                      tags=self.disclosure.tags,
                                      threads=self.cfg.encode.threads,
                                      reconnect_seconds=self.options.output_reconnect_seconds)
        sinks: list[Any] = []
        try:
            for o in self.spec.outputs:
                if o.kind == "null":
                    sinks.append(NullSink())
                elif o.kind == "webrtc":
                    sinks.append(self.options.sink)
                elif o.kind == "vcam":
                    from ..live.vcam import VirtualCamera

                    sinks.append(VirtualCamera(width=w, height=h, fps=self._reader.info_fps,
                                               device=o.target or None))
                elif o.kind == "file":
                    from ..io.video import VideoWriter

                    enc = self.cfg.encode
                    rate = getattr(self._reader, "rate", None) or Fraction(self._reader.info_fps).limit_denominator(1001)
                    sinks.append(VideoWriter(o.target, width=w, height=h, time_base=first.time_base, rate=rate,
                                             crf=enc.crf, preset=enc.preset, codec=enc.codec,
                                             audio_from=self._reader.audio_stream,
                                             metadata=self.disclosure.tags, threads=enc.threads))
                elif o.kind == "rtmp":
                    sinks.append(LiveWriter(o.target, kind="rtmp", outbound=self._outbound, **common))
                else:
                    Path(o.target).mkdir(parents=True, exist_ok=True)
                    sinks.append(LiveWriter(str(Path(o.target) / "index.m3u8"), kind="hls", **common))
        except BaseException:
            for s in sinks:  # the outputs opened before the one that failed (an RTMP connection each)
                s.close()
            raise
        return sinks

    # -- what the API and /metrics show ---------------------------------------------------------

    def fps(self, window: float = 2.0) -> float:
        now = time.monotonic()
        # /metrics reads this in an executor thread while the loop appends: list() copies in one C
        # call, under the GIL, where iterating the deque could meet an append.
        n = sum(1 for t in list(self.out_times) if now - t <= window)
        return n / window

    def arrival_phase(self) -> float | None:
        """Where in its frame period this stream's frames arrive, as a fraction (0..1) of the period
        measured over its last frames; None before it has a few. Streams of one worker whose phases
        are close send their frames to the device together (runtime.placement)."""
        t = list(self.arrivals)
        if len(t) < 8 or t[-1] <= t[0]:
            return None
        period = (t[-1] - t[0]) / (len(t) - 1)
        # Measured from the last whole second of the clock, which every stream of the worker shares:
        # phases of streams at one frame rate compare (a period divides a second at 10, 25, 30 fps),
        # and an estimated period's small error adds up over one second, not over the clock's age.
        origin = math.floor(t[-1]) - 1.0
        # The circular mean: phases near 0 and near 1 are close, an arithmetic mean would say 0.5.
        angles = [2 * math.pi * (((x - origin) % period) / period) for x in t]
        a = math.atan2(sum(map(math.sin, angles)), sum(map(math.cos, angles)))
        return round((a / (2 * math.pi)) % 1.0, 3)

    def drops(self) -> dict[str, int]:
        return {"input": self.in_q.dropped, "swap": self.swap_q.dropped,
                "encode": self.enc_q.dropped, "out_of_order": self.in_q.out_of_order,
                "at_stop": self.in_q.refused + self.swap_q.refused + self.enc_q.refused}

    def info(self) -> dict[str, Any]:
        lat = sorted(self.latency_recent)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1) if lat else None

        return {
            "id": self.id, "state": self.state, "error": self.error,
            "input": redact_url(self.spec.input.url) if "://" in self.spec.input.url
            else Path(self.spec.input.url).name,
            "outputs": [{"type": o.kind} | ({"url": redact_url(o.target)} if o.kind == "rtmp" else {})
                        for o in self.spec.outputs],
            # "engine": the backend swapping now (mesh after the controller's step); a key clients read.
            "swapper": self.spec.swapper, "engine": self.backend_name, "preset": self.spec.preset,
            "device": self.slot.name, "budget_ms": self.budget_ms,
            "level": self.level, "steps_applied": list(self.steps[:self.level]),
            "ladder": list(self.steps), "history": list(self.history),
            "frames_in": self.frames_in, "frames_out": self.frames_out,
            "frames_swapped": self.frames_swapped, "faces_swapped": self.faces_swapped,
            "frames_swap_failed": self.frames_swap_failed,
            "nvdec_frames": getattr(self._decode, "nvdec_frames", 0),
            "dropped": self.drops(), "pts_regressions": self.pts_regressions,
            "queues": {"input": self.in_q.qsize(), "swap": self.swap_q.qsize(),
                       "encode": self.enc_q.qsize()},
            "fps": round(self.fps(), 2), "latency_ms": {"p50": pct(0.5), "p99": pct(0.99)},
            "latency_window_ms": self.latency_window(),
            "source": {"set": self.source_image is not None, "version": self.source_version},
            "created": self.created, "finished": self.finished,
        }

    def latency_window(self, seconds: float = 0.0, arrived_after: float = 0.0) -> dict[str, Any]:
        """p50, p99 and count of the latencies of the frames output in the last `seconds` (default
        LATENCY_WINDOW_S), of those that arrived after `arrived_after` (monotonic) only."""
        since = time.monotonic() - (seconds or LATENCY_WINDOW_S)
        lat = sorted(ms for t, ms in list(self.latency_timed) if t >= since and t - ms / 1e3 > arrived_after)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1) if lat else None

        return {"p50": pct(0.5), "p99": pct(0.99), "frames": len(lat), "seconds": seconds or LATENCY_WINDOW_S}

    def snapshot(self) -> StreamSnapshot:
        return StreamSnapshot(self.id, self.slot.name, self.frames_in, self.frames_out,
                              self.faces_swapped, self.drops(),
                              {"input": self.in_q.qsize(), "swap": self.swap_q.qsize(),
                               "encode": self.enc_q.qsize()},
                              self.fps(), self.level, self.budget_ms / 1e3, dict(self.step_counts),
                              running=self.state in ("starting", "running"))
