"""The file job on the GPU: frames stay in GPU memory from upload to download, with double buffering.

Stages and their CUDA streams (CuPy-owned), ordered by events, never by a device-wide sync:
- upload: PyAV decodes on the host into a ring of pinned buffers; an asynchronous copy on the
  upload stream puts each frame into a ring of device buffers;
- analyse: waits for the frame's upload (or decode) event, then runs the face analysis; only the
  landmarks come back to the host;
- compute: waits for the analysis of the frames it swaps together (one at a time for the mesh
  swapper; up to `neural.max_batch` frames' faces in one model call for a neural one), then swaps;
- compose: the swap stage's disclosure (label, mark), then the frame converted to yuv420p on the
  compute stream (half the bytes of RGB, and x264's input format: no conversion on the host);
- download: waits for the compute event, copies the frame into a ring of pinned buffers;
- encode: the host waits for that copy's event (the one host wait, where the encoder takes over)
  and hands the pinned buffer to the encoder thread (x264), one frame behind, so the copy of frame n
  overlaps the compute of frame n+1 and its encoding the next frames' decode, analysis and swap;
  the pinned slot is reused once the encoder has read it.
Face analysis runs on the device frame: the built-in networks through PyTorch (gpu/analyser.py), or
the neural detector's runner; only landmarks come back to the host.
NVTX ranges mark every stage, so a profile shows the overlap.

Decoding: NVDEC (PyNvVideoCodec) decodes straight into the device slot where it can (`decoder`
in the config; PyAV's demuxer carries the audio beside it); otherwise PyAV decodes on the host and
the frame is uploaded as above. The null output (`-o null:`) skips the download and the encoder.
NVENC encoding is the next step: this job encodes with x264.

The loop itself is `FileJob.run`'s, the same as on the CPU; `DeviceFrames` is this job's frame path.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..io.background import HOLD, BackgroundCalls, ReadAhead
from ..kernels.nv12 import rgb_to_i420
from ..io.video import AudioPacket, AudioPackets, VideoInfo, VideoReader, is_null_output, pts_step
from ..pipeline import Decoded, FileJob, FramePath
from ..types import Frame
from .ring import HostEvent, Ring, Slot

log = logging.getLogger(__name__)


@contextmanager
def nvtx(name: str) -> Iterator[None]:
    """An NVTX range (visible in Nsight Systems), or nothing where NVTX is unavailable."""
    try:
        from cupy.cuda import nvtx as _nvtx

        _nvtx.RangePush(name)
    except Exception:  # NVTX is optional: profiling aid only
        yield
        return
    try:
        yield
    finally:
        _nvtx.RangePop()

# Three slots for the upload side: a host slot is refilled once its upload has finished, a device
# slot once its frame's download has (the download ring adds the encoder's queue, below).
RING_SLOTS = 3
DECODE_AHEAD = 2
"""Frames the reader thread decodes ahead of the loop (`ReadAhead`)."""
WRITER_MATRIX = "bt709"
"""The matrix (limited range) of the yuv420p frames handed to the writer: the one `VideoWriter`
converts RGB with and tags its files with, so the GPU and CPU jobs write the same colours."""
ENCODE_QUEUE = 2
"""Frames that may wait for the encoder thread besides the one it encodes. x264 at 1080p (`veryfast`)
took 9 ms a frame on the H200 machine's host, as long as the rest of a frame's loop: on its own
thread it runs while the next frames are decoded, analysed and swapped."""


def gpu_available() -> tuple[bool, str]:
    """Whether the GPU path can run here, and why (or why not)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install 'swapstream[gpu]')"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or a broken one
        return False, f"CUDA is not usable: {str(e).splitlines()[0]}"
    if n == 0:
        return False, "no CUDA device"
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return True, f"CuPy {cupy.__version__} on {name}"


class GpuFileJob(FileJob):
    """`FileJob` with its frames on the GPU. Same swappers and outputs; see the module doc."""

    # Set by each run's DeviceFrames, for diagnostics and the summary.
    decoder_used: str
    """What decodes the input: `nvdec` or `pyav`."""
    ring_stalls: dict[str, int]
    """Ring acquisitions of the last run that had to wait, per ring."""

    def _builtin_analyser(self, config: Config) -> Any:
        # The built-in networks run on the GPU, on the uploaded frame (stream/gpu/analyser.py).
        from .analyser import GpuFaceAnalyser

        analyser = GpuFaceAnalyser(config)
        # The CUDA graphs of one face's landmarks and of the detector now, not at the first frames:
        # captured inside the loop they took 4.5 s of a 14 s run of a 360-frame 1080p clip on the
        # H200 (the loop's `speed` counted them).
        analyser.prepare(most_faces=1)
        return analyser

    def _working_copy(self, image: np.ndarray) -> Any:
        import cupy

        return cupy.asarray(image)

    def _finish_warm_up(self) -> None:
        import cupy

        cupy.cuda.get_current_stream().synchronize()

    def _nvdec_reason(self, info: VideoInfo) -> str | None:
        """None when NVDEC decodes this input, else why not (for the log; `decoder=nvdec` raises it)."""
        mode = self.config.decoder
        if mode == "cpu":
            return "decoder=cpu"
        import cupy

        from .pynvc import nvdec_available

        ok, why = nvdec_available(cupy.cuda.Device().id)
        if ok and info.rotation:
            # PyAV turns such frames upright (VideoReader); the NVDEC path has no rotation step.
            ok, why = False, f"the video asks for a {info.rotation} degree display rotation"
        elif ok and (info.width % 2 or info.height % 2):
            ok, why = False, f"its size {info.width}x{info.height} is odd (NV12 needs even sizes)"
        if ok:
            return None
        if mode == "nvdec":
            from ..errors import ConfigError

            raise ConfigError(f"decoder=nvdec, but NVDEC cannot decode '{info.path}': {why}. "
                              f"Use --set decoder=auto (PyAV when NVDEC cannot) or --set decoder=cpu")
        return why

    def _frames(self, inp: Path, info: VideoInfo, upload: Any, dev: Ring[Any],
                audio_out: list[Any]) -> Iterator[AudioPacket | tuple[Slot[Any], Any, Frame]]:
        """The input in file order: audio packets, and each video frame as (device slot, event that
        marks its picture ready, the frame on that slot). NVDEC decodes straight into the slot where
        it can (`decoder`); otherwise PyAV decodes on the host and a pinned slot is uploaded."""
        import cupyx

        why_not = self._nvdec_reason(info)
        if why_not is None:
            import cupy

            from ..errors import InputError
            from .nvdemux import NvdecSource

            try:
                # NATIVE latency: files may have B-frames, which need NVDEC's reordering.
                source = NvdecSource(inp, gpu_id=cupy.cuda.Device().id, low_latency=False,
                                     time_base=info.time_base)
            except InputError as e:  # a codec or size this NVDEC refuses, known at open
                if self.config.decoder == "nvdec":
                    raise
                why_not = str(e)
            else:
                yield from self._nvdec_frames(source, inp, info, dev, audio_out)
                return
        log.info("'%s': decoding with PyAV on the host (%s)", inp, why_not)
        self.decoder_used = "pyav"
        shape = (info.height, info.width, 3)
        pin_in: Ring[np.ndarray] = Ring(RING_SLOTS, lambda _i: cupyx.empty_pinned(shape, np.uint8))
        with VideoReader(inp) as reader:
            audio_out.append(reader.audio_stream)
            for item in reader:
                if isinstance(item, AudioPacket):
                    yield item
                    continue
                # Upload: host frame -> pinned slot -> device slot, asynchronously.
                with nvtx("upload"):
                    pin = pin_in.acquire(item.pts)
                    np.copyto(pin.buffer, item.data)
                    dslot = dev.acquire(item.pts)
                    dslot.buffer.set(pin.buffer, stream=upload)
                    uploaded = upload.record()
                    pin_in.release(pin, uploaded)
                yield dslot, uploaded, Frame(dslot.buffer, item.pts, item.time_base, item.index)
        self.ring_stalls["pinned_in"] = pin_in.stalls

    def _nvdec_frames(self, source: Any, inp: Path, info: VideoInfo, dev: Ring[Any],
                      audio_out: list[Any]) -> Iterator[AudioPacket | tuple[Slot[Any], Any, Frame]]:
        """`_frames` for an opened `NvdecSource`: frames decoded into device slots, with the audio
        that PyAV's demuxer reads beside them, interleaved by time."""
        self.decoder_used = "nvdec"
        log.info("'%s': decoding with NVDEC (%s)", inp, source.capabilities().get("codec", "?"))
        step = pts_step(info.avg_rate, info.time_base)
        with source, AudioPackets(inp) as audio:
            audio_out.append(audio.audio_stream)
            sounds = iter(audio)
            held: AudioPacket | None = next(sounds, None)
            last_pts: int | None = None
            for fr in source:
                pts = fr.pts
                if pts is None or (last_pts is not None and pts <= last_pts):
                    # The demuxer gave no usable pts: continue at the nominal rate, as VideoReader.
                    pts = 0 if last_pts is None else last_pts + step
                last_pts = pts
                t = float(pts * info.time_base)
                # Audio up to this frame's time first, so the writer gets both in time order.
                while held is not None and (held.time is None or held.time <= t):
                    yield held
                    held = next(sounds, None)
                dslot = dev.acquire(pts)
                ready = fr.copy_to(dslot.buffer)  # NV12 -> RGB on the decoder's stream
                yield dslot, ready, Frame(dslot.buffer, pts, info.time_base, fr.index)
            while held is not None:
                yield held
                held = next(sounds, None)
            yield HOLD  # the decoder and the demuxer are released when the loop closes its reader

    def _frame_path(self, inp: Path, info: VideoInfo, out: Path, batch: int) -> FramePath:
        return DeviceFrames(self, inp, info, out, batch)


class DeviceFrames:
    """`FileJob.run`'s frames on the GPU (the module doc): decoded into device slots on a reader
    thread, analysed on one CUDA stream, swapped and made yuv420p on another, copied back into
    pinned slots on a third, and handed to the encoder thread one frame behind."""

    name = "gpu-file"
    encode_queue = ENCODE_QUEUE

    def __init__(self, job: GpuFileJob, inp: Path, info: VideoInfo, out: Path, batch: int) -> None:
        import cupy
        import cupyx

        self.job, self.inp, self.info, self.batch = job, inp, info, batch
        job.decoder_used = ""
        shape = (info.height, info.width, 3)
        self.upload = cupy.cuda.Stream(non_blocking=True)
        # Analysis on a stream of its own: its one host wait (the landmarks) then waits for its own
        # kernels only, not for the swap of the frames before, still running on `compute`.
        self.analyse_stream = cupy.cuda.Stream(non_blocking=True)
        self.compute = cupy.cuda.Stream(non_blocking=True)
        self.download = cupy.cuda.Stream(non_blocking=True)
        # A device slot is written by the decoder and held until its frame's compute is done: the
        # DECODE_AHEAD frames queued on the reader thread, the one it decodes into, and the `batch`
        # frames the loop holds until their faces are swapped together. One more as a margin: a
        # ring hands out a slot that was never released without waiting, so a count one short
        # would overwrite a pending frame rather than stall.
        self.dev: Ring[Any] = Ring(DECODE_AHEAD + 2 + batch, lambda _i: cupy.empty(shape, cupy.uint8))
        null = is_null_output(out)
        # The encoder's input format made on the device: half the bytes of RGB to copy back, and no
        # RGB -> YUV pass on the host (x264 takes yuv420p as it is). Odd sizes go back as RGB (the
        # writer crops them; 4:2:0 needs even ones).
        self.planar = info.width % 2 == 0 and info.height % 2 == 0
        h, w = info.height, info.width
        out_shape = (h * 3 // 2, w) if self.planar else shape
        self.yuv: Ring[Any] | None = None
        self.uv_scratch: Any = None
        if self.planar and not null:
            self.yuv = Ring(RING_SLOTS, lambda _i: cupy.empty(out_shape, cupy.uint8))
            self.uv_scratch = cupy.empty((h // 2, w), cupy.uint8)
        # A host slot is free again once the encoder thread has read it (its HostEvent): room for
        # the frames the encoder holds, the ones whose download is in flight, and the next one.
        # The null output downloads nothing.
        self.pin_out: Ring[np.ndarray] | None = None if null else Ring(
            RING_SLOTS + ENCODE_QUEUE, lambda _i: cupyx.empty_pinned(out_shape, np.uint8))
        # Frames in flight, oldest first: (pinned slot or None, the event to wait for, frame, set
        # once the encoder has read the slot).
        self.in_flight: deque[tuple[Slot[np.ndarray] | None, Any, Frame, HostEvent]] = deque()
        job.ring_stalls = {"pinned_in": 0, "device": 0, "pinned_out": 0}
        self._audio: list[Any] = []  # the input's audio stream, once the reader has opened the file
        self._reads: ReadAhead | None = None

    def warm_up(self) -> None:
        # The swap model's graphs (one per batch size) and the kernels, before the loop's clock, on
        # the stream the loop swaps on: the torch runner captures a graph per stream, and one
        # captured in the loop was counted in its time.
        with self.compute:
            self.job.warm_swap(batches=self.batch, size=(self.info.height, self.info.width))

    def items(self) -> Iterator[AudioPacket | Decoded]:
        # NVDEC's decode call (1.6 ms of host time a 1080p frame, the GIL released) or PyAV's decode
        # and upload run on the reader thread while this one analyses and swaps the frames before.
        import cupy

        device = cupy.cuda.Device()

        def reader() -> Iterator[AudioPacket | tuple[Slot[Any], Any, Frame]]:
            device.use()  # a new thread starts on device 0: the job's device, as in this thread
            return self.job._frames(self.inp, self.info, self.upload, self.dev, self._audio)

        self._reads = ReadAhead(reader, depth=DECODE_AHEAD, name="gpu-file-decoder")
        for item in self._reads:
            if isinstance(item, AudioPacket):
                yield item
            else:
                slot, ready, frame = item
                yield Decoded(frame, slot=slot, ready=ready)

    @property
    def decoder(self) -> str:
        return self.job.decoder_used

    @property
    def audio_stream(self) -> Any:
        return self._audio[0] if self._audio else None

    def analyse(self, analyser: Any, item: Decoded) -> list[Any]:
        # Analysis reads the device frame once it is ready; only its landmarks come back to the
        # host (the one mid-frame wait).
        with nvtx("analyse"), self.analyse_stream:
            self.analyse_stream.wait_event(item.ready)
            faces = analyser.track(item.frame)
            item.analysed = self.analyse_stream.record()
        return faces  # type: ignore[no-any-return]

    @contextmanager
    def swapping(self, batch: list[Decoded]) -> Iterator[None]:
        # The swap writes the frames in place, so after analysis has read them.
        with nvtx("swap"), self.compute:
            for d in batch:
                self.compute.wait_event(d.analysed)
            yield

    def hand_over(self, item: Decoded, writer: Any, encoder: BackgroundCalls) -> int:
        dslot, frame = item.slot, item.frame
        with self.compute:
            picture = dslot.buffer
            if self.yuv is not None:
                ys = self.yuv.acquire(frame.pts)
                with nvtx("yuv420p"):
                    rgb_to_i420(dslot.buffer, ys.buffer, self.uv_scratch, matrix=WRITER_MATRIX)
                picture = ys.buffer
            done = self.compute.record()
        read = HostEvent()
        if self.pin_out is None:  # the null output
            self.dev.release(dslot, done)
            self.in_flight.append((None, done, frame, read))
        else:
            # Download: after the compute, into a pinned slot, asynchronously.
            with nvtx("download"):
                pout = self.pin_out.acquire(frame.pts)
                self.download.wait_event(done)
                picture.get(stream=self.download, out=pout.buffer, blocking=False)
                downloaded = self.download.record()
                if self.yuv is not None:
                    self.dev.release(dslot, done)  # converted: the RGB frame is free
                    self.yuv.release(ys, downloaded)
                else:
                    self.dev.release(dslot, downloaded)
                self.pin_out.release(pout, read)
            self.in_flight.append((pout, downloaded, frame, read))
        # Hand over the previous frame while this one is computed and copied back.
        n = 0
        while len(self.in_flight) > 1:
            self._finish_oldest(writer, encoder)
            n += 1
        return n

    def _finish_oldest(self, writer: Any, encoder: BackgroundCalls) -> None:
        slot, event, frame, read = self.in_flight.popleft()
        with nvtx("encode"):
            event.synchronize()  # the encoder hand-over: the only host wait per frame
            if slot is None:
                writer.write(frame)  # the null output: counted, nothing kept
            else:
                buffer, planar = slot.buffer, self.planar

                def encode() -> None:
                    try:
                        writer.write(Frame(buffer, frame.pts, frame.time_base, frame.index,
                                           format="yuv420p" if planar else "rgb24"))
                    finally:  # also after a failure: the loop must not wait for the slot for ever
                        read.record_done()

                # x264 runs on the encoder thread; this waits only when ENCODE_QUEUE frames do.
                encoder.submit(encode)

    def finish(self, writer: Any, encoder: BackgroundCalls) -> int:
        n = len(self.in_flight)
        while self.in_flight:
            self._finish_oldest(writer, encoder)
        return n

    def close(self) -> None:
        if self._reads is not None:
            self._reads.close()  # the reader thread, its decoder and the input file
        self.job.ring_stalls.update(device=self.dev.stalls,
                                    pinned_out=self.pin_out.stalls if self.pin_out else 0)
