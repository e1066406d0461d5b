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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import av  # noqa: E402
import numpy as np  # noqa: E402

from swapstream.live.nginx import NginxRtmp  # noqa: E402
from swapstream.live.streams import rtmp_input_options  # noqa: E402
from tests.helpers.publisher import publish_rtmp  # noqa: E402
from tests.helpers.stamps import read_stamp, stamp  # noqa: E402



class Blocks:
    """Random 16-pixel blocks scrolling 4 pixels a frame, each frame stamped with its number."""

    def __init__(self, size: tuple[int, int], fps: float) -> None:
        self.size, self.fps = size, fps
        rng = np.random.default_rng(1)
        self._backdrop = np.kron(rng.integers(0, 256, (size[1] // 16, size[0] // 16, 3), np.uint8),
                                 np.ones((16, 16, 1), np.uint8))

    def frame(self, n: int) -> np.ndarray:
        img = np.roll(self._backdrop, 4 * n, axis=1)
        stamp(img, n % 256)
        return img


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
            pub = threading.Thread(target=publish_rtmp, args=(nginx.url("in"), Blocks(size, args.fps), sent, stop),
                                   kwargs={"interleaved": args.publisher == "interleaved"})
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
