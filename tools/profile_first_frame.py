"""Where the first real frame of a warmed-up GPU live swap goes: a diagnostic for the developers.

    python tools/profile_first_frame.py [--size 1280x720] [--config live] [--thread]

Builds the GPU job as `swapstream serve`'s WHIP path does (`GpuFileJob`, live), warms a
`GpuFrameSwap` up as `gpu_whip_hooks` does, then swaps frames of the live benchmark's animated
portrait on a new tracker (a new session), the first under cProfile. Prints the warm-up's faces,
each frame's steps, and the host functions that took the first frame's time. With `--thread` the
session runs in another thread than the warm-up, as the WHIP server's swap thread does.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--config", default="live")
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--thread", action="store_true", help="run the session in a thread of its own")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))

    import av

    from swapstream.config import load_config
    from swapstream.demo import astronaut
    from swapstream.gpu.job import GpuFileJob
    from swapstream.gpu.rtc import GpuFrameSwap
    from tests.helpers.probe import StampedClip

    job = GpuFileJob(load_config(args.config), live=True)
    job.set_source_image(astronaut(), "astronaut")
    warm = GpuFrameSwap(job, job.analyser.tracker())
    faces_seen: list[int] = []
    swap = warm.job.swap_faces

    def counting(data: Any, faces: list[Any]) -> int:
        faces_seen.append(len(faces))
        return swap(data, faces)

    job.swap_faces = counting  # type: ignore[method-assign]  # counts the warm-up's faces
    print(f"warm-up: {warm.warm_up(w, h):.0f} ms, faces per frame {faces_seen}", flush=True)
    job.swap_faces = swap  # type: ignore[method-assign]
    clip = StampedClip(size=(w, h), fps=30)

    def session() -> None:
        s = GpuFrameSwap(job, job.analyser.tracker())
        for n in range(args.frames):
            frame = av.VideoFrame.from_ndarray(clip.frame(n), format="rgb24")
            frame.pts = n
            prof = cProfile.Profile() if n == 0 else None
            t = time.perf_counter()
            if prof is not None:
                prof.enable()
            _picture, swapped = s(frame, n)
            if prof is not None:
                prof.disable()
            print(f"frame {n}: {(time.perf_counter() - t) * 1e3:.1f} ms, {swapped} swapped, steps "
                  f"{ {k: round(v, 1) for k, v in s.steps_ms[-1].items()} }", flush=True)
            if prof is not None:
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
                print(out.getvalue(), flush=True)

    if args.thread:
        t = threading.Thread(target=session, name="swap")
        t.start()
        t.join()
    else:
        session()
    job.close()


if __name__ == "__main__":
    main()
