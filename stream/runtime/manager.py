"""The runtime: many streams in one process, one set of swap backends and one batcher per device.

```
StreamRuntime
 ├─ DeviceSlot "cuda:0"   backends {mesh, inswapper_128, ...}, DynamicBatcher, controller, swap + analysis threads
 │    └─ streams placed here (StreamPipeline: reader, analysis, swap, encode)
 ├─ DeviceSlot "cuda:1"   ...
 └─ controller tick       every runtime.controller_interval: p99s and NVML -> steps up or down
```

A new stream goes to the least loaded device (`place`). Adding or removing a stream touches only its
own tasks and threads and its own requests in the batcher; the others carry on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from ..config import Config, load_config
from ..errors import ConfigError, SwapStreamError
from ..redact import RedactingFilter
from .batcher import BatchRecord, DynamicBatcher, batch_weight
from .controller import ControllerSettings, DegradationController
from .metrics import GpuMonitor, RuntimeMetrics, RuntimeSnapshot
from .priority import SwitchInterval, media_thread
from .stream import StoppedWhileStarting, StreamOptions, StreamPipeline, StreamSpec
from .swappers import BackendFactory, SwapBackend, SwapFailed, SwapItem, default_backend_factory
from .whip_relay import WHIP_ID_PREFIX

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # stream errors quote input and output URLs

T = TypeVar("T")

ANALYSIS_BATCH = 8
"""Most frames (of any streams) analysed in one call on a GPU: the landmark model's batch when each
has one face (its CUDA graphs are captured up to this size)."""

REMOVE_WAIT_S = 1.0
"""Longest the API's DELETE waits for a stream to be down: 1 s keeps the answer within the 2 s that
DELETE promises, with room for a loaded machine. A stream whose frames wait behind a busy device, or
whose output is slow to close, finishes stopping afterwards: its id stays taken and its threads
count against `runtime.max_streams` until it has."""

STREAM_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

WARM_ID = "warm-up"
"""The stream id of `DeviceSlot._warm_face`'s frames (not a valid API stream id: it has no stream)."""


SERVER_SETTINGS = ("models_dir", "runtime", "consent", "disclosure", "watermark", "webrtc", "provenance")
"""Config keys that are the server's, never a stream's: where files are read (models, consent
records, the C2PA signing key), the runtime itself, and what every output must carry (label,
watermark). Every stream gets the server's values, whatever its preset says; the API refuses
overrides of them."""


class StreamRequestError(SwapStreamError, ValueError):
    """A request the runtime cannot carry out as asked; `status` is the HTTP status that fits."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class StreamNotFound(SwapStreamError, KeyError):
    """No stream has that id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such stream"


# -- placement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotLoad:
    """How loaded one device is, for placing a new stream."""

    name: str
    streams: int
    busy: float
    """Share of the last few seconds the device's busier thread (swap or analysis) spent running
    batches, 0..1."""
    gpu_util: float | None = None
    """NVML utilisation 0..1 (None on the CPU or without NVML)."""
    memory_free: int | None = None
    """Free device memory in bytes (None when unknown)."""


def warm_picture(portrait: np.ndarray) -> np.ndarray:
    """The GPU warm-up's 720p frame (`DeviceSlot._warm_face`): the built-in portrait's head and
    shoulders, 480 px tall, centred on black, so that its face is about 180 px wide. The whole 512 px
    portrait put its face at 106 px, 11 px in the detector's 128 px input, which the GPU's plain
    bilinear downscale lost: the H200 found no face there, and every stream's first face paid the
    swap's compile."""
    import cv2

    head = portrait[58:314, 97:353]  # the head and shoulders of the 512x512 astronaut (`demo.astronaut`)
    face = cv2.resize(head, (480 * head.shape[1] // head.shape[0], 480), interpolation=cv2.INTER_LINEAR)
    picture = np.zeros((720, 1280, 3), np.uint8)
    y0, x0 = (720 - face.shape[0]) // 2, (1280 - face.shape[1]) // 2
    picture[y0:y0 + face.shape[0], x0:x0 + face.shape[1]] = face
    return picture


def place(loads: Sequence[SlotLoad], min_free_memory: int = 0) -> int:
    """Index of the device a new stream should go to: the one with the lowest load (the higher of its
    swap thread's busy share and its GPU utilisation), then the fewest streams, then the first.
    Devices with less free memory than `min_free_memory` are passed over unless all are."""
    if not loads:
        raise ValueError("no devices to place a stream on")
    roomy = [i for i, s in enumerate(loads)
             if s.memory_free is None or s.memory_free >= min_free_memory] or list(range(len(loads)))
    return min(roomy, key=lambda i: (round(max(loads[i].busy, loads[i].gpu_util or 0.0), 2),
                                     loads[i].streams, i))


# -- one device -----------------------------------------------------------------------------------


class DeviceSlot:
    """One device: its swap backends (built on first use), its batchers, its swap thread and, on a
    GPU, its analysis thread (`runtime.analysis_thread`)."""

    def __init__(self, name: str, config: Config, factory: BackendFactory, metrics: RuntimeMetrics,
                 controller: DegradationController) -> None:
        self.name = name
        self.config = config
        self._factory = factory
        self.metrics = metrics
        self.controller = controller
        m = re.match(r"^cuda:(\d+)$", name)
        self.gpu_index: int | None = int(m.group(1)) if m else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"swap-{name}", initializer=media_thread,
                                         initargs=(config.runtime.media_nice,))
        self._backends: dict[str, SwapBackend] = {}
        self.streams: set[str] = set()
        # (end, seconds) of each batch, per thread: the swap thread's, and the analysis thread's
        # where analysis has one (the same deque where it shares the swap thread).
        self._busy: deque[tuple[float, float]] = deque(maxlen=2000)
        self._stream_busy: deque[tuple[float, str, float]] = deque(maxlen=4000)
        """(end, stream id, seconds) of each frame in a swap batch, the batch's time split by faces:
        how the swap thread's time divides between streams (`stream_shares`)."""
        self._analysis_busy = self._busy
        self._analysis_pool = self._pool
        self.failed_frames = 0
        """Frames passed on unswapped because their batch failed."""
        self._failure_logged: dict[Hashable, float] = {}
        swap_wait_ms = config.runtime.max_wait_ms
        if self.gpu_index is not None:
            # A GPU slot's frames were gathered once already, for their analysis batch, and reach the
            # swap batcher together (or pile up while the swap thread is busy). A second wait there
            # paid up to max_wait_ms again for the rare frame of a later analysis batch: on the H200
            # at 32 720p streams a worst p99 of 52.4 ms with it, 30.6-30.7 ms without
            # (docs/benchmarks/serve_wait.md).
            swap_wait_ms = config.runtime.swap_max_wait_ms or 0.0
        self.batcher = DynamicBatcher(self._run, max_batch=config.neural.max_batch,
                                      max_wait=swap_wait_ms / 1e3, executor=self._pool,
                                      observer=self._observed, name=f"batcher-{name}",
                                      sources=lambda: self.streams)
        self._nvdec: tuple[bool, str] | None = None
        self._swap_stream: Any = None
        """On a GPU: the swap thread's CUDA stream (`_swap_context`)."""
        self._analysis: Any = None
        """On a GPU: the device's face analysis (gpu_stages.DeviceAnalysis), built and run in the
        analysis thread (the swap thread with `runtime.analysis_thread` off)."""
        self.analysis_batcher: DynamicBatcher | None = None
        if self.gpu_index is not None:
            # The streams' frames are analysed together, one landmark call for all of them: the same
            # batcher rules, a frame counting as one. In a thread of its own by default: the swap
            # thread then swaps one batch while this one runs the next frames' landmarks (each
            # thread waits for its GPU work with the GIL released), where one thread did the two in
            # turn and was 76-99% busy at 4 streams a worker (docs/performance.md). The analysis
            # networks and the swap models are separate objects, each called from one thread only.
            if config.runtime.analysis_thread:
                self._analysis_pool = ThreadPoolExecutor(1, thread_name_prefix=f"analysis-{name}",
                                                         initializer=media_thread,
                                                         initargs=(config.runtime.media_nice,))
                self._analysis_busy = deque(maxlen=2000)
            self.analysis_batcher = DynamicBatcher(self._analyse_batch, max_batch=ANALYSIS_BATCH,
                                                   max_wait=config.runtime.max_wait_ms / 1e3,
                                                   executor=self._analysis_pool, name=f"analysis-{name}",
                                                   observer=self._observed_analysis,
                                                   sources=lambda: self.streams,
                                                   max_in_flight=config.runtime.analysis_depth,
                                                   one_per_stream=True)

    def _device(self) -> Any:
        """A context that makes this slot's GPU current in the calling (worker) thread."""
        if self.gpu_index is None:
            from contextlib import nullcontext

            return nullcontext()
        import cupy

        return cupy.cuda.Device(self.gpu_index)

    def _swap_context(self) -> Any:
        """`_device()` and, on a GPU, the swap thread's own CUDA stream (non-blocking, made on first
        use): its batches neither queue behind nor hold up the other threads' work on the legacy
        default stream. Every swap-thread call enters it (warm-up, batches, identities), so the
        swap models' CUDA graphs are captured on the stream they replay on."""
        if self.gpu_index is None:
            return self._device()
        import cupy

        stack = ExitStack()
        stack.enter_context(cupy.cuda.Device(self.gpu_index))
        if self._swap_stream is None:
            self._swap_stream = cupy.cuda.Stream(non_blocking=True)
        stack.enter_context(self._swap_stream)
        return stack

    def _backend(self, name: str) -> SwapBackend:
        b = self._backends.get(name)
        if b is None:
            with self._swap_context():
                b = self._factory(name, self.config, self.name)
            self._backends[name] = b
        return b

    def _run(self, key: Hashable, items: list[SwapItem]) -> list[Any]:
        """One batch, in the worker thread. If it fails (the backend cannot be built, or raises), its
        frames go on as they came, each answered with SwapFailed: the streams carry on."""
        t0 = time.monotonic()
        for it in items:
            it.started = t0
        host = [it.frame for it in items]
        backup: list[Any] = []
        try:
            with self._swap_context():
                backend = self._backend(str(key))
                # Backends swap in place: a copy (on the GPU, microseconds; on the CPU a fraction of
                # a millisecond per frame, next to milliseconds per face) lets a batch that fails
                # part-way give its frames back whole.
                backup = [f.copy() for f in host]
                if self.gpu_index is not None and any(isinstance(f, np.ndarray) for f in host):
                    import cupy

                    # Host frames (a caller without the GPU stages): up for the swap, back down for
                    # the encoder. A failure before the download leaves them as they were.
                    for it in items:
                        it.frame = cupy.asarray(it.frame)
                    counts = list(backend.swap(items))
                    for it, h in zip(items, host):
                        it.frame.get(out=h)
                        it.frame = h
                else:
                    counts = list(backend.swap(items))
                    if self.gpu_index is not None:
                        import cupy

                        # The stream's encode thread reads the frames next, on its own CUDA stream.
                        cupy.cuda.get_current_stream().synchronize()
        except Exception as e:
            # Restored on the swap stream (the copies were made there), and done before the encode
            # thread reads the frames.
            with self._swap_context():
                for it, h, b in itertools.zip_longest(items, host, backup):
                    it.frame = h
                    if b is not None:
                        h[...] = b
                if self.gpu_index is not None and backup:
                    import cupy

                    cupy.cuda.get_current_stream().synchronize()
            counts = [SwapFailed(f"swap on {self.name} with {key} failed: {e}") for _ in items]
            self.failed_frames += len(items)
            self.metrics.observe_swap_failed(self.name, len(items))
            # A broken backend fails every batch: one traceback per backend every 10 s is enough.
            now = time.monotonic()
            if now - self._failure_logged.get(key, -1e9) >= 10.0:
                self._failure_logged[key] = now
                log.exception("%s: a batch on %s failed; its %d frame(s) go on unswapped (%d so far)",
                              self.name, key, len(items), self.failed_frames)
        t1 = time.monotonic()
        weights = [batch_weight(len(it.faces)) for it in items]
        per_face = (t1 - t0) / sum(weights)
        for it, k in zip(items, weights):
            it.ended = t1
            it.share = per_face * k
            # Timed here, in the thread: the batcher's own time would hold the wait for the thread.
            self._stream_busy.append((t1, it.stream_id, per_face * k))
        self._busy.append((t1, t1 - t0))
        return counts

    def _observed(self, r: BatchRecord) -> None:
        self.metrics.observe_batch(self.name, r.faces, r.seconds, r.waited, r.late)

    def stream_shares(self, window: float = 5.0) -> dict[str, float]:
        """How the swap thread's time over the last `window` seconds divides between streams
        (fractions that sum to 1; empty when no batch ran)."""
        now = time.monotonic()
        by: dict[str, float] = {}
        # The swap thread appends while this runs on the loop: list() copies in one C call (busy()).
        for t, sid, sec in list(self._stream_busy):
            if now - t <= window:
                by[sid] = by.get(sid, 0.0) + sec
        total = sum(by.values())
        return {k: v / total for k, v in by.items()} if total > 0 else {}

    def _observed_analysis(self, r: BatchRecord) -> None:
        self.metrics.observe_analysis_batch(self.name, r.faces, r.seconds)

    def _analyse_batch(self, key: Hashable, items: list[tuple[str, Any, Config]]) -> list[Any]:
        """Frames of several streams analysed together, in the worker thread (GPU slots)."""
        t0 = time.monotonic()
        try:
            with self._device():
                if self._analysis is None:
                    from .gpu_stages import DeviceAnalysis

                    self._analysis = DeviceAnalysis(self.config)
                return self._analysis.track(items)
        except Exception as e:  # each stream fails with the reason; the device goes on
            log.exception("%s: face analysis of %d frame(s) failed", self.name, len(items))
            return [e for _ in items]
        finally:
            t1 = time.monotonic()
            self._analysis_busy.append((t1, t1 - t0))

    async def analyse(self, stream_id: str, frame: Any, cfg: Config, deadline: float) -> Any:
        """Faces of a stream's GPU frame, tracked with the stream's own tracks (`cfg`: its config,
        whose detector cadence the controller changes)."""
        assert self.analysis_batcher is not None, "analysis batches are for GPU slots"
        return await self.analysis_batcher.submit(stream_id, "analyse", 1, deadline, (stream_id, frame, cfg))

    async def warm(self) -> None:
        """Build the GPU analysis (networks, every CUDA graph) and the configured swapper's backend
        before the first stream needs them: built on first use instead, they held the device thread
        (and so every stream on it) for seconds when a stream's source face came."""
        if self.gpu_index is None:
            return
        loop = asyncio.get_running_loop()
        # Asked of the driver before any CUDA graph capture, not beside one (a WHIP publisher's
        # answer needs it; the answer is kept).
        await loop.run_in_executor(None, self.nvdec_available)

        def build_analysis() -> None:
            with self._device():
                if self._analysis is None:
                    from .gpu_stages import DeviceAnalysis

                    self._analysis = DeviceAnalysis(self.config)

        def build() -> None:
            with self._swap_context():
                self._warm_kernels()
                # The configured swapper, and mesh (a stream's default swapper, and the fall-back
                # of streams on the CPU): each captures CUDA graphs when built, which must not happen
                # beside running streams.
                for name in dict.fromkeys((self.config.swapper, "mesh")):
                    try:
                        self._backend(name)
                    except Exception as e:  # a missing model: the streams that ask for it will say so
                        log.warning("%s: the %s backend could not be built ahead: %s", self.name, name, e)

        # The analysis is built in the thread that runs it, then the backends in theirs: one after
        # the other, so that no two CUDA graph captures overlap.
        await loop.run_in_executor(self._analysis_pool, build_analysis)
        await loop.run_in_executor(self._pool, build)
        await self._warm_face()

    async def _warm_face(self) -> None:
        """One real face through the device's analysis and the configured swapper, each in its own
        thread: the kernels a face's frame runs are compiled now, not at the first stream's first
        face (on a fresh machine the old live path's first face took 3.9 s, every frame behind it
        dropped). The built-in portrait at the size of a webcam's face in a 720p frame. A failure
        here is logged: the first stream then pays instead."""
        loop = asyncio.get_running_loop()
        try:
            import cupy

            from ..demo import astronaut
            from ..types import Frame

            image = astronaut()
            picture = warm_picture(image)
            identity: list[Any] = []

            def warm_analyse(frame: Any) -> Any:
                # Not through `_analyse_batch`: its busy time would count as load for seconds after.
                with self._device():
                    assert self._analysis is not None  # built by warm() just before
                    return self._analysis.track([(WARM_ID, frame, self.config)])[0]

            for i in range(2):  # detection, then tracking: both compiled
                with self._device():
                    frame = Frame(cupy.asarray(picture), i, Fraction(1, 30), i, stream_id=WARM_ID)
                    # Uploaded on this thread's stream: done before the analysis' own stream reads it.
                    cupy.cuda.get_current_stream().synchronize()
                faces = await loop.run_in_executor(self._analysis_pool, warm_analyse, frame)
                if not faces:
                    log.warning("%s: the warm-up found no face in its picture: the first stream's first "
                                "face compiles the swap's kernels", self.name)
                    return

                def warm_swap(faces: Any = faces, frame: Any = frame) -> None:
                    with self._swap_context():
                        backend = self._backend(self.config.swapper)
                        if not identity:
                            identity.append(backend.identity(image))
                        backend.swap([SwapItem(frame.data, faces, identity[0], stream_id=WARM_ID)])
                        cupy.cuda.get_current_stream().synchronize()

                await loop.run_in_executor(self._pool, warm_swap)
        except Exception as e:  # noqa: BLE001 - a warm-up: the streams work without it
            log.warning("%s: the first-face warm-up failed (%s): the first stream's first face pays for it",
                        self.name, e)
        finally:
            if self._analysis is not None:
                await self.forget(WARM_ID)

    def _warm_kernels(self) -> None:
        """Compile the CuPy kernels every GPU frame goes through (NV12 <-> RGB, the label, the
        watermark) at the usual sizes: compiled at a first frame instead, they held that stream
        for seconds on a fresh machine (NVRTC), and the frames behind were dropped."""
        import cupy

        from ..disclosure import Disclosure
        from ..kernels.nv12 import nv12_to_rgb, rgb_to_nv12

        disclosure = Disclosure(self.config, live=True)
        for w, h in ((1280, 720), (1920, 1080)):
            rgb = cupy.zeros((h, w, 3), cupy.uint8)
            nv12 = cupy.zeros((h * 3 // 2, w), cupy.uint8)
            nv12_to_rgb(nv12[:h], nv12[h:], rgb)
            disclosure.apply(rgb, True)
            for matrix in ("bt601", "bt709"):
                rgb_to_nv12(rgb, nv12[:h], nv12[h:], matrix=matrix)
        cupy.cuda.get_current_stream().synchronize()

    def nvdec_available(self) -> tuple[bool, str]:
        """Whether this GPU decodes with NVDEC (and why not), asked of the driver once."""
        if self._nvdec is None:
            from ..gpu.pynvc import nvdec_available

            self._nvdec = nvdec_available(self.gpu_index or 0)
        return self._nvdec

    async def forget(self, stream_id: str) -> None:
        """Drop a removed stream's tracks (GPU slots), in the thread that owns them."""
        if self._analysis is not None:
            analysis = self._analysis
            await asyncio.get_running_loop().run_in_executor(self._analysis_pool, analysis.forget, stream_id)

    async def call(self, backend: str, fn: Callable[[SwapBackend], T]) -> T:
        """Run `fn(backend)` in the worker thread (between batches), e.g. to compute an identity."""
        def work() -> T:
            with self._swap_context():
                return fn(self._backend(backend))

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def busy(self, window: float = 5.0) -> float:
        """The busy share of the device's busier thread over the last `window` seconds (with analysis
        in a thread of its own, the two run side by side and the busier one limits the streams)."""
        now = time.monotonic()

        def share(d: deque[tuple[float, float]]) -> float:
            # The worker thread appends while this runs on the loop: list() copies in one C call,
            # under the GIL; iterating the deque itself could meet an append ("deque mutated during
            # iteration").
            return sum(s for t, s in list(d) if now - t <= window) / window

        shares = [share(self._busy)] if self._analysis_busy is self._busy else \
            [share(self._busy), share(self._analysis_busy)]
        return min(1.0, max(shares))

    async def close(self) -> None:
        await self.batcher.close()
        if self.analysis_batcher is not None:
            await self.analysis_batcher.close()

        def close_backends() -> None:
            if self._analysis is not None:
                self._analysis.close()
                self._analysis = None
            for b in self._backends.values():
                try:
                    b.close()
                except Exception:
                    log.exception("closing swap backend %s on %s", b.name, self.name)
            self._backends.clear()

        if self._analysis_pool is not self._pool:
            # A batch that started before its batcher closed finishes first (one thread, in order),
            # awaited rather than blocking the loop; then the swap thread may close the networks.
            await asyncio.get_running_loop().run_in_executor(self._analysis_pool, lambda: None)
            self._analysis_pool.shutdown(wait=True)
        await asyncio.get_running_loop().run_in_executor(self._pool, close_backends)
        self._pool.shutdown(wait=True)


# -- the runtime ----------------------------------------------------------------------------------


def default_devices(gpu: GpuMonitor, device: str = "auto") -> list[str]:
    """The CPU alone with the config's `device: cpu`; else every GPU NVML sees when CuPy can use
    them, else the CPU."""
    if device != "cpu" and gpu.available and gpu.count:
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()
            return [f"cuda:{i}" for i in range(min(n, gpu.count))]
        except Exception as e:  # no CuPy or no CUDA runtime: the CPU path still works
            log.warning("NVML sees %d GPU(s) but CuPy cannot use them (%s): streams run on the CPU",
                        gpu.count, e)
    return ["cpu"]


def known_swappers() -> list[str]:
    from ..engines.zoo import MODELS

    return ["mesh"] + sorted(n for n, m in MODELS.items() if m.kind == "swapper")


class StreamRuntime:
    """Runs many streams in one asyncio loop. `await start()`, then add and remove streams."""

    def __init__(self, config: Config | None = None, *, devices: Sequence[str] | None = None,
                 backend_factory: BackendFactory = default_backend_factory,
                 swappers: Collection[str] | None = None, gpu: GpuMonitor | None = None) -> None:
        self.config = config or load_config("multi_stream")
        rc = self.config.runtime
        self.gpu = gpu or GpuMonitor()
        self.metrics = RuntimeMetrics(self.snapshot)
        self.swappers = list(swappers) if swappers is not None else known_swappers()
        settings = ControllerSettings(min_samples=rc.min_samples, down_cooldown=rc.down_cooldown,
                                      up_ratio=rc.up_ratio, up_hold=rc.up_hold, gpu_high=rc.gpu_high,
                                      gpu_high_for=rc.gpu_high_for, gpu_low=rc.gpu_low)
        names = list(devices) if devices is not None else default_devices(self.gpu, self.config.device)
        if len(set(names)) != len(names):
            raise ConfigError(f"devices must be distinct, got {names}")
        self.slots = [DeviceSlot(n, self.config, backend_factory, self.metrics,
                                 DegradationController(settings)) for n in names]
        self.streams: dict[str, StreamPipeline] = {}
        """Every stream until it is removed: live ones, and those that ended or failed (with their
        final state and counts; at most `runtime.max_streams` of these, the oldest go first)."""
        self.stopping: dict[str, StreamPipeline] = {}
        """Removed streams that are still stopping (their threads finishing): ids stay taken."""
        self.on_removed: list[Callable[[StreamPipeline], Awaitable[None]]] = []
        """Called once a removed (or crowded-out) stream is down, e.g. to delete its HLS files."""
        self._removals: dict[str, asyncio.Task[None]] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._control_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.started = False
        self.closing = False

    async def start(self) -> None:
        # priority.py: the control loop and each frame's hand-overs wait less for the GIL.
        SwitchInterval.acquire(self.config.runtime.switch_interval_ms / 1e3)
        for s in self.slots:
            s.batcher.start()
            if s.analysis_batcher is not None:
                s.analysis_batcher.start()
        # GPU analysis is built and its graphs captured now: a first stream would otherwise wait
        # seconds for it, and every stream on the device behind that one.
        await asyncio.gather(*(s.warm() for s in self.slots))
        self._control_task = asyncio.get_running_loop().create_task(self._control(), name="controller")
        self.started = True

    async def close(self) -> None:
        self.closing = True
        await asyncio.gather(*(p.stop() for p in list(self.streams.values())), return_exceptions=True)
        self.streams.clear()
        await asyncio.gather(*self._removals.values(), return_exceptions=True)
        for t in list(self._watchers):
            t.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._control_task is not None:
            self._control_task.cancel()
            await asyncio.gather(self._control_task, return_exceptions=True)
        for s in self.slots:
            await s.close()
        self.gpu.close()
        if self.started:
            SwitchInterval.release()
        self.started = False

    # -- streams --------------------------------------------------------------------------------

    def active(self) -> int:
        """Streams that hold resources: starting, running or being stopped (not ended or failed),
        removed ones that are still stopping included."""
        return (sum(1 for p in list(self.streams.values()) if p.state in ("starting", "running", "stopping"))
                + sum(1 for p in list(self.stopping.values()) if p.state in ("running", "stopping")))

    def _loads(self) -> list[SlotLoad]:
        samples = {g.index: g for g in self.gpu.sample()}
        out = []
        for s in self.slots:
            g = samples.get(s.gpu_index) if s.gpu_index is not None else None
            out.append(SlotLoad(s.name, len(s.streams), s.busy(), g.utilization if g else None,
                                g.memory_total - g.memory_used if g else None))
        return out

    async def add_stream(self, spec: StreamSpec, options: StreamOptions | None = None) -> StreamPipeline:
        """Start a stream. Bad ids, presets, overrides, swappers and inputs raise SwapStreamError.
        `options`: how a command's or a WHIP session's stream runs (its config, source and sinks)."""
        if not STREAM_ID.fullmatch(spec.stream_id):
            raise StreamRequestError(f"stream id {spec.stream_id!r} is not valid: use 1-63 lower-case "
                                f"letters, digits, '-' or '_', starting with a letter or digit")
        if spec.stream_id.startswith(WHIP_ID_PREFIX) and (options is None or options.sink is None):
            raise StreamRequestError(f"stream ids starting with {WHIP_ID_PREFIX!r} name WHIP publishers' "
                                     f"streams: choose another id")
        if spec.swapper not in self.swappers:
            raise StreamRequestError(f"unknown swapper {spec.swapper!r}: choose one of {', '.join(self.swappers)}")
        if spec.budget_ms is not None and not spec.budget_ms > 0:
            raise StreamRequestError(f"budget_ms must be a positive number of milliseconds, got {spec.budget_ms}")
        async with self._lock:
            if not self.started or self.closing:
                raise StreamRequestError("the runtime is not running", 503)
            if spec.stream_id in self.streams:
                raise StreamRequestError(f"a stream with id {spec.stream_id!r} already exists (it may have "
                                         f"ended): remove it first or choose another id", 409)
            if spec.stream_id in self.stopping:
                raise StreamRequestError(f"the stream with id {spec.stream_id!r} was removed and is still "
                                         f"stopping: try again in a few seconds or choose another id", 409)
            if self.active() >= self.config.runtime.max_streams:
                raise StreamRequestError(f"the runtime already runs {self.active()} streams "
                                    f"(runtime.max_streams); stop one first", 503)
            cfg = (options.config.model_copy(deep=True) if options is not None and options.config is not None
                   else load_config(spec.preset, list(spec.overrides)))
            for key in SERVER_SETTINGS:
                value = getattr(self.config, key)
                setattr(cfg, key, value.model_copy(deep=True) if hasattr(value, "model_copy") else value)
            slot = self.slots[place(self._loads())]
            budget = spec.budget_ms or self.config.runtime.budget_ms
            pipeline = StreamPipeline(spec, cfg, slot, self.metrics, budget, options)
            # Reserved before the (slow) input opening, so that a second request with the same id
            # is refused and concurrent creations spread over the devices.
            self.streams[spec.stream_id] = pipeline
            slot.streams.add(spec.stream_id)
        try:
            await pipeline.start()
        except StoppedWhileStarting as e:
            self._forget(pipeline)
            raise StreamRequestError(f"{e} (removed before its input was open)", 409) from None
        except BaseException:
            self._forget(pipeline)
            raise
        log.info("stream %s started on %s", spec.stream_id, slot.name)
        watcher = asyncio.get_running_loop().create_task(self._release_when_finished(pipeline),
                                                         name=f"watch-{spec.stream_id}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return pipeline

    async def _release_when_finished(self, p: StreamPipeline) -> None:
        """A stream whose input ended or that failed gives back its threads, analyser and place on
        its device; it stays listed with its final state until removed (or crowded out)."""
        await p.done.wait()
        if p.state not in ("ended", "failed"):
            return  # being removed: remove_stream does the rest
        await p.stop()
        p.finished = time.time()
        if self.streams.get(p.id) is p:
            p.slot.streams.discard(p.id)
            p.slot.controller.forget(p.id)
        log.info("stream %s %s: %d frames in, %d out%s", p.id, p.state, p.frames_in, p.frames_out,
                 f" ({p.error})" if p.error else "")
        finished = sorted((q for q in self.streams.values() if q.finished is not None),
                          key=lambda q: q.finished or 0.0)
        for old in finished[:max(0, len(finished) - self.config.runtime.max_streams)]:
            self._forget(old)
            # Its id stays taken while its files go, so that a new stream of that id keeps its own.
            self.stopping[old.id] = old
            try:
                await self._removed(old)
            finally:
                self.stopping.pop(old.id, None)

    def _forget(self, p: StreamPipeline) -> None:
        if self.streams.get(p.id) not in (None, p):
            return  # its id belongs to a newer stream by now: leave that one's state alone
        self.streams.pop(p.id, None)
        p.slot.streams.discard(p.id)
        p.slot.controller.forget(p.id)
        self.metrics.remove_stream(p.id)

    def get(self, stream_id: str) -> StreamPipeline:
        p = self.streams.get(stream_id)
        if p is None:
            raise StreamNotFound(f"no stream with id {stream_id!r}")
        return p

    async def remove_stream(self, stream_id: str, wait: float | None = None) -> StreamPipeline:
        """Stop a stream and forget it; returns it (with its final counts once it is down).

        `wait`: return after this many seconds even if the stream is not down yet (its `state` is
        then still "stopping"); it is forgotten at once, and finishes stopping in the background
        with its id kept in `stopping`. None: return once it is down."""
        p = self.get(stream_id)
        # Forgotten first, so that nothing (the API, /metrics, the controller) sees it again; the id
        # stays taken in `stopping` until its threads are gone and `on_removed` has run.
        self._forget(p)
        self.stopping[p.id] = p
        task = asyncio.get_running_loop().create_task(self._finish_removal(p), name=f"remove-{p.id}")
        self._removals[p.id] = task
        # asyncio.wait, not wait_for: a DELETE whose client goes away leaves the removal running.
        done, _ = await asyncio.wait({task}, timeout=wait)
        if task in done:
            task.result()  # what went wrong while stopping, if anything
        else:
            log.warning("stream %s: still stopping after %.1f s; it finishes in the background",
                        p.id, wait)
        return p

    async def _finish_removal(self, p: StreamPipeline) -> None:
        try:
            await p.stop()
            log.info("stream %s stopped: %d frames in, %d out", p.id, p.frames_in, p.frames_out)
        finally:
            # Its last frames were counted while it stopped: their series go again (the id is still
            # reserved, so no new stream of that id has any yet).
            self.metrics.remove_stream(p.id)
            try:
                await self._removed(p)
            finally:
                self.stopping.pop(p.id, None)
                self._removals.pop(p.id, None)

    async def _removed(self, p: StreamPipeline) -> None:
        for hook in list(self.on_removed):
            try:
                await hook(p)
            except Exception:  # a cleanup that fails must not keep the id taken or stop the others
                log.exception("stream %s: cleanup after removal failed", p.id)

    async def set_source(self, stream_id: str, image: Any) -> StreamPipeline:
        p = self.get(stream_id)
        await p.set_source(image)
        return p

    # -- control --------------------------------------------------------------------------------

    async def _control(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.runtime.controller_interval
        while True:
            await asyncio.sleep(interval)
            try:
                samples = ({g.index: g for g in await loop.run_in_executor(None, self.gpu.sample)}
                           if self.gpu.available else {})
                self.control_once(time.monotonic(), samples)
            except Exception:  # the controller must never take the streams down with it
                log.exception("degradation controller tick failed")

    def control_once(self, now: float, gpu_samples: dict[int, Any]) -> None:
        if not self.config.runtime.degrade:
            return
        for slot in self.slots:
            running = [self.streams[s] for s in sorted(slot.streams)
                       if s in self.streams and self.streams[s].state == "running"]
            g = gpu_samples.get(slot.gpu_index) if slot.gpu_index is not None else None
            for d in slot.controller.decide(now, [p.observation() for p in running],
                                            g.utilization if g else None):
                p = self.streams[d.stream_id]
                p.apply_level(d.new_level)
                p.step_counts[(d.direction, d.step)] += 1
                p.history.append({"time": time.time(), "from": d.old_level, "to": d.new_level,
                                  "direction": d.direction, "step": d.step, "reason": d.reason})
                log.warning("stream %s: degradation %s %d -> %d (%s): %s", d.stream_id, d.direction,
                            d.old_level, d.new_level, d.step, d.reason)

    def ready(self) -> tuple[bool, str]:
        if self.closing:
            return False, "shutting down"
        if not self.started:
            return False, "not started"
        return True, "ok"

    def snapshot(self) -> RuntimeSnapshot:
        return RuntimeSnapshot([p.snapshot() for p in list(self.streams.values())], self.gpu.sample(),
                               self.gpu.available, {s.name: s.batcher.pending() for s in self.slots})
