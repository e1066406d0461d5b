"""How long the RTMP hops take without the live job: a diagnostic for the developers.

    python tools/profile_rtmp_hops.py [--size 1280x720] [--fps 30] [--seconds 6]

A PyAV publisher (x264 `ultrafast` + `zerolatency`, a keyframe a second, AAC, as `bench_live.py`
publishes) pushes stamped frames to a real nginx-rtmp, through SwapStream's `SplicedFlv` (each
packet as it is encoded) or, with `--publisher interleaved`, through FFmpeg's FLV muxer, whose
interleaving holds each frame until later audio is encoded (one frame interval at 30 fps: the AAC
encoder's output lags its input by more than a frame); a reader pulls them as the live job and the
benchmark's player do. Prints, per frame, the time from the hand-over to the publisher's encoder to
(1) the packet's demuxing and (2) the decoded frame's stamp being read, the player's whole work.
What `bench_live.py`'s RTMP round trip adds beyond two of these is the live job's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import av  # noqa: E402
import numpy as np  # noqa: E402
from av.video.frame import PictureType  # noqa: E402

from swapstream.live.flv import SplicedFlv  # noqa: E402
from swapstream.live.nginx import NginxRtmp  # noqa: E402
from swapstream.live.streams import rtmp_input_options, x264_live_options  # noqa: E402
from tests.helpers.stamps import read_stamp, stamp  # noqa: E402

RATE = 48000


def publish(url: str, size: tuple[int, int], fps: float, sent: dict[int, float], stop: threading.Event,
            interleaved: bool = False) -> None:
    rng = np.random.default_rng(1)
    backdrop = np.kron(rng.integers(0, 256, (size[1] // 16, size[0] // 16, 3), np.uint8),
                       np.ones((16, 16, 1), np.uint8))
    c = av.open(url, "w", format="flv", timeout=5.0) if interleaved else SplicedFlv(url, timeout=5.0)
    try:
        v = c.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
        v.time_base = Fraction(1, 1000)
        v.options = x264_live_options(fps)
        a = c.add_stream("aac", rate=RATE)
        a.layout = "mono"
        t0, samples, n = time.monotonic(), 0, 0
        while not stop.is_set():
            time.sleep(max(0.0, t0 + n / fps - time.monotonic()))
            img = np.roll(backdrop, 4 * n, axis=1)
            stamp(img, n % 256)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = round(n * 1000 / fps), Fraction(1, 1000)
            if n % max(1, round(fps)) == 0:
                f.pict_type = PictureType.I
            sent[n] = time.monotonic()
            c.mux(v.encode(f))
            while samples < (n + 1) * RATE / fps:
                af = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                af.sample_rate, af.pts, af.time_base = RATE, samples, Fraction(1, RATE)
                c.mux(a.encode(af))
                samples += 1024
            n += 1
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--decoder", default="", help="player decoder settings to try: threads=N, low_delay")
    ap.add_argument("--publisher", choices=("spliced", "interleaved"), default="spliced")
    args = ap.parse_args()
    size = tuple(int(x) for x in args.size.split("x"))
    for what in ("demux", "decode"):
        sent: dict[int, float] = {}
        stop = threading.Event()
        lat: list[float] = []
        with tempfile.TemporaryDirectory() as tmp, NginxRtmp(Path(tmp) / "nginx") as nginx:
            pub = threading.Thread(target=publish, args=(nginx.url("in"), size, args.fps, sent, stop,
                                                         args.publisher == "interleaved"))
            pub.start()
            time.sleep(1.0)
            with av.open(nginx.url("in"), options=rtmp_input_options(), timeout=(5, 3)) as c:
                t0 = time.monotonic()
                v = c.streams.video[0]
                for opt in filter(None, args.decoder.split(",")):
                    if opt == "low_delay":
                        v.codec_context.flags |= av.codec.context.Flags.low_delay
                    elif opt.startswith("threads="):
                        v.codec_context.thread_count = int(opt.split("=")[1])
                    elif opt.startswith("type="):
                        v.codec_context.thread_type = opt.split("=")[1]
                for p in c.demux(v):
                    if p.pts is None:
                        continue
                    if what == "demux":
                        n = round(float(p.pts * p.time_base) * args.fps)
                        now = time.monotonic()
                        if n in sent:
                            lat.append((now - sent[n]) * 1e3)
                    else:
                        for f in p.decode():
                            n8 = read_stamp(f.to_ndarray(format="rgb24"))
                            now = time.monotonic()
                            cand = [k for k in sent if k % 256 == n8 and sent[k] <= now]
                            if cand:
                                lat.append((now - sent[max(cand)]) * 1e3)
                    if time.monotonic() - t0 > args.seconds:
                        break
            stop.set()
            pub.join()
        lat = lat[len(lat) // 5:]  # the join's first second out
        print(f"{args.publisher} publisher -> nginx-rtmp -> {what} at {args.size} {args.fps:g} fps: p50 "
              f"{statistics.median(lat):.1f} ms, p90 {np.percentile(lat, 90):.1f}, max {max(lat):.1f} "
              f"({len(lat)} frames)", flush=True)


if __name__ == "__main__":
    main()
