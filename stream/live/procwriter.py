"""A live output whose encoder runs in a process of its own.

Why: x264 does its work without the GIL, but PyAV takes the GIL back several times a frame (to send
the frame, to take each packet out, to write the FLV), and each time the encoder thread waits for
whichever Python thread holds it to reach its switch. A `serve` worker runs many such threads (its
event loop, the device threads, each stream's reader and analysis), so its encoders wait a lot: on
the 2-core machine one busy Python thread beside a 720p x264 frame cost it 6.4 ms at the runtime's
1 ms switch interval (docs/benchmarks/x264_gil.md). In a process of its own the encoder's GIL is
its own.

`ProcessWriter` has `LiveWriter`'s interface (`write`, `write_nv12`, `write_audio`, `close`,
`started`, `frames`, `dropped`) and runs a real `LiveWriter` in a child process (spawned, so that no
CUDA context or thread of the parent is copied into it). Frames go through memory the two share (a
memfd), the messages about them over a pipe. A write returns once the child has encoded and sent
the frame, as `LiveWriter.write` does, so a frame's latency still ends when its encoding ends. Audio
packets go without a reply, in order with the frames. The input's audio stream, which the output copies its parameters from, travels as
a NUT header with one empty packet: the child opens it and has a stream to use as the template.

A child that dies, or does not answer a frame within `reply_timeout` seconds, is an `OutputError`
for the writer's owner (a stream of the runtime then fails with that message).
"""

from __future__ import annotations

import io
import logging
import math
import mmap
import multiprocessing as mp
import os
import signal
from fractions import Fraction
from multiprocessing import reduction
from typing import Any

import av
import numpy as np

from ..errors import OutputError
from ..io.video import AudioPacket
from ..netpolicy import Outbound, OutboundPolicy, TlsSettings
from ..redact import redact_url
from ..types import Frame

log = logging.getLogger(__name__)

REPLY_TIMEOUT_S = 30.0
"""How long a write waits for the child's answer. A frame takes milliseconds; the first ones, which
the writer holds to measure the rate and then encodes at once (a GOP, with an RTMP connection of
up to 5 s), take longer; a child that has not answered after this is taken as hung."""
START_TIMEOUT_S = 60.0
"""How long the child may take to start (a fresh interpreter importing PyAV and NumPy; many streams
start at once on a busy machine)."""
CLOSE_TIMEOUT_S = 20.0
"""How long closing waits for the child to flush its encoder and close the output."""


def audio_template(stream: Any) -> bytes | None:
    """The input's audio stream as bytes a child can open (a NUT header and one empty packet: a
    header alone does not open), or None without one."""
    if stream is None:
        return None
    buf = io.BytesIO()
    out = av.open(buf, "w", format="nut")
    s = out.add_stream_from_template(stream)
    packet = av.Packet(b"\x00")
    packet.pts = packet.dts = 0
    packet.time_base = s.time_base
    packet.stream = s
    out.mux(packet)
    out.close()
    return buf.getvalue()


def _open_template(data: bytes | None) -> tuple[Any, Any]:
    """The audio template stream from `audio_template`'s bytes, and its container (keep it open)."""
    if data is None:
        return None, None
    c = av.open(io.BytesIO(data), "r", format="nut")
    return (c.streams.audio[0] if c.streams.audio else None), c


def _packet(data: bytes, pts: int | None, dts: int | None, duration: int, time_base: Fraction,
            key: bool) -> AudioPacket:
    p = av.Packet(data)
    p.pts, p.dts, p.duration, p.time_base, p.is_keyframe = pts, dts, duration, time_base, key
    return AudioPacket(p)


class ProcessWriter:
    """A `LiveWriter` in a child process (module doc). Takes `LiveWriter`'s arguments."""

    def __init__(self, target: str, *, width: int, height: int, audio_from: Any = None,
                 outbound: Outbound | None = None, reply_timeout: float = REPLY_TIMEOUT_S,
                 **kwargs: Any) -> None:
        self.target = target
        self.kind: str = kwargs.get("kind", "rtmp")
        self.reply_timeout = reply_timeout
        self.frames = 0
        self.dropped = 0
        self.keyframes = 0
        self.declared_rate: Fraction | None = None
        self._started = False
        self._closed = False
        self._buf: np.ndarray | None = None
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        policy = (outbound.policy, outbound.tls) if outbound is not None else None
        args = dict(kwargs, width=width, height=height)
        self._proc = ctx.Process(target=_serve, args=(child, target, args, audio_template(audio_from), policy),
                                 name="live-output", daemon=True)
        self._proc.start()
        child.close()  # the child's end: its copy is the only one, so its death reads as EOF here
        # The frames' memory, shared with the child: one copy a frame into it, and messages of a few
        # bytes over the pipe (each system call lets go of the GIL, and taking it back waits for
        # this busy process's other threads: a 1.4 MB frame through the pipe was seven of them).
        # A memfd has no name to clean up and goes when both sides have closed it.
        self._frame_bytes = width * height * 3  # RGB, the largest a frame comes as
        fd = os.memfd_create("swapstream-frames")
        try:
            os.ftruncate(fd, self._frame_bytes)
            self._shared = mmap.mmap(fd, self._frame_bytes)
            try:
                self._reply("ready", START_TIMEOUT_S)
                reduction.send_handle(self._conn, fd, self._proc.pid)
                self._reply("mapped", START_TIMEOUT_S)
            except BaseException:
                self._end_child()
                raise
        finally:
            os.close(fd)  # the mapping and the child's copy keep the memory
        self._frames = np.frombuffer(self._shared, np.uint8)

    @property
    def started(self) -> bool:
        """Whether the child's encoder runs (`LiveWriter.started`)."""
        return self._started

    def write(self, frame: Frame) -> None:
        """Encode and send an RGB frame."""
        self._video("rgb", np.ascontiguousarray(frame.data), frame.pts, frame.time_base)

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        """Encode and send an NV12 frame (`LiveWriter.write_nv12`)."""
        self._video("nv12", np.ascontiguousarray(nv12), pts, time_base)

    def _video(self, fmt: str, data: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        self._check_open()
        if data.dtype != np.uint8 or data.nbytes > self._frame_bytes:
            raise ValueError(f"a frame of {data.shape} {data.dtype} does not fit this "
                             f"{self._frame_bytes}-byte output")
        np.copyto(self._frames[:data.nbytes], data.reshape(-1))
        try:
            self._conn.send(("video", fmt, data.shape, pts, time_base))
        except OSError:
            self._died()
        self._reply("done", self.reply_timeout)

    def write_audio(self, packet: AudioPacket) -> None:
        """Pass an audio packet through (no answer is waited for; the writer drops a bad one)."""
        if self._closed:
            return
        p = packet.packet
        try:
            self._conn.send(("audio", bytes(p), p.pts, p.dts, p.duration, p.time_base, bool(p.is_keyframe)))
        except OSError:
            self._died()

    def close(self) -> None:
        """Flush the encoder, close the output, end the child. Safe to call more than once."""
        if self._closed:
            return
        try:
            self._conn.send(("close",))
            self._reply("closed", CLOSE_TIMEOUT_S)
        except (OSError, OutputError) as e:
            log.warning("%s", e)
        finally:
            self._closed = True
            self._end_child()

    # -- the conversation -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OutputError(f"live output '{redact_url(self.target)}' is closed")

    def _reply(self, expected: str, timeout: float) -> None:
        """Wait for the child's answer and take its state; its error is raised here."""
        try:
            if not self._conn.poll(timeout):
                self._closed = True
                self._end_child()
                raise OutputError(f"the encoder process of live output '{redact_url(self.target)}' did "
                                  f"not answer in {timeout:g} s; the output was closed")
            msg = self._conn.recv()
        except (EOFError, OSError):
            self._died()
        kind = msg[0]
        if kind == "error":
            if expected in ("ready", "closed"):
                self._closed = True
                self._end_child()
            raise OutputError(msg[1])
        if kind != expected:  # a bug in this module, not the output's fault
            raise RuntimeError(f"live output process: expected '{expected}', got '{kind}'")
        self._started, self.frames, self.dropped, self.keyframes, self.declared_rate = msg[1]

    def _died(self) -> Any:
        self._closed = True
        self._proc.join(timeout=1.0)
        code = self._proc.exitcode
        self._end_child()
        raise OutputError(f"the encoder process of live output '{redact_url(self.target)}' ended "
                          f"unexpectedly (exit code {code}); the output was closed")

    def _end_child(self) -> None:
        self._conn.close()
        shared = getattr(self, "_shared", None)
        if shared is not None:
            self._frames = np.empty(0, np.uint8)  # the view first: a mapping with views will not close
            shared.close()
            self._shared = None
        self._proc.join(timeout=CLOSE_TIMEOUT_S if self._proc.is_alive() else 0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5.0)


def _state(w: Any) -> tuple[bool, int, int, int, Fraction | None]:
    return w.started, w.frames, w.dropped, w.keyframes, w.declared_rate


def _serve(conn: Any, target: str, kwargs: dict[str, Any], template: bytes | None,
           policy: tuple[OutboundPolicy | None, TlsSettings] | None) -> None:
    """The child: a LiveWriter driven by the parent's messages until `close` or the parent's end."""
    from .streams import LiveWriter

    # Ctrl+C reaches the whole process group; the parent decides when its outputs close.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No priority of its own: the child has its spawning thread's, in the runtime a media thread's
    # (runtime/priority.py), as the encoder threads it replaces had. Lowered once more, the H200's
    # encoders starved behind the workers' media threads (26.8 ms a 720p frame against 8.7 ms).
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        audio_from, _holder = _open_template(template)
        outbound = Outbound(*policy) if policy is not None else None
        w = LiveWriter(target, audio_from=audio_from, outbound=outbound, **kwargs)
    except OutputError as e:
        conn.send(("error", str(e)))
        return
    except Exception as e:  # noqa: BLE001 - whatever it is, the parent says it and carries on
        conn.send(("error", f"cannot open live output '{redact_url(target)}': {e}"))
        return
    conn.send(("ready", _state(w)))
    try:
        fd = reduction.recv_handle(conn)
        shared = mmap.mmap(fd, kwargs["width"] * kwargs["height"] * 3)
        os.close(fd)
    except (EOFError, OSError) as e:
        conn.send(("error", f"live output '{redact_url(target)}': cannot share frames with the encoder "
                            f"process: {e}"))
        w.close()
        return
    frames = np.frombuffer(shared, np.uint8)
    conn.send(("mapped", _state(w)))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            w.close()  # the parent is gone: finish the output as far as it got
            return
        kind = msg[0]
        try:
            if kind == "video":
                _, fmt, shape, pts, time_base = msg
                # The writer copies what it keeps (PyAV's from_ndarray): the memory is reused, and
                # the parent writes the next frame only after this one's answer.
                buf = frames[:math.prod(shape)].reshape(shape)
                if fmt == "nv12":
                    w.write_nv12(buf, pts, time_base)
                else:
                    w.write(Frame(buf, pts, time_base, 0))
                conn.send(("done", _state(w)))
            elif kind == "audio":
                w.write_audio(_packet(*msg[1:]))
            elif kind == "close":
                w.close()
                conn.send(("closed", _state(w)))
                return
        except OutputError as e:
            conn.send(("error", str(e)))
            if kind == "close":
                return
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the output
            log.exception("live output process")
            conn.send(("error", f"live output '{redact_url(target)}' failed: {e}"))
            w.close()
            return
