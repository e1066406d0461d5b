"""How often the watermark detector misses a freshly marked frame of dense random texture.

    python tools/watermark_texture.py [--frames 600] [--size 1920x1080] [--magnify 16]

Each frame is uniform random RGB at 1/MAGNIFY of the size, magnified with bicubic interpolation:
every block of the mark's grid is then busy at the chips' own DCT frequencies, the detector's worst
case. The frame is marked (CPU reference, which the GPU kernel equals bit for bit) and detected
with no encoding in between. Seeds are 0..FRAMES-1, so the count is reproducible.
"""

from __future__ import annotations

import argparse
import sys

import cv2
import numpy as np

from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker, detect, luma_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--size", default="1920x1080", help="WxH")
    ap.add_argument("--magnify", type=int, default=16)
    args = ap.parse_args()
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        sys.exit(f"error: --size {args.size}: give WIDTHxHEIGHT, e.g. 1920x1080")
    if args.frames < 1 or args.magnify < 1 or w < 320 or h < 180:
        sys.exit(f"error: --frames {args.frames} --magnify {args.magnify} --size {args.size}: "
                 "--frames and --magnify must be at least 1, --size at least 320x180")
    missed: list[tuple[int, float, str]] = []
    scores: list[float] = []
    for seed in range(args.frames):
        rng = np.random.default_rng(seed)
        wm = Watermarker(Payload(PRODUCT_SWAPSTREAM, int(rng.integers(0, 2 ** 32))))
        small = rng.integers(0, 256, (max(1, h // args.magnify), max(1, w // args.magnify), 3), dtype=np.uint8)
        frame = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
        wm.embed(frame)
        d = detect(luma_of(frame))
        scores.append(d.score)
        if not (d.found and d.payload == wm.payload):
            missed.append((seed, round(d.score, 3), d.reason))
        if (seed + 1) % 100 == 0:
            print(f"{seed + 1}/{args.frames} frames, {len(missed)} missed", file=sys.stderr)
    print(f"{w}x{h}, magnified {args.magnify}x: {len(missed)} of {args.frames} marked frames missed "
          f"({100 * len(missed) / args.frames:.1f}%), scores min {min(scores):.3f} median {float(np.median(scores)):.3f}")
    for seed, score, reason in missed:
        print(f"  seed {seed}: score {score}, {reason}")


if __name__ == "__main__":
    main()
