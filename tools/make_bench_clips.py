"""Make the clips the GPU benchmarks read from .bench/ (ignored by git, carried to the GPU machine).

    python tools/make_bench_clips.py [--out .bench]

Writes streams_720p30.mp4 and streams_1080p30.mp4: 12 s of the demo's animated target (one face,
Grace Hopper's portrait moving and zooming) at 30 fps, H.264 without B-frames (so NVDEC's
low-latency mode can decode them as a live stream would arrive) at CRF 30 (small enough to carry:
about 1 and 2 MB), with the AAC tone. Needs PyAV and the ffmpeg tool, so it runs here, not on the
GPU machine.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from swapstream.demo import grace_hopper, write_demo_clip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".bench"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for w, h in ((1280, 720), (1920, 1080)):
            raw = Path(tmp) / f"s{h}.mp4"
            write_demo_clip(raw, grace_hopper(), seconds=12, fps=30, size=(w, h))
            dst = args.out / f"streams_{h}p30.mp4"
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(raw), "-c:v", "libx264", "-preset",
                            "veryfast", "-crf", "30", "-bf", "0", "-c:a", "copy", str(dst)], check=True)
            print(f"{dst}: {dst.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
