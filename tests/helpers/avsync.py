"""A/V sync and latency across faults: a publisher whose video and audio carry the same clock, and a
receiver that measures the output's audio-minus-video skew and its latency.

The source clock starts at a wall-clock time `t0` (seconds since the epoch, shared by every process).
- Video frame n is due at t0 + n/fps and carries n in two rows of stamps (16 bits: 109 minutes at
  10 fps before it wraps), so that a frame can be matched to its source time whatever was dropped.
- Audio is a tone that is on in even seconds; the tone of second 2k has the frequency
  `tone_hz(k)`, which names k mod 16, so that an onset can be matched to its source second up to a
  32 s ambiguity (a skew of exactly 32 s, 64 s ... would pass unseen; any other shows).

The publisher (`python -m tests.helpers.avsync publish URL --t0 T`) is a process of its own, like
OBS or ffmpeg: it can be killed, and a new one continues the same source clock with its own
timestamps starting again at 0 (what a restarted encoder sends). It muxes FLV through libavformat
(the same muxer as the `ffmpeg` tool); `--jump-at S --jump-by J` adds J seconds to every timestamp
from S seconds into the connection on (an encoder whose clock jumps).

The receiver pulls an RTMP URL (reconnecting), and for each pull session records the video frames
(stamp, pts, arrival) and the audio (samples, pts). `skews` then sets each audio onset against the
video frames around it on the output's own timeline (what a player syncs by), and `latencies` each
frame's arrival against its due time.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np

from .stamps import read_stamp, stamp

RATE = 48000
SAMPLES = 1024
"""Samples per AAC frame."""
LEVEL = 0.3
CELL = 16
NO_VIDEO_S = 4.0
"""A receiver's play that brings no video for this long is started again."""


def tone_hz(k: int) -> float:
    """The tone's frequency in second 2k: 400-1900 Hz in steps of 100, naming k mod 16."""
    return 400.0 + 100.0 * (k % 16)


def tone(first_sample: int, count: int) -> np.ndarray:
    """Samples `first_sample` ... of the source audio, float in [-1, 1]."""
    t = (first_sample + np.arange(count)) / RATE
    sec = np.floor(t).astype(np.int64)
    hz = 400.0 + 100.0 * ((sec // 2) % 16)
    return (LEVEL * (sec % 2 == 0) * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def stamp16(img: np.ndarray, n: int) -> None:
    """Frame number n (mod 65536) in the top-left corner: low byte in the first row of blocks, high
    byte in the second."""
    stamp(img, n & 0xFF, CELL)
    stamp(img[CELL:], (n >> 8) & 0xFF, CELL)


def read_stamp16(img: np.ndarray) -> int:
    return read_stamp(img, CELL) | (read_stamp(img[CELL:], CELL) << 8)


def source_picture(size: tuple[int, int]) -> np.ndarray:
    """The picture every frame shows (a face, so that the swap has work), before its stamp."""
    from swapstream.demo import grace_hopper, render_target_frame

    return render_target_frame(grace_hopper(), 0.0, size)


def publish(url: str, t0: float, *, fps: int = 10, size: tuple[int, int] = (320, 240),
            seconds: float | None = None, jump_at: float | None = None, jump_by: float = 0.0,
            stop: threading.Event | None = None) -> int:
    """Publish the source clock to `url` in real time from now (frames due before now are not sent:
    they passed while no publisher was up) until `seconds` have passed or `stop`; returns frames
    sent. Container timestamps start at 0 for this connection."""
    picture = source_picture(size)
    start = time.time()
    n0 = max(0, math.ceil((start - t0) * fps))
    s0 = round(n0 * RATE / fps)  # the audio sample due with frame n0
    c = av.open(url, "w", format="flv", timeout=5.0)
    v = c.add_stream("libx264", rate=fps)
    v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
    v.options = {"preset": "ultrafast", "tune": "zerolatency", "g": str(fps), "bf": "0", "crf": "20"}
    a = c.add_stream("aac", rate=RATE)
    a.layout = "mono"
    print("publishing", flush=True)  # connected: a supervisor times the fault's end by this line
    jumped = Fraction(0)
    n, s = n0, s0
    try:
        while stop is None or not stop.is_set():
            due = t0 + n / fps
            if seconds is not None and due - start > seconds:
                break
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            if jump_at is not None and not jumped and (n - n0) / fps >= jump_at:
                jumped = Fraction(jump_by).limit_denominator(1000)
            img = picture.copy()
            stamp16(img, n)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = int((n - n0) + jumped * fps)
            f.time_base = Fraction(1, fps)
            for p in v.encode(f):
                c.mux(p)
            # The audio up to this frame's end.
            while s < (n + 1) * RATE / fps:
                af = av.AudioFrame.from_ndarray(tone(s, SAMPLES)[None], format="fltp", layout="mono")
                af.sample_rate = RATE
                af.pts = int((s - s0) + jumped * RATE)
                af.time_base = Fraction(1, RATE)
                for p in a.encode(af):
                    c.mux(p)
                s += SAMPLES
            n += 1
    finally:
        try:
            c.close()
        except (av.error.FFmpegError, OSError):
            pass
    return n - n0


@dataclass
class Session:
    """One pull of the output, from connect to drop."""

    video: list[tuple[int, float, float]] = field(default_factory=list)
    """(frame number as stamped, pts in seconds, arrival wall time)."""
    audio: list[tuple[np.ndarray, float]] = field(default_factory=list)
    """(mono samples, pts in seconds of the first)."""


class Receiver:
    """Pulls `url` in a thread until `stop()`, reconnecting; one `Session` per connection."""

    def __init__(self, url: str, *, keep_seconds: float | None = None) -> None:
        self.url = url
        self.keep_seconds = keep_seconds
        """Keep only what arrived in this many last seconds (a long soak would fill the memory)."""
        self.sessions: list[Session] = []
        self.reopens = 0
        """Plays given up for bringing no video within `NO_VIDEO_S`."""
        self.errors: list[str] = []
        """What ended each session: a timeout when the output paused, a reset when it dropped."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="avsync-receiver", daemon=True)
        self.lock = threading.Lock()

    def start(self) -> "Receiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # A short probe (the frames it reads come out late, in a burst), and a read timeout
                # longer than the outages measured, as a player rides them out.
                c = av.open(self.url, options={"rtmp_live": "live", "fflags": "nobuffer",
                                               "analyzeduration": "500000", "probesize": "200000"},
                            timeout=(5.0, 10.0))
            except (av.error.FFmpegError, OSError):
                self._stop.wait(0.3)
                continue
            session = Session()
            opened = time.time()
            with self.lock:
                self.sessions.append(session)
            try:
                # Every stream, including one that appears after the probe (FLV adds streams as
                # their first packets come: a probe that saw only video would lose the audio).
                for packet in c.demux():
                    if not session.video and time.time() - opened > NO_VIDEO_S:
                        # A viewer that joined a running nginx-rtmp stream sometimes gets no video
                        # at all from that play (seen with ffprobe too); a new play does.
                        self.reopens += 1
                        break
                    if packet.stream.type not in ("video", "audio"):
                        continue
                    if self._stop.is_set():
                        break
                    for fr in packet.decode():
                        if fr.pts is None:
                            continue
                        t = float(fr.pts * fr.time_base)
                        if isinstance(fr, av.VideoFrame):
                            n = read_stamp16(fr.to_ndarray(format="rgb24"))
                            with self.lock:
                                session.video.append((n, t, time.time()))
                                self._trim(session)
                        else:
                            x = fr.to_ndarray().astype(np.float32)
                            mono = x.reshape(-1) if x.shape[0] == 1 else x.mean(axis=0)
                            with self.lock:
                                session.audio.append((mono, t))
            except Exception as e:  # noqa: BLE001  (a receiver that dies silently measures nothing)
                self.errors.append(repr(e))
            finally:
                c.close()

    def _trim(self, session: Session) -> None:
        """Drop what is older than `keep_seconds` (in batches: a list's front is costly to cut)."""
        if self.keep_seconds is None or len(session.video) % 100:
            return
        cut = time.time() - self.keep_seconds
        old = [i for i, v in enumerate(session.video) if v[2] < cut]
        if old:
            oldest_pts = session.video[old[-1]][1]
            del session.video[:old[-1] + 1]
            session.audio[:] = [a for a in session.audio if a[1] >= oldest_pts]

    def snapshot(self) -> list[Session]:
        with self.lock:
            return [Session(list(s.video), list(s.audio)) for s in self.sessions]

    def snapshot_indexed(self) -> list[tuple[int, Session]]:
        """(index of the session since the start, a copy of it), for sessions that still hold data."""
        with self.lock:
            return [(i, Session(list(s.video), list(s.audio))) for i, s in enumerate(self.sessions)
                    if s.video or s.audio]


def unwrap16(n: int, near: float) -> int:
    """The frame number ≡ n (mod 65536) nearest to `near`."""
    return n + 65536 * round((near - n) / 65536)


TONE_HELD_S = 0.96
"""How long a tone must sound on after an onset for the onset to count. A source tone lasts 1 s; a
splice into a tone less than 40 ms (the skew bound) after it began can pass, and misplaces the onset
by less than that."""


def _held_tone(audio: list[tuple[np.ndarray, float]], i: int, first: int) -> np.ndarray | None:
    """The samples of the tone that starts at sample `first` of packet `i`, up to TONE_HELD_S, if it
    sounds on that long: loud samples in every 0.1 s of it and in its last 5 ms. Where a gap in the
    audio (a timestamp jump's seam) or the end of the recording comes first, the tone's length is
    unknown: it counts if it sounded on until then, for at least the 0.2 s whose frequency names it.
    None: not a held tone."""
    want = int(TONE_HELD_S * RATE)
    parts = [audio[i][0][first:]]
    n = parts[0].size
    t_end = audio[i][1] + audio[i][0].size / RATE
    for x, t in audio[i + 1:]:
        if n >= want or abs(t - t_end) > 0.05:
            break  # long enough, or a gap
        parts.append(x)
        n += x.size
        t_end = t + x.size / RATE
    y = np.concatenate(parts)[:want]
    loud = np.abs(y) > 0.5 * LEVEL
    step = RATE // 10
    if not all(np.any(loud[k:k + step]) for k in range(0, y.size, step)):
        return None
    if y.size < want:  # cut short by a gap or the end
        return y if y.size >= RATE // 5 else None
    return y if np.any(loud[-RATE // 200:]) else None


def onsets(audio: list[tuple[np.ndarray, float]]) -> list[tuple[float, int]]:
    """(pts, k mod 16) of every tone onset: the first sample above half the tone's level after at
    least 0.3 s of silence, with the tone's frequency over the 0.2 s after it, and the tone sounding
    on for TONE_HELD_S. A gap in the audio (an outage) is not silence: an onset right after one is
    not counted. Nor is a splice: a reconnect's output audio goes on without a gap from the last
    connection's silence into the new one's tone, caught mid-second, which looks like an onset but
    does not last the tone's second (seen in CI: the old publisher stopped 0.4 s into a silent second,
    the new audio began 20 ms before its tone ended, an "onset" 4.6 s off its video)."""
    out: list[tuple[float, int]] = []
    quiet_since: float | None = None
    end: float | None = None
    for i, (x, t) in enumerate(audio):
        if end is not None and abs(t - end) > 0.05:
            quiet_since = None  # a gap: what happened in it is unknown
        end = t + x.size / RATE
        loud = np.flatnonzero(np.abs(x) > 0.5 * LEVEL)
        if not loud.size:
            if quiet_since is None:
                quiet_since = t
            continue
        at = t + loud[0] / RATE
        tone = _held_tone(audio, i, int(loud[0])) if quiet_since is not None and at - quiet_since >= 0.3 else None
        if tone is not None:
            tail = tone[:RATE // 5]  # a held tone has at least 0.2 s
            spectrum = np.abs(np.fft.rfft(tail * np.hanning(tail.size)))
            hz = float(np.fft.rfftfreq(tail.size, 1 / RATE)[int(np.argmax(spectrum[1:])) + 1])
            out.append((at, round((hz - 400.0) / 100.0) % 16))
        # Quiet from the last loud sample on, if the frame ends with more than 10 ms of it.
        quiet_since = t + (loud[-1] + 1) / RATE if loud[-1] < x.size - RATE // 100 else None
    return out


SEAM_S = 0.5
"""Change in a video frame's output-minus-source time, from one frame to the next, that marks a
seam: an outage that the output's timeline closed (within an epoch it does not change at all)."""


def skews(session: Session, fps: int, t0: float) -> list[tuple[float, float, float]]:
    """(output pts, source time, audio minus video in seconds) at each tone onset of a session: the onset's
    source second set against the source times of the video frames within 1 s of it on the output
    timeline. Positive: the audio comes late."""
    if not session.video:
        return []
    vt = np.array([t for _, t, _ in session.video])

    def video_offset(i: int) -> float:
        """Output time minus source time of video frame i: constant within an epoch."""
        n16, t, arrived = session.video[i]
        return t - unwrap16(n16, (arrived - t0) * fps) / fps

    out = []
    for at, code in onsets(session.audio):
        near = np.flatnonzero(np.abs(vt - at) <= 1.0)
        if near.size < 3:
            continue
        # The frame on screen when the onset plays: the last one at or before it (else the first
        # after). Not a median over both sides: across a reconnect's seam the frames before and
        # after it have source times an outage apart.
        before = near[vt[near] <= at]
        after = near[vt[near] > at]
        i = int(before[-1]) if before.size else int(near[0])
        if before.size and after.size and abs(video_offset(int(after[0])) - video_offset(i)) > SEAM_S:
            # The onset falls in a gap of the video that spans a seam (the output's first frames
            # after an outage came later than its audio): which side's picture it goes with is not
            # in the output. A real misalignment across the seam shows at the onsets after it.
            continue
        video_offset_i = video_offset(i)
        source = at - video_offset_i  # the onset's source time, if A and V were in step
        k = round(source / 2)
        k += ((code - k) % 16 + 8) % 16 - 8  # the nearest k with the onset's code
        out.append((at, float(2 * k), (at - 2 * k) - video_offset_i))
    return out


def describe(receiver: Receiver, t0: float, marks: dict[str, float]) -> dict[str, object]:
    """What a receiver got, in seconds since `t0`: each session's video and audio counts, first and
    last arrival and pts, and its tone onsets; the plays given up for no video; what ended each
    session; and the test's own `marks`. For the message of a failed assertion."""
    out: list[dict[str, object]] = []
    with receiver.lock:
        sessions = [Session(list(s.video), list(s.audio)) for s in receiver.sessions]
    for s in sessions:
        info: dict[str, object] = {"video": len(s.video), "audio": len(s.audio)}
        if s.video:
            info["arrived"] = (round(s.video[0][2] - t0, 2), round(s.video[-1][2] - t0, 2))
            info["video_pts"] = (round(s.video[0][1], 2), round(s.video[-1][1], 2))
        if s.audio:
            info["audio_pts"] = (round(s.audio[0][1], 2), round(s.audio[-1][1], 2))
            info["onsets"] = [round(at, 2) for at, _code in onsets(s.audio)]
        out.append(info)
    return {"sessions": out, "reopens": receiver.reopens, "errors": receiver.errors[-5:],
            "marks": {k: round(v - t0, 2) for k, v in marks.items()}}


def latencies(session: Session, fps: int, t0: float) -> list[tuple[float, float]]:
    """(arrival wall time, arrival minus due time) of each video frame of a session."""
    out = []
    for n16, _t, arrived in session.video:
        n = unwrap16(n16, (arrived - t0) * fps)
        out.append((arrived, arrived - (t0 + n / fps)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish", help="publish the source clock to an RTMP URL until killed")
    p.add_argument("url")
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--seconds", type=float)
    p.add_argument("--jump-at", type=float)
    p.add_argument("--jump-by", type=float, default=0.0)
    args = ap.parse_args(argv)
    try:
        publish(args.url, args.t0, fps=args.fps, seconds=args.seconds, jump_at=args.jump_at,
                jump_by=args.jump_by)
    except (av.error.FFmpegError, OSError) as e:
        print(f"publisher: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
