"""Where one stream frame's GPU time goes in the many-stream loop (issue 7): each stage's own GPU time.

    python tools/bench_frame_gpu.py --clip720 C720.mp4 --clip1080 C1080.mp4 --out DIR [--reps 20]
    (on the GPU machine; the clips are bench_streams.py's, whose first frame is the test frame)

Each stage of `tools/bench_streams.py`'s worker, run alone in this process on a quiet GPU, is timed
on the GPU's own clock without its host launch cost: the stream is first held by a spin kernel
(0.3 s by default, `--spin-ms`), `reps` calls of the stage are queued behind it, and the time between events recorded
after the spin and after the last call, divided by `reps`, is the stage's GPU time per call. (Timed
the usual way, between events around each call, a stage made of small kernels measures its host
launch pace instead.) Stages that wait for a result on the host cannot be queued like that; the
detector is one, and is timed per call, host included, and marked so.

32 streams at 30 fps leave 1/960 s = 1.04 ms of GPU per frame, all stages together: the table
sums them per frame for the loop's batch sizes.

Writes frame_gpu.json and frame_gpu.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_streams import worker_stages  # noqa: E402
from benchlib import gpu_name, median_ms, run_fields  # noqa: E402

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def gpu_ms(cp: Any, spin: Any, fn: Callable[[], Any], stream: Any, reps: int, spin_cycles: int) -> tuple[float, str]:
    """Milliseconds per call of `fn` on `stream` and how they were timed: the GPU's own time, the
    launches hidden behind `spin` (the SPIN kernel); or, when `fn` waits on the host (so the calls
    cannot be queued behind the spin), between events around each call, host included."""
    for _ in range(3):
        fn()
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(5):
        with stream:
            spin((1,), (1,), (np.int64(spin_cycles),))
            start.record(stream)
            for _ in range(reps):
                fn()
            stop.record(stream)
        # The launches must all be queued before the spin ends, or the host's pace shows again.
        queued_before_spin_end = not start.done
        stop.synchronize()
        if not queued_before_spin_end:
            return median_ms(cp, fn, stream, warm=0), "per call, host included (it waits on the host)"
        times.append(cp.cuda.get_elapsed_time(start, stop) / reps)
    return float(np.median(times)), "GPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip720", type=Path, required=True)
    ap.add_argument("--clip1080", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--spin-ms", type=float, default=300.0)
    ap.add_argument("--compiled", action="store_true",
                    help="also time the detector and landmark model with landmarks.compile (torch.compile)")
    args = ap.parse_args()
    import cupy as cp
    import cv2

    from swapstream.face.facemesh import roi_from_landmarks
    from swapstream.kernels.nv12 import nv12_to_rgb, rgb_to_nv12

    # The stream benchmark's worker stages, so that each stage here is the one it runs.
    st = worker_stages(Path(tempfile.mkdtemp()), [])
    cfg, swapper, analyser, disclosure, identity = st.cfg, st.swapper, st.analyser, st.disclosure, st.identity
    clock_khz = cp.cuda.Device().attributes["ClockRate"]
    spin_cycles = int(args.spin_ms * clock_khz)
    stream = cp.cuda.Stream(non_blocking=True)
    rows: list[dict[str, Any]] = []
    compiled: Any = None
    if args.compiled:
        from swapstream.gpu.analyser import GpuFaceAnalyser

        ccfg = cfg.model_copy(deep=True)
        ccfg.landmarks.compile = True
        compiled = GpuFaceAnalyser(ccfg, mesh_batch=16)
        t0 = time.perf_counter()
        print(f"compiled and captured {compiled.prepare()} in {time.perf_counter() - t0:.1f} s", flush=True)

    def add(key: str, stage: str, res: str, per: str, timed: tuple[float, str]) -> None:
        ms, how = timed
        rows.append({"key": key, "stage": stage, "res": res, "per": per, "ms": round(ms, 4), "how": how})
        print(f"{res} {stage} ({per}): {ms:.4f} ms [{how}]", flush=True)

    spin = cp.RawKernel(SPIN, "spin")

    def timed(fn: Callable[[], Any]) -> tuple[float, str]:
        return gpu_ms(cp, spin, fn, stream, args.reps, spin_cycles)

    for res, clip in (("720p", args.clip720), ("1080p", args.clip1080)):
        # The first frame of the stream benchmark's clip: its face has a stream's size.
        cap = cv2.VideoCapture(str(clip))
        ok, bgr = cap.read()
        cap.release()
        if not ok:
            sys.exit(f"error: cannot read a frame from {clip}: pass the clips tools/make_bench_clips.py makes")
        host = np.ascontiguousarray(bgr[:, :, ::-1])
        h, w = host.shape[:2]
        frame = cp.asarray(host)
        faces = analyser.analyse_image(host)
        if not faces:
            sys.exit(f"error: no face found in the first frame of {clip}")
        f0 = faces[0]
        nv12 = cp.asarray(np.random.default_rng(0).integers(0, 256, (h * 3 // 2, w), dtype=np.uint8))
        rgb = cp.empty((h, w, 3), cp.uint8)
        with stream:
            add("nv12_rgb", "NV12 -> RGB (decode's copy to the RGB slot)", res, "frame",
                timed(lambda: nv12_to_rgb(nv12[:h], nv12[h:], rgb)))
            roi = roi_from_landmarks(f0.landmarks, cfg.landmarks.roi_scale)
            mesh = analyser._mesh
            for k in (1, 4, 8, 16):
                add(f"landmarks{k}", f"landmarks, {k} faces in one call (crop + model + copy out)", res,
                    f"call of {k}", timed(lambda k=k: mesh.start_frames([(frame, [roi])] * k)))
            if compiled is not None:
                for k in (1, 4, 8, 16):
                    add(f"landmarks{k}_c", f"landmarks, {k} faces in one call, compiled", res, f"call of {k}",
                        timed(lambda k=k: compiled._mesh.start_frames([(frame, [roi])] * k)))
            for b in (1, 2, 4):
                work = [frame.copy() for _ in range(b)]
                add(f"swap{b}", f"swap, {b} faces in one call (align, crop, model, paste)", res, f"call of {b}",
                    timed(lambda work=work: swapper.swap_many([(x, f0) for x in work], [identity] * len(work))))
            add("mark", "label + watermark", res, "frame", timed(lambda: disclosure.apply(frame, True)))
            y, uv = cp.empty((h, w), cp.uint8), cp.empty((h // 2, w), cp.uint8)
            add("rgb_nv12", "RGB -> NV12", res, "frame", timed(lambda: rgb_to_nv12(frame, y, uv)))
            tracker = analyser.tracker()
            add("detect", "detection (short-range BlazeFace, with its host decode)", res, "call",
                timed(lambda: tracker.detect(frame)))
            if compiled is not None:
                ftracker = compiled.tracker()
                add("detect_c", "detection, compiled (with its host decode)", res, "call",
                    timed(lambda: ftracker.detect(frame)))
    summary = per_frame(rows, cfg.detector.detect_every)
    out = {"rows": rows, "per_frame": summary,
           **run_fields(gpu_name(), f"python tools/bench_frame_gpu.py --clip720 {args.clip720} --clip1080 {args.clip1080} --reps {args.reps} --spin-ms {args.spin_ms}"
                                    + (" --compiled" if args.compiled else ""))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frame_gpu.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"# GPU time per stage of a stream frame ({out['device']})", "",
             f"`{out['command']}`, commit {out['commit']}, {out['date']}. Each stage alone on a quiet GPU, "
             "its launches queued behind a spin kernel: the GPU's own time, without host launch cost.", "",
             "| res | stage | per | ms | how |", "|---|---|---|---|---|"]
    lines += [f"| {r['res']} | {r['stage']} | {r['per']} | {r['ms']:.4f} | {r['how']} |" for r in rows]
    lines += ["", f"Per frame, one face, detection every {cfg.detector.detect_every}th frame (the live preset; its "
              "time includes its host decode), landmarks in calls of k faces and swaps in calls of b "
              "(ms; 32 streams at 30 fps leave 1.04 ms):", "",
              "| res | detector and landmarks | landmarks k | swap b | ms per frame |", "|---|---|---|---|---|"]
    lines += [f"| {s['res']} | {s['nets']} | {s['k']} | {s['b']} | {s['ms']:.3f} |" for s in summary]
    (args.out / "frame_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def per_frame(rows: list[dict[str, Any]], detect_every: int) -> list[dict[str, Any]]:
    """Sums of the stages per frame for a few landmark and swap batch sizes, with detection on the
    preset's cadence (its figure includes its host decode: an upper bound of its GPU share)."""
    out = []
    for res in ("720p", "1080p"):
        r = {x["key"]: x["ms"] for x in rows if x["res"] == res}
        for nets, sfx in (("plain", ""), ("compiled", "_c")):
            if f"detect{sfx}" not in r:
                continue
            fixed = r["nv12_rgb"] + r["mark"] + r["rgb_nv12"] + r[f"detect{sfx}"] / detect_every
            for k in (1, 4, 16):
                for b in (1, 4):
                    ms = fixed + r[f"landmarks{k}{sfx}"] / k + r[f"swap{b}"] / b
                    out.append({"res": res, "nets": nets, "k": k, "b": b, "ms": round(ms, 4)})
    return out


if __name__ == "__main__":
    main()
