"""Many live streams on one GPU (issue 7): the largest N kept within budget, and swapped faces per second.

    python tools/bench_streams.py --clip720 C720.mp4 --clip1080 C1080.mp4 --out DIR
        [--ns 4,8,16,24,32] [--seconds 8] [--workers 4] [--feeders 0] [--pipeline 0,1] [--gather-ms 0,4]
        [--sink null,x264] [--phases grouped,random,sorted] [--warm-first] [--tag _nvdec]
        [--set detector.detect_every=10 ...]   (config settings on top of the `live` preset)
    (on the GPU machine, through tools/device_check.sh streams)

N streams play 30 fps clips at real-time pace (each frame "arrives" at its time, streams staggered
across the frame period: `--phases grouped` gives each worker streams that arrive close together,
`random` independent phases, as unrelated sources have, and `sorted` places those on the workers
in phase order), one face each, swapped by the full-size inswapper-architecture model
(random weights; speed and memory are the real model's). The streams are spread over `--workers`
processes (Python runs one frame's host work at a time per process; the GPU is shared). Inside a
worker everything is on the GPU:
- decode: NVDEC per stream (PyNvVideoCodec) into RGB slots, or, without it, OpenCV on the host
  plus an upload (`decode` in the results says which), in feeder threads (`--feeders`: per worker;
  0 = one per stream) that decode each frame at its arrival time (NVDEC's decode call releases the
  GIL) and queue it for the worker's main loop, which does the rest;
- analysis: the built-in networks on the GPU (GpuFaceAnalyser), one set per worker, one tracker
  per stream (`FaceAnalyser.tracker`); the frames of all streams that arrived since the last round
  go through the landmark model together (`track_many`: one call, one wait, up to 16 streams);
- swap: faces of all the worker's streams gathered into model calls of up to 4, the oldest first,
  waiting at most `--max-wait-ms` for a fuller batch (the dynamic batcher's rule); with
  `--pipeline 1` a round's swaps are launched while the next round's landmark model runs
  (`PendingTracks`), so the host launches work instead of waiting for the landmarks;
- out: watermark and NV12 on the GPU; `null` drops the frame there, `x264` downloads it and encodes
  it with PyAV in a thread per stream (PyAV and PyNvVideoCodec must both be installed for NVDEC
  decode with this sink: docs/kernels.md says how they reach the GPU machine).
Live policy: a frame that would start more than one frame period late is dropped (decoded, not
swapped) and counted, and so is a frame that finds every slot of its stream still held; a round
takes at most one frame per stream (`Intake`). Latency is arrival to encoder-ready (null) or to
encoded (x264), host clock.
A configuration is within budget when drops <= 1% and p99 <= 33 ms.
Every landmark batch size is captured before the clock starts (`GpuFaceAnalyser.prepare`); each
result says how many were captured during the run (`captures_in_run`, a stall each), where a
process's host time went (`host_ms_per_frame`), and, for rounds over 250 ms, the worker's sampled
stack (`stalls`).

Writes streams{tag}.json, streams{tag}.md and streams{tag}.png.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import device_used_bytes, neural_config, pcts  # noqa: E402
from benchlib import gpu_name, run_fields  # noqa: E402

STALL_S = 0.25
"""A worker round longer than this is recorded, with where its time went (`stalls` in the JSON)."""
MESH_BATCH = 16
"""Most streams analysed in one `track_many` call (one face each)."""
BUDGET_MS = 33.0
MAX_DROP = 0.01
FPS = 30.0


# -- worker -------------------------------------------------------------------------------------

class RoundWatch(threading.Thread):
    """Samples the worker's main-thread stack while a round runs long: a stall record then says
    which call the time went to (the stage timings alone cannot tell a decode wait from a compile)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.main = threading.get_ident()
        self.started = 0.0  # perf_counter at the current round's start; 0 between rounds
        self.samples: list[list[str]] = []  # the current round's sampled stacks (innermost last)
        self.start()

    def begin(self) -> None:
        self.samples = []
        self.started = time.perf_counter()

    def end(self) -> list[list[str]]:
        self.started = 0.0
        return self.samples

    def run(self) -> None:
        while True:
            time.sleep(0.1)
            t = self.started
            if t and time.perf_counter() - t > 0.15 and len(self.samples) < 6:
                frame = sys._current_frames().get(self.main)
                if frame is not None:
                    stack = traceback.format_stack(frame)[-8:]
                    self.samples.append([ln.strip().replace("\n", " | ") for ln in stack])


class Source:
    """Frames of one looping clip into the RGB slots of a stream: NVDEC or OpenCV + upload."""

    def __init__(self, clip: Path, nvdec: bool) -> None:
        self.clip, self.nvdec = clip, nvdec
        self._it: Any = None
        self._src: Any = None
        self._open()

    def _open(self) -> None:
        if self.nvdec:
            from swapstream.gpu.nvdemux import NvdecSource

            self._src = NvdecSource(self.clip, low_latency=True)
            self._it = iter(self._src)
        else:
            import cv2

            self._src = cv2.VideoCapture(str(self.clip))

    def _next(self, keep: bool) -> Any:
        """The next frame, from the start again at the clip's end: an NvdecFrame, or with OpenCV
        the BGR image (None when not `keep`: grabbed, not converted)."""
        for again in (False, True):
            if again:
                self.close()
                self._open()
            if self.nvdec:
                fr = next(self._it, None)
                if fr is not None:
                    return fr
            elif keep:
                ok, bgr = self._src.read()
                if ok:
                    return bgr
            elif self._src.grab():
                return None
        raise RuntimeError(f"'{self.clip}' gave no frame after reopening")

    def next_into(self, rgb: Any, upload: Any) -> Any:
        """Decode the next frame into `rgb`; returns the event that marks it complete."""
        frame = self._next(keep=True)
        if self.nvdec:
            return frame.copy_to(rgb)
        import cv2

        with upload:
            rgb.set(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), stream=upload)
            return upload.record()

    def skip(self) -> None:
        """Decode the next frame without keeping it (a decoder must see every frame)."""
        self._next(keep=False)

    def close(self) -> None:
        if self.nvdec:
            self._src.close()
        else:
            self._src.release()


class Encoder(threading.Thread):
    """x264 for one stream, in its own thread (PyAV releases the GIL while encoding)."""

    def __init__(self, w: int, h: int, done: list[float], threads: int = 1) -> None:
        super().__init__(daemon=True)
        import av

        from swapstream.live.streams import x264_live_options

        self.q: queue.Queue[Any] = queue.Queue(maxsize=8)
        self.done = done
        self.container = av.open(os.devnull, "w", format="h264")
        s = self.container.add_stream("libx264", rate=int(FPS))
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        # The live outputs' own settings (stream/live), keyframe every second included.
        s.options = x264_live_options(FPS)
        # x264's own threads (slice threads under zerolatency): 2 halve a 720p frame's encode time
        # on the idle H200 host (5.97 -> 3.23 ms, docs/benchmarks/x264_encode.md); beside 31 other
        # streams, 1 thread each did better (docs/performance.md).
        s.thread_count = threads
        self.s = s
        self.start()

    def run(self) -> None:
        import av

        i = 0
        while True:
            item = self.q.get()
            if item is None:
                break
            nv12, arrival, counted = item
            vf = av.VideoFrame.from_ndarray(nv12, format="nv12")
            vf.pts = i
            i += 1
            for p in self.s.encode(vf):
                self.container.mux(p)
            if counted:  # like the null sink, leave out the settle second (x264's first frames among it)
                self.done.append((time.perf_counter() - arrival) * 1e3)

    def close(self) -> None:
        self.q.put(None)
        self.join(timeout=10)
        self.container.close()


class Stream:
    """One live stream in a worker: its clip, tracker, RGB slots and NV12 ring.

    A feeder thread (`feed`) decodes each frame when it arrives (its due time) and queues it for the
    worker's main loop; NVDEC's decode call releases the GIL (docs/benchmarks/decode_threads.md:
    8 threads decode 4x the frames of one), so decoding leaves the thread that analyses and swaps.
    The RGB slots go round a free list: the feeder takes one (or, with none free, decodes the frame
    without keeping it: a drop), the main loop gives it back with the event that ends its last use.
    """

    SLOTS = 6

    def __init__(self, sid: int, clip: Path, nvdec: bool, analyser: Any, w: int, h: int) -> None:
        import cupy

        from swapstream.gpu.ring import Ring

        self.sid = sid
        self.src = Source(clip, nvdec)
        self.upload = cupy.cuda.Stream(non_blocking=True)
        self.analyser = analyser
        analyser.reset()
        self.free: deque[tuple[Any, Any]] = deque((cupy.empty((h, w, 3), cupy.uint8), None) for _ in range(self.SLOTS))
        # Decode the first frame before the clock starts, as a live stream's warm-up does
        # (gpu/live.py): a new decoder's set-up is not part of the measurement.
        buf, _ev = self.free[0]
        self.src.next_into(buf, self.upload).synchronize()
        self.nv12 = Ring(4, lambda _i: cupy.empty((h * 3 // 2, w), cupy.uint8))
        self.due = 0.0
        self.index = 0
        self.frames = self.dropped = self.faces = 0
        self.feeder_drops = 0  # no free slot at arrival (counted frames only); written by the feeder
        self.decode_s = 0.0  # the feeder's wall time in decode calls
        self.decoded = 0
        self.encoder: Encoder | None = None
        self.pinned: list[Any] = []
        self.pin_at = 0  # next download buffer (x264 sink)

    def give_back(self, buf: Any, event: Any) -> None:
        self.free.append((buf, event))

    def step(self, ready: queue.SimpleQueue[Any], period: float, t_warm: float) -> None:
        """Decode the frame due now into a free slot and queue it (with no slot free: a drop)."""
        arrival = self.due
        self.due += period
        t0 = time.perf_counter()
        if not self.free:
            self.src.skip()  # the main loop holds every slot: this frame, the newest, is lost
            if arrival >= t_warm:
                self.feeder_drops += 1
        else:
            buf, event = self.free.popleft()
            if event is not None:
                event.synchronize()  # the last use of this slot (normally long done)
            ev = self.src.next_into(buf, self.upload)
            ready.put((self, buf, arrival, ev))
        self.decode_s += time.perf_counter() - t0
        self.decoded += 1


Item = tuple[Any, Any, float, Any]
"""A decoded frame on its way to the main loop: (stream, RGB buffer, arrival time, decoded event)."""


class Intake:
    """The main loop's side of the feeders' queue. Each `round` takes what has arrived, in order:
    a frame already more than one frame period late is dropped (its slot given back) and counted;
    a second frame of a stream already in the round waits for the next round (a tracker follows
    its stream frame by frame); the others, at most `limit`, are the round's frames.

    Items are (stream, buffer, arrival, event); a stream has `sid`, `frames`, `dropped` and
    `give_back(buffer, event)`. Counting starts with frames that arrive at `t_warm` or later."""

    def __init__(self, ready: queue.SimpleQueue[Any], period: float, t_warm: float, limit: int,
                 gather_s: float = 0.0) -> None:
        self.ready, self.period, self.t_warm, self.limit = ready, period, t_warm, limit
        self.gather_s = gather_s
        """The dynamic batcher's wait, at the round's start: with fewer than `limit` frames in hand,
        wait for more until the oldest arrived this long ago. Bigger rounds mean bigger landmark
        and swap batches (the swap costs 1.33 ms per face alone and 0.78 in fours:
        docs/benchmarks/swap_stage.md)."""
        self.held: deque[Item] = deque()
        self.taken = 0
        """Frames taken off the queue (each once, held or not)."""

    def empty(self) -> bool:
        return not self.held and self.ready.empty()

    def round(self, block_s: float, gather: bool = True) -> tuple[list[Item], float]:
        """This round's frames, and the seconds spent waiting: with nothing else to do the caller
        passes `block_s` > 0 to wait that long for a first frame instead of spinning (which would
        hold the GIL the feeders need), and `gather=False` when it must not wait for more frames
        once it has one (the gather window, `gather_s`)."""
        pending: list[Item] = []
        in_round: set[int] = set()
        later: list[Item] = []

        def consider(item: Item) -> None:
            s, buf, arrival, ev = item
            counted = arrival >= self.t_warm
            if time.perf_counter() - arrival > self.period:  # the live policy: it would start over a frame late
                s.give_back(buf, ev)
                if counted:
                    s.dropped += 1
            elif s.sid in in_round:
                later.append(item)
            else:
                in_round.add(s.sid)
                if counted:
                    s.frames += 1
                pending.append(item)

        while self.held and len(pending) < self.limit:
            consider(self.held.popleft())
        waited = 0.0
        while len(pending) < self.limit:
            item, blocked = self._next(block_s if not pending and not later else 0.0, pending if gather else [])
            waited += blocked
            if item is None:
                break
            self.taken += 1
            consider(item)
        self.held = deque(later + list(self.held))  # older first: a stream's frames stay in order
        return pending, waited

    def _next(self, block_s: float, pending: list[Item]) -> tuple[Item | None, float]:
        """The next queued frame (None if none comes) and the seconds spent blocked for it: up to
        `block_s` for a round's first frame, or, with frames in hand (`pending`), until the gather
        window of the oldest closes."""
        try:
            return self.ready.get_nowait(), 0.0
        except queue.Empty:
            pass
        timeout = block_s
        if pending and self.gather_s > 0:
            timeout = min(a for _s, _b, a, _e in pending) + self.gather_s - time.perf_counter()
        if timeout <= 0:
            return None, 0.0
        t0 = time.perf_counter()
        try:
            return self.ready.get(timeout=timeout), time.perf_counter() - t0
        except queue.Empty:
            return None, time.perf_counter() - t0


def feed(streams: list[Stream], ready: queue.SimpleQueue[Any], period: float, t_warm: float, t_end: float,
         errors: list[BaseException]) -> None:
    """A feeder thread: decodes its streams' frames as they fall due, the earliest first. An error
    goes to `errors` for the main loop to raise: a dead feeder must not read as a quiet stream."""
    try:
        while True:
            s = min(streams, key=lambda x: x.due)
            if s.due >= t_end:
                break
            wait = s.due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            s.step(ready, period, t_warm)
    except BaseException as e:  # noqa: BLE001 - handed to the main loop, which raises it
        errors.append(e)


@dataclass
class Stages:
    """What a stream frame goes through in a worker, one set per process (`worker_stages`)."""

    cfg: Any
    swapper: Any  # NeuralSwapper, the full-size inswapper architecture
    analyser: Any  # GpuFaceAnalyser: its trackers are the streams' analysers
    disclosure: Any  # the label and the invisible watermark of every live output frame
    src: np.ndarray  # the source portrait (RGB)
    face: Any  # its face
    identity: np.ndarray  # the swapper's source input for it
    captured: dict[str, list[int]]  # the analyser's CUDA graphs, by model (GpuFaceAnalyser.prepare)


def worker_stages(tmp: Path, overrides: list[str]) -> Stages:
    """The worker's models, in a private models folder under `tmp`, with `overrides` on top of the
    live preset; every landmark batch size up to MESH_BATCH is captured (`prepare`)."""
    from swapstream.demo import astronaut
    from swapstream.disclosure import Disclosure
    from swapstream.gpu.analyser import GpuFaceAnalyser
    from swapstream.neural.factory import NeuralStages
    from swapstream.swap.mesh import source_face

    # Batches of up to 4 faces per model call (the dynamic batcher's limit). Until this was set, the
    # config said 1: every gathered batch ran as single-face calls, 1.33 ms per face instead of
    # 0.78 (compiled, docs/benchmarks/swap_stage.md).
    cfg = neural_config(tmp / f"models{os.getpid()}", max_batch=4, overrides=overrides)
    swapper = NeuralStages(cfg).swapper
    analyser = GpuFaceAnalyser(cfg, mesh_batch=MESH_BATCH)
    src = astronaut()
    face = source_face(analyser.analyse_image(src), "astronaut")
    # The landmark model at every batch size track_many may use (one CUDA graph each). Warm-up
    # frames did not do it: the swaps scramble a warm-up frame's face (random weights), so no track
    # started and each size was captured mid-run instead, 2-3 s each (the stalls of 6d2eca0).
    captured = analyser.prepare()
    return Stages(cfg, swapper, analyser, Disclosure(cfg, live=True), src, face,
                  swapper.identity(src, face), captured)


def worker_main(args: argparse.Namespace) -> None:
    import cupy
    import cupyx

    from swapstream.kernels.nv12 import rgb_to_nv12
    from swapstream.types import Frame

    st = worker_stages(Path(args.tmp), args.set)
    swapper, probe, disclosure = st.swapper, st.analyser, st.disclosure
    src, face, identity, captured = st.src, st.face, st.identity, st.captured
    mb = swapper.max_batch  # faces per swap model call: the batcher fills calls of this size
    # Compile and capture every batch size before reporting ready, so no round pays for it.
    warm = cupy.asarray(src)
    for b in range(1, mb + 1):
        for _ in range(2):
            swapper.swap_many([(warm, face)] * b, [identity] * b)
    from swapstream.face.analyser import PendingTracks, track_many

    still = Frame(cupy.asarray(src), 0, Fraction(1, 30), 0)
    pairs = [(probe.tracker(), still) for _ in range(MESH_BATCH)]
    for _ in range(2):  # detection, then tracking: the host-side paths and CuPy kernels of both
        track_many(pairs)
    # The label and the watermark at both sizes: their CuPy kernels compile (NVRTC) at first use,
    # which stalled the first round of a run by 1.5 s on the H200; the per-size tables are built too.
    for wh in ((1280, 720), (1920, 1080)):
        disclosure.apply(cupy.zeros((wh[1], wh[0], 3), cupy.uint8), True)
    cupy.cuda.Device().synchronize()
    import importlib.util

    nvdec = args.decode != "cpu" and importlib.util.find_spec("PyNvVideoCodec") is not None
    analysers: list[Any] = [probe]
    a_stream = cupy.cuda.Stream(non_blocking=True)
    s_stream = cupy.cuda.Stream(non_blocking=True)
    d_stream = cupy.cuda.Stream(non_blocking=True)
    # The feeders need the GIL for a moment after each decode; with Python's default 5 ms switch
    # interval a feeder could wait that long behind the main loop, a sixth of a frame period.
    sys.setswitchinterval(0.0005)
    clips = {"720": Path(args.clip720), "1080": Path(args.clip1080)}
    watch = RoundWatch()
    mesh_runner = probe._mesh.runner
    print(json.dumps({"ready": os.getpid(), "nvdec": nvdec, "captured": captured}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        k, res = int(cmd["n"]), cmd["res"]
        pipelined = bool(cmd["pipeline"])
        w, h = (1280, 720) if res == "720" else (1920, 1080)
        while len(analysers) < k:
            # One tracker per stream over the worker's one set of networks (and CUDA graphs, all
            # captured above): a new stream costs no model memory and no capture stall.
            analysers.append(probe.tracker())
        streams = [Stream(i, clips[res], nvdec, analysers[i], w, h) for i in range(k)]
        lat: list[float] = []
        enc_lat: list[float] = []
        sink = cmd["sink"]
        if sink == "x264":
            for s in streams:
                s.encoder = Encoder(w, h, enc_lat, args.x264_threads)
                # Download buffers, reused round-robin: more than the encoder's queue can hold.
                s.pinned = [cupyx.empty_pinned((h * 3 // 2, w), np.uint8) for _ in range(12)]
        # Armed: every stream built and warmed. The parent starts all workers' clocks together.
        print(json.dumps({"armed": os.getpid()}), flush=True)
        cmd.update(json.loads(sys.stdin.readline()))
        sizes: Counter[int] = Counter()
        graphs0 = len(mesh_runner.captured)  # a capture during the run would be a stall: report it
        marked0 = disclosure.frames_marked  # this configuration's count, not the warm-up's or earlier ones'
        period = 1.0 / FPS
        warm_until = cmd["start_at"] + 1.0  # one second to settle (first captures per stream)
        end = cmd["start_at"] + 1.0 + float(cmd["seconds"])
        while time.time() < cmd["start_at"]:
            time.sleep(0.001)
        t0 = time.perf_counter()
        t_end = t0 + (end - cmd["start_at"])
        t_warm = t0 + (warm_until - cmd["start_at"])
        ready: queue.SimpleQueue[Item] = queue.SimpleQueue()
        for s in streams:
            s.due = t0 + period * cmd["phases"][s.sid]
        nf = min(cmd["feeders"] or k, k)
        feed_errors: list[BaseException] = []
        feeders = [threading.Thread(target=feed, args=(streams[i::nf], ready, period, t_warm, t_end, feed_errors),
                                    daemon=True) for i in range(nf)]
        for th in feeders:
            th.start()
        batch: list[tuple[Stream, Any, list[Any], float, Any]] = []
        # A round is full when every stream of this worker has a frame in it (one each): the
        # gather window then closes early.
        intake = Intake(ready, period, t_warm, min(MESH_BATCH, k), gather_s=cmd["gather_ms"] / 1e3)
        inflight: deque[tuple[Stream, Any, Any, float, Any, bool]] = deque()
        peak = device_used_bytes()

        # Main-thread host seconds per stage over the whole run (warm-up second included): where
        # one process's time goes when it cannot keep up (ms per frame taken in the result).
        stage_s: Counter[str] = Counter()

        def flush() -> None:
            if not batch:
                return
            t_flush = time.perf_counter()
            with s_stream:
                # One wait per round's analysis event (a round's frames share it), not per frame.
                for analysed in {id(e): e for (_s, _b, _f, _a, e) in batch}.values():
                    s_stream.wait_event(analysed)
                items = [(buf, f) for (_s, buf, faces, _a, _e) in batch for f in faces]
                if items:
                    swapper.swap_many(items, [identity] * len(items))
                    for at in range(0, len(items), mb):  # the model calls swap_many makes
                        sizes[min(mb, len(items) - at)] += 1
                for (s, buf, faces, arrival, _e) in batch:
                    disclosure.apply(buf, len(faces) > 0)
                    out = s.nv12.acquire()
                    rgb_to_nv12(buf, out.buffer[:h], out.buffer[h:])
                    done = s_stream.record()
                    s.give_back(buf, done)
                    counted = arrival >= t_warm
                    if counted:
                        s.faces += len(faces)
                    pin = None
                    if s.encoder is not None:
                        pin = s.pinned[s.pin_at % len(s.pinned)]
                        s.pin_at += 1  # per frame sent: two frames of a stream in one flush get two buffers
                        with d_stream:
                            d_stream.wait_event(done)
                            out.buffer.get(stream=d_stream, out=pin, blocking=False)
                            done = d_stream.record()
                    inflight.append((s, out, done, arrival, pin, counted))
            batch.clear()
            stage_s["swap_mark_nv12"] += time.perf_counter() - t_flush

        def batch_due() -> bool:
            """The dynamic batcher's rule: the faces waiting fill a model call, or the oldest has
            waited --max-wait-ms."""
            return (sum(len(b[2]) for b in batch) >= mb
                    or (time.perf_counter() - batch[0][3]) * 1e3 >= args.max_wait_ms)

        def reap(block: bool = False) -> None:
            while inflight and (block or inflight[0][2].done):
                s, out, done, arrival, pin, counted = inflight.popleft()
                done.synchronize()
                s.nv12.release(out, done)
                if s.encoder is not None:  # its frame was downloaded into `pin`
                    s.encoder.q.put((pin, arrival, counted))
                elif counted:
                    lat.append((time.perf_counter() - arrival) * 1e3)

        stalls: list[dict[str, Any]] = []
        prof = None
        if args.profile_dir:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        while True:
            now = time.perf_counter()
            if feed_errors:
                raise RuntimeError(f"a feeder thread failed: {feed_errors[0]!r}") from feed_errors[0]
            # Feeders first: one may queue its last frame between the two checks the other way round.
            if now >= t_end and not any(th.is_alive() for th in feeders) and intake.empty():
                break
            watch.begin()
            marks = [now]
            overlap_s = 0.0
            # The frames the feeders queued since the last round, one per stream, those already a
            # frame period late dropped (Intake); they are analysed together (one landmark call).
            # With faces waiting to be swapped the round neither blocks nor gathers: they would
            # wait past --max-wait-ms.
            pending, waited = intake.round((0.0005 if inflight else 0.002) if not batch else 0.0, gather=not batch)
            marks.append(time.perf_counter())
            stage_s["idle"] += waited
            stage_s["take"] += marks[1] - marks[0] - waited
            if pending:
                with a_stream:
                    for _s, _buf, _arr, ev in pending:
                        a_stream.wait_event(ev)
                    tracks = PendingTracks([(s.analyser, Frame(buf, s.index, Fraction(1, 30), s.index))
                                            for s, buf, _arr, _e in pending])
                if pipelined and batch and batch_due():
                    # The previous rounds' swaps are launched while this round's landmarks run
                    # (on another CUDA stream): the host works instead of waiting for them.
                    t_overlap = time.perf_counter()
                    flush()
                    overlap_s = time.perf_counter() - t_overlap  # counted as swap, not analysis
                with a_stream:
                    found = tracks.finish()
                    analysed = a_stream.record()
                marks.append(time.perf_counter())  # analysis done
                stage_s["analyse"] += marks[2] - marks[1] - overlap_s
                for (s, buf, arrival, _e), faces in zip(pending, found):
                    s.index += 1
                    batch.append((s, buf, faces, arrival, analysed))
            # Plain, the round's faces are swapped now if due (swap_many cuts them into calls of 4).
            # Pipelined, they wait for the next round's landmark launch (or for a round with
            # nothing new) to be swapped: that is the overlap.
            if batch and (not pending or (not pipelined and batch_due())):
                flush()
            t_reap = time.perf_counter()
            reap()
            stage_s["reap"] += time.perf_counter() - t_reap
            took = time.perf_counter() - now
            stacks = watch.end()
            if took > STALL_S and len(stalls) < 20:
                # Where a round's time went, for rounds far longer than a frame period.
                stalls.append({"at_s": round(now - t0, 3), "round_ms": round(took * 1e3, 1),
                               "take_ms": round((marks[1] - marks[0]) * 1e3, 1),
                               "analyse_ms": round((marks[2] - marks[1] - overlap_s) * 1e3, 1) if len(marks) > 2 else 0.0,
                               "overlapped_swap_ms": round(overlap_s * 1e3, 1),
                               "pending": len(pending), "streams": len(streams), "stacks": stacks})
            if not pending and not batch and int(now * 10) % 10 == 0:
                peak = max(peak, device_used_bytes())
        flush()
        reap(block=True)
        if prof is not None:
            prof.disable()
            tag = variant_tag(cmd["feeders"], cmd["pipeline"], cmd["gather_ms"], cmd["phase_kind"])
            write_profile(prof, Path(args.profile_dir) / f"profile_{sink}_{res}p_n{cmd['total']}{tag}_pid{os.getpid()}.txt")
        for s in streams:
            if s.encoder is not None:
                s.encoder.close()
            s.src.close()
        decoded = sum(s.decoded for s in streams)
        host = {k: round(v * 1e3 / max(intake.taken, 1), 3) for k, v in stage_s.items()}
        # The feeders' decode time is their own threads' wall time (NVDEC waits without the GIL).
        host["decode_in_feeders"] = round(sum(s.decode_s for s in streams) * 1e3 / max(decoded, 1), 3)
        res = {"frames": sum(s.frames for s in streams),
               "dropped": sum(s.dropped + s.feeder_drops for s in streams),
               "faces": sum(s.faces for s in streams), "latency_ms": enc_lat if sink == "x264" else lat,
               "batch_sizes": dict(sizes), "peak_gpu_bytes": peak, "seconds": float(cmd["seconds"]),
               "decode": ("nvdec" if nvdec else "opencv + upload") + f", {nf} feeder threads",
               "feeder_threads": nf,
               "marked": disclosure.frames_marked - marked0, "stalls": stalls,
               "captures_in_run": len(mesh_runner.captured) - graphs0,
               "host_ms_per_frame": host}
        print(json.dumps(res), flush=True)
    # Leave without running destructors: torch's cached stream objects wrap CuPy streams that may be
    # gone by then, and a destructor error at exit would read like a failed run.
    sys.stdout.flush()
    os._exit(0)


def write_profile(prof: Any, path: Path) -> None:
    """The run loop's functions by own time and by cumulative time (where a round's host time goes)."""
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue())


# -- parent -------------------------------------------------------------------------------------

def gpu_util_sampler(stop: threading.Event, out: list[float]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not stop.wait(0.2):
            out.append(float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
    except Exception:
        pass


Config = tuple[str, str, int, int, int, float, str]
"""One measured point: sink, resolution, N, feeders, pipelined, gather window (ms), phases."""


def run_configs(args: argparse.Namespace) -> list[Config]:
    """Every combination of the list options, each option checked once; a bad value exits with
    its option named."""
    def ints(opt: str, text: str, allowed: set[int] | None = None) -> list[int]:
        try:
            vals = [int(v) for v in text.split(",")]
        except ValueError:
            sys.exit(f"error: --{opt} {text}: give whole numbers, e.g. 0,1")
        if allowed is not None and not set(vals) <= allowed:
            sys.exit(f"error: --{opt} {text}: each value must be one of {sorted(allowed)}")
        return vals

    sinks = args.sink.split(",")
    if not set(sinks) <= {"null", "x264"}:
        sys.exit(f"error: --sink {args.sink}: each sink must be null or x264")
    ress = args.res.split(",")
    if not set(ress) <= {"720", "1080"}:
        sys.exit(f"error: --res {args.res}: each resolution must be 720 or 1080")
    try:
        gathers = [float(g) for g in args.gather_ms.split(",")]
    except ValueError:
        sys.exit(f"error: --gather-ms {args.gather_ms}: give milliseconds, e.g. 0,4")
    if any(not 0 <= g < 1e3 / FPS for g in gathers):
        sys.exit(f"error: --gather-ms {args.gather_ms}: each window must be at least 0 and shorter "
                 f"than a frame period ({1e3 / FPS:.1f} ms)")
    phase_kinds = args.phases.split(",")
    if not set(phase_kinds) <= {"grouped", "random", "sorted"}:
        sys.exit(f"error: --phases {args.phases}: each value must be grouped, random or sorted")
    ns, feeders, pipelines = ints("ns", args.ns), ints("feeders", args.feeders), ints("pipeline", args.pipeline, {0, 1})
    if min(ns) < 1 or min(feeders) < 0:
        sys.exit("error: --ns must be at least 1 and --feeders at least 0")
    return [(sink, res, n, f, pl, g, ph) for sink in sinks for res in ress for n in ns for f in feeders
            for pl in pipelines for g in gathers for ph in phase_kinds]


def read_reply(proc: subprocess.Popen[str], i: int) -> dict[str, Any]:
    """A worker's next JSON line; a worker that died says so (its traceback went to stderr)."""
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if not line:
        sys.exit(f"error: worker {i} exited (code {proc.poll()}); its error is above")
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip720", required=True)
    ap.add_argument("--clip1080", required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ns", default="4,8,16,24,32")
    ap.add_argument("--res", default="720,1080")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=4.0)
    ap.add_argument("--x264-threads", type=int, default=1, help="x264 threads per stream (x264 sink)")
    ap.add_argument("--feeders", default="0", help="decode threads per worker, a list to compare (0: one per stream)")
    ap.add_argument("--gather-ms", default="0",
                    help="a round waits up to this long (from its oldest frame's arrival) for more frames; a list compares")
    ap.add_argument("--pipeline", default="0",
                    help="1: launch the last round's swaps while this round's landmarks run; a list (0,1) compares")
    ap.add_argument("--phases", default="grouped",
                    help="streams' arrival phases: grouped (a worker's streams arrive together), random, or sorted "
                         "(random phases placed on the workers in phase order); a list compares")
    ap.add_argument("--sink", default="null", help="null or x264, or a list (null,x264) to compare in one run")
    ap.add_argument("--decode", choices=("auto", "cpu"), default="auto")
    ap.add_argument("--tag", default="")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config setting on top of the live preset, e.g. detector.detect_every=10")
    ap.add_argument("--mps", action="store_true",
                    help="run the workers as clients of a private NVIDIA MPS daemon, so their kernels share the GPU "
                         "at once instead of in time slices (swapstream.gpu.mps)")
    ap.add_argument("--warm-first", action="store_true",
                    help="start one worker, then the others once it is ready (they reuse its compiled kernels)")
    ap.add_argument("--profile-dir", help="write each worker's cProfile of each run loop here (slows the host)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return
    import tempfile

    if args.workers < 1:
        sys.exit(f"error: --workers {args.workers}: give at least 1")
    if args.x264_threads < 1:
        sys.exit(f"error: --x264-threads {args.x264_threads}: give at least 1")
    configs = run_configs(args)  # checked before the workers' minutes of start-up
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:  # the workers' model folders
        cmd = [sys.executable, __file__, "--worker", "--tmp", tmp, "--clip720", args.clip720, "--clip1080",
               args.clip1080, "--decode", args.decode, "--max-wait-ms", str(args.max_wait_ms),
               "--x264-threads", str(args.x264_threads)]
        if args.profile_dir:
            cmd += ["--profile-dir", args.profile_dir]
        for kv in args.set:
            cmd += ["--set", kv]
        if not args.mps:
            rows = run_pool(args, configs, cmd, None)
        else:
            from swapstream.gpu.mps import MpsError, mps_daemon

            try:
                with mps_daemon() as env:
                    rows = run_pool(args, configs, cmd, env)
            except MpsError as e:
                sys.exit(f"error: --mps: {e}")
    if args.out:
        write(rows, args)


def run_pool(args: argparse.Namespace, configs: list[Config],
             cmd: list[str], env: dict[str, str] | None) -> list[dict[str, Any]]:
    """Start the worker processes (with `env`: as MPS clients under --mps), run every
    configuration on them, stop them; one result row per configuration."""
    def spawn() -> subprocess.Popen[str]:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(spawn())
        if args.warm_first:
            # Inductor keeps what it compiled in its on-disk caches: the other workers, started after
            # the first is ready, load its kernels instead of all compiling the same ones at once.
            hello = [read_reply(procs[0], 0)]
            procs += [spawn() for _ in range(args.workers - 1)]
            hello += [read_reply(p, i) for i, p in enumerate(procs) if i]
        else:
            procs += [spawn() for _ in range(args.workers - 1)]
            hello = [read_reply(p, i) for i, p in enumerate(procs)]  # waits for model builds and compiles
        print(f"{len(procs)} workers ready: {hello}", flush=True)
        servers: list[int] = []
        if env is not None:
            from swapstream.gpu.mps import MpsError, server_pids

            # A CUDA process that cannot reach the daemon runs without MPS and says nothing: every
            # worker has initialised CUDA by now, so the daemon runs a server for them, or none.
            servers = server_pids(env)
            if not servers:
                raise MpsError("the workers did not become clients of the MPS daemon (it runs no server); "
                               "see its log in " + env["CUDA_MPS_LOG_DIRECTORY"])
            print(f"MPS servers: {servers}", flush=True)
        rows: list[dict[str, Any]] = []
        for sink, res, n, feeders, pipeline, gather, phases in configs:
            per = [n // args.workers + (1 if i < n % args.workers else 0) for i in range(args.workers)]
            offset = 0
            at = stream_phases(n, phases)
            for p, k in zip(procs, per):
                p.stdin.write(json.dumps({"n": k, "res": res, "seconds": args.seconds, "feeders": feeders,
                                          "pipeline": pipeline, "gather_ms": gather, "sink": sink,
                                          "phases": at[offset:offset + k], "phase_kind": phases, "total": n}) + "\n")
                p.stdin.flush()
                offset += k
            armed = [read_reply(p, i) for i, p in enumerate(procs)]  # streams built and warmed
            start_at = time.time() + 0.5
            for p in procs:
                p.stdin.write(json.dumps({"start_at": start_at}) + "\n")
                p.stdin.flush()
            print(f"{sink} {res}p N={n}{' pipelined' if pipeline else ''} gather {gather} ms, {phases} phases: armed {len(armed)} workers", flush=True)
            util: list[float] = []
            stop = threading.Event()
            th = threading.Thread(target=gpu_util_sampler, args=(stop, util), daemon=True)
            th.start()
            outs = [read_reply(p, i) for i, p in enumerate(procs)]
            stop.set()
            lat = [x for o in outs for x in o["latency_ms"]]
            frames = sum(o["frames"] for o in outs)
            dropped = sum(o["dropped"] for o in outs)
            sizes: Counter[str] = Counter()
            for o in outs:
                sizes.update(o["batch_sizes"])
            row = {"sink": sink, "res": res, "n": n, "workers": args.workers, "mps": bool(servers), "feeders": feeders, "pipeline": pipeline, "gather_ms": gather,
                   "phases": phases, "feeder_threads": [o.get("feeder_threads") for o in outs], "frames": frames, "dropped": dropped,
                   "drop_rate": round(dropped / max(frames + dropped, 1), 4),
                   "faces_per_s": round(sum(o["faces"] for o in outs) / args.seconds, 1),
                   "latency_ms": pcts(lat) if lat else None,
                   "gpu_util_mean": round(float(np.mean(util)), 1) if util else None,
                   "gpu_mem_gb": round(max(o["peak_gpu_bytes"] for o in outs) / 1e9, 2),
                   "batch_sizes": dict(sizes), "decode": outs[0]["decode"],
                   "frames_marked": sum(o["marked"] for o in outs),
                   "captures_in_run": sum(o["captures_in_run"] for o in outs),
                   "host_ms_per_frame": [o["host_ms_per_frame"] for o in outs],
                   "stalls": [dict(x, worker=i) for i, o in enumerate(outs) for x in o.get("stalls", [])]}
            row["within_budget"] = bool(lat) and row["drop_rate"] <= MAX_DROP and row["latency_ms"]["p99"] <= BUDGET_MS
            print(json.dumps(row), flush=True)
            rows.append(row)
        for p in procs:
            p.stdin.write(json.dumps({"quit": True}) + "\n")
            p.stdin.flush()
            p.wait(timeout=60)
    finally:
        # A run that failed (a worker died, MPS was not joined) leaves the others waiting on their
        # stdin: end them, so that none is left holding the GPU or an MPS client connection.
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return rows


def stream_phases(n: int, kind: str) -> list[float]:
    """Each stream's arrival time within the frame period, as a fraction of it, in stream order
    (the workers take consecutive runs of streams). `grouped`: evenly spread in stream order, so a
    worker's streams arrive close together; `random`: independent uniform phases (seeded by N, so a
    run can be repeated), as unrelated live sources arrive, placed on the workers in stream order, so
    a worker's streams are spread over the period; `sorted`: the same random phases, placed in phase
    order, which is what a placer that knows each stream's phase (its arrival time modulo the frame
    period, seen in its first frames) can do: a worker's streams again arrive close together, but
    unevenly spaced."""
    if kind in ("random", "sorted"):
        at = [float(x) for x in np.random.default_rng(n).uniform(0.0, 1.0, n)]
        return sorted(at) if kind == "sorted" else at
    return [j / n for j in range(n)]


def variant_tag(feeders: int, pipeline: int, gather_ms: float, phases: str) -> str:
    """What tells a configuration's metric names (and profile files) from the defaults' ones."""
    return ((f"_f{feeders}" if feeders else "") + ("_pipelined" if pipeline else "")
            + (f"_gather{gather_ms:g}" if gather_ms else "") + (f"_{phases}" if phases != "grouped" else ""))


def _variant(row: dict[str, Any]) -> tuple[str, str, int, int, float, str]:
    """What separates the series of a run: sink, resolution, feeder count, loop kind, gather window,
    stream phases."""
    return row["sink"], row["res"], row["feeders"], row["pipeline"], row["gather_ms"], row["phases"]


def _variant_name(key: tuple[str, str, int, int, float, str], args: argparse.Namespace) -> str:
    sink, res, fd, pl, g, ph = key
    return ((f"{sink}, " if "," in args.sink else "") + f"{res}p"
            + (f", --feeders {fd}" if len(args.feeders.split(",")) > 1 else "")
            + (", pipelined" if pl else "") + (f", gather {g:g} ms" if g else "")
            + (f", {ph} phases" if ph != "grouped" else ""))


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    common = run_fields(gpu_name(), f"python tools/bench_streams.py --ns {args.ns} --seconds {args.seconds} "
                                    f"--workers {args.workers} --feeders {args.feeders} --pipeline {args.pipeline} --gather-ms {args.gather_ms} "
                                    f"--sink {args.sink} --max-wait-ms {args.max_wait_ms} --x264-threads {args.x264_threads} --phases {args.phases} --res {args.res} --decode {args.decode}"
                                    + (" --warm-first" if args.warm_first else "") + (" --mps" if args.mps else "")
                                    + "".join(f" --set {kv}" for kv in args.set))
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for r in rows:
        cfg = {k: r[k] for k in ("sink", "res", "n", "workers", "mps", "feeders", "pipeline", "gather_ms", "phases", "feeder_threads", "frames", "dropped", "drop_rate", "gpu_util_mean", "gpu_mem_gb",
                                 "batch_sizes", "decode", "within_budget", "frames_marked", "captures_in_run", "host_ms_per_frame", "stalls") if k in r}
        # Several feeder counts or loop kinds in one run get their own metric names.
        f = variant_tag(r["feeders"], r["pipeline"], r["gather_ms"], r["phases"])
        records.append({"metric": f"streams_{r['sink']}_{r['res']}p_n{r['n']}{f}_faces_per_s", "value": r["faces_per_s"],
                        "unit": "faces/s", "stat": "mean", "config": cfg, **common})
        if r["latency_ms"]:
            for stat in ("p50", "p99"):
                records.append({"metric": f"streams_{r['sink']}_{r['res']}p_n{r['n']}{f}_latency",
                                "value": r["latency_ms"][stat], "unit": "ms", "stat": stat, **common})
    (args.out / f"streams{args.tag}.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# Concurrent live streams on one GPU, sink: {args.sink} ({common['device']})", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}. One face per stream, full-size "
             "inswapper architecture, 30 fps real-time pace. Budget: drops ≤ 1% and p99 ≤ 33 ms. "
             + ("The worker processes are clients of one MPS daemon (`--mps`): their kernels share the GPU at once."
                if args.mps else "The worker processes time-slice the GPU (no MPS)."), "",
             "| sink | res | N | workers | loop | gather ms | phases | decode | faces/s | drops | p50 ms | p99 ms | GPU util % | GPU mem GB (device) | batch sizes | within budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        la = r["latency_ms"] or {"p50": float("nan"), "p99": float("nan")}
        lines.append(f"| {r['sink']} | {r['res']}p | {r['n']} | {r['workers']} | {'pipelined' if r['pipeline'] else 'plain'} | {r['gather_ms']:g} | {r['phases']} | {r['decode']} | {r['faces_per_s']} | {100 * r['drop_rate']:.1f}% "
                     f"| {la['p50']:.1f} | {la['p99']:.1f} | {r['gpu_util_mean']} | {r['gpu_mem_gb']} "
                     f"| {r['batch_sizes']} | {'yes' if r['within_budget'] else 'no'} |")
    for key in sorted({_variant(r) for r in rows}):
        rr = [r for r in rows if _variant(r) == key]
        ok = [r["n"] for r in rr if r["within_budget"]]
        best = max((r["faces_per_s"] for r in rr), default=0)
        which = _variant_name(key, args)
        lines.append("")
        lines.append(f"{which}: largest N within budget: {max(ok) if ok else 'none'}; most faces/s: {best}.")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for key in sorted({_variant(r) for r in rows}):
            rr = [r for r in rows if _variant(r) == key and r["latency_ms"]]
            name = _variant_name(key, args)
            ax.plot([r["n"] for r in rr], [r["latency_ms"]["p99"] for r in rr], "o-", label=f"{name} p99")
            ax.plot([r["n"] for r in rr], [r["latency_ms"]["p50"] for r in rr], "x--", label=f"{name} p50")
        ax.axhline(BUDGET_MS, color="k", lw=0.8, ls=":")
        ax.set(xlabel="concurrent streams N", ylabel="latency ms", yscale="log", title=f"sink: {args.sink}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / f"streams{args.tag}.png", dpi=110)
        lines += ["", f"![latency against N](streams{args.tag}.png)"]
    except ImportError:
        pass
    (args.out / f"streams{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
