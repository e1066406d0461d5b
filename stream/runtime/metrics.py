"""Prometheus metrics of the runtime, and GPU readings through NVML.

Every runtime has its own `CollectorRegistry` (no process-global registry: two runtimes in one test
process must not see each other's streams). Latency and batch histograms are observed as frames and
batches happen; counters, gauges and GPU readings are read from the runtime when /metrics is scraped,
so a stream's series disappear when it is removed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STAGES = ("queue", "analyse", "swap_wait", "swap", "encode", "total")
"""Per-frame stages timed: waiting in the input queue, face analysis, waiting for a batch, the swap
call, encoding and writing, and the whole way from arrival to encoded."""

# 1 ms to 4 s: a live frame's stage times span from a batch wait to a stalled encoder.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU."""

    index: int
    name: str
    utilization: float
    """0..1, the share of the last sample period in which a kernel ran (nvmlDeviceGetUtilizationRates)."""
    memory_used: int
    memory_total: int


class GpuMonitor:
    """NVML readings of the host's NVIDIA GPUs. Without the driver's NVML library it reports that
    once (`available` False, `reason`) and returns no samples."""

    def __init__(self, only: int | None = None) -> None:
        """`only`: read that one GPU (NVML's index), reported as GPU 0: a worker process whose one
        visible GPU is CUDA's device 0 whatever its place on the host."""
        self.available = False
        self.reason = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            indices = range(pynvml.nvmlDeviceGetCount()) if only is None else [only]
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
            self.available = True
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as e:  # pynvml.NVMLError_*: no driver, no library, no permission
            self.reason = f"NVML unavailable: {e}"
        if not self.available:
            log.info("GPU metrics off: %s", self.reason)

    @property
    def count(self) -> int:
        return len(self._handles)

    def sample(self) -> list[GpuSample]:
        if not self.available:
            return []
        out = []
        with self._lock:  # NVML calls are thread-safe, but a scrape and the controller share handles
            for i, h in enumerate(self._handles):
                try:
                    util = self._nvml.nvmlDeviceGetUtilizationRates(h)
                    mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
                    name = self._nvml.nvmlDeviceGetName(h)
                    out.append(GpuSample(i, name if isinstance(name, str) else name.decode(),
                                         util.gpu / 100.0, int(mem.used), int(mem.total)))
                except Exception as e:  # a GPU that fell off the bus: report the others
                    log.warning("NVML reading of GPU %d failed: %s", i, e)
        return out

    def close(self) -> None:
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False


@dataclass(frozen=True)
class StreamSnapshot:
    """What /metrics reads from one stream at scrape time."""

    stream_id: str
    device: str
    frames_in: int
    frames_out: int
    faces_swapped: int
    drops: dict[str, int]
    """Queue name -> frames dropped there (live policy), plus "out_of_order" and "at_stop"
    (frames that arrived while the stream stopped)."""
    queue_depths: dict[str, int]
    fps: float
    level: int
    budget_s: float
    steps: dict[tuple[str, str], int] = field(default_factory=dict)
    """(direction, step) -> how many times the controller took it."""
    running: bool = True
    """False once the stream ended or failed (it is still listed, with its final counts)."""


@dataclass(frozen=True)
class RuntimeSnapshot:
    streams: list[StreamSnapshot]
    gpus: list[GpuSample]
    nvml_available: bool
    pending: dict[str, int]
    """Device -> swap requests waiting for a batch."""


class _ScrapeCollector(Collector):
    def __init__(self, snapshot: Callable[[], RuntimeSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        s = ["stream"]
        frames_in = CounterMetricFamily("swapstream_frames_in", "Frames decoded from the stream's input.", labels=s)
        frames_out = CounterMetricFamily("swapstream_frames_out", "Frames encoded to the stream's outputs.", labels=s)
        faces = CounterMetricFamily("swapstream_faces_swapped", "Faces swapped.", labels=s)
        drops = CounterMetricFamily("swapstream_frames_dropped",
                                    "Frames dropped by the live policy (oldest first), by queue.",
                                    labels=["stream", "queue"])
        depth = GaugeMetricFamily("swapstream_queue_depth", "Frames waiting in each queue of a stream.",
                                  labels=["stream", "queue"])
        fps = GaugeMetricFamily("swapstream_stream_fps", "Output frames per second over the last 2 s.", labels=s)
        level = GaugeMetricFamily("swapstream_degradation_level",
                                  "Degradation steps applied to the stream (0: full quality).", labels=s)
        steps = CounterMetricFamily("swapstream_degradation_steps",
                                    "Degradation steps taken, by direction and step.",
                                    labels=["stream", "direction", "step"])
        budget = GaugeMetricFamily("swapstream_latency_budget_seconds", "The stream's latency budget.", labels=s)
        placed = GaugeMetricFamily("swapstream_stream_device", "1 for the device the stream runs on.",
                                   labels=["stream", "device"])
        for st in snap.streams:
            frames_in.add_metric([st.stream_id], st.frames_in)
            frames_out.add_metric([st.stream_id], st.frames_out)
            faces.add_metric([st.stream_id], st.faces_swapped)
            for q, n in st.drops.items():
                drops.add_metric([st.stream_id, q], n)
            for q, n in st.queue_depths.items():
                depth.add_metric([st.stream_id, q], n)
            fps.add_metric([st.stream_id], st.fps)
            level.add_metric([st.stream_id], st.level)
            for (direction, step), n in st.steps.items():
                steps.add_metric([st.stream_id, direction, step], n)
            budget.add_metric([st.stream_id], st.budget_s)
            placed.add_metric([st.stream_id, st.device], 1)
        yield from (frames_in, frames_out, faces, drops, depth, fps, level, steps, budget, placed)
        yield GaugeMetricFamily("swapstream_streams", "Streams running (not ended or failed).",
                                value=sum(1 for st in snap.streams if st.running))
        pending = GaugeMetricFamily("swapstream_batch_pending", "Swap requests waiting for a batch.",
                                    labels=["device"])
        for dev, n in snap.pending.items():
            pending.add_metric([dev], n)
        yield pending
        yield GaugeMetricFamily("swapstream_nvml_available", "1 when NVML answers (GPU metrics below).",
                                value=1 if snap.nvml_available else 0)
        g = ["gpu", "name"]
        util = GaugeMetricFamily("swapstream_gpu_utilization_ratio", "GPU busy share (NVML), 0..1.", labels=g)
        used = GaugeMetricFamily("swapstream_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=g)
        total = GaugeMetricFamily("swapstream_gpu_memory_total_bytes", "GPU memory size (NVML).", labels=g)
        for gs in snap.gpus:
            util.add_metric([str(gs.index), gs.name], gs.utilization)
            used.add_metric([str(gs.index), gs.name], gs.memory_used)
            total.add_metric([str(gs.index), gs.name], gs.memory_total)
        yield from (util, used, total)


class RuntimeMetrics:
    """The runtime's registry: histograms observed live, the rest read from `snapshot` on scrape."""

    def __init__(self, snapshot: Callable[[], RuntimeSnapshot]) -> None:
        self.registry = CollectorRegistry()
        self.stage_latency = Histogram("swapstream_stage_latency_seconds",
                                       "Per-frame time spent in each stage (total: arrival to encoded).",
                                       ["stream", "stage"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("swapstream_batch_size", "Faces per swap call.", ["device"],
                                    buckets=(1, 2, 3, 4, 6, 8), registry=self.registry)
        self.batch_seconds = Histogram("swapstream_batch_seconds", "Run time of one swap call.", ["device"],
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_wait = Histogram("swapstream_batch_wait_seconds",
                                    "How long the oldest face of a batch waited for it to start.",
                                    ["device"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.analysis_batch_size = Histogram("swapstream_analysis_batch_size",
                                             "Frames per face-analysis call (GPU devices).", ["device"],
                                             buckets=(1, 2, 3, 4, 6, 8), registry=self.registry)
        self.analysis_batch_seconds = Histogram("swapstream_analysis_batch_seconds",
                                                "Run time of one face-analysis call (GPU devices).", ["device"],
                                                buckets=LATENCY_BUCKETS, registry=self.registry)
        self.late = Counter("swapstream_batch_late", "Frames whose swap finished after their deadline.",
                            ["device"], registry=self.registry)
        self.swap_failed = Counter("swapstream_swap_failed_frames",
                                   "Frames passed on unswapped because their swap batch failed.",
                                   ["device"], registry=self.registry)
        self.registry.register(_ScrapeCollector(snapshot))

    def observe_stage(self, stream_id: str, stage: str, seconds: float) -> None:
        self.stage_latency.labels(stream_id, stage).observe(seconds)

    def observe_batch(self, device: str, faces: int, seconds: float, waited: float, late: int) -> None:
        self.batch_size.labels(device).observe(faces)
        self.batch_seconds.labels(device).observe(seconds)
        self.batch_wait.labels(device).observe(waited)
        if late:
            self.late.labels(device).inc(late)

    def observe_analysis_batch(self, device: str, frames: int, seconds: float) -> None:
        self.analysis_batch_size.labels(device).observe(frames)
        self.analysis_batch_seconds.labels(device).observe(seconds)

    def observe_swap_failed(self, device: str, frames: int) -> None:
        self.swap_failed.labels(device).inc(frames)

    def remove_stream(self, stream_id: str) -> None:
        """Drop a removed stream's histogram series (its counters go with its snapshot)."""
        for stage in STAGES:
            try:
                self.stage_latency.remove(stream_id, stage)
            except KeyError:
                pass

    def render(self) -> bytes:
        return generate_latest(self.registry)
