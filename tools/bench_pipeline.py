"""File-mode pipeline benchmark (issue 5): the host-bound peer-style path against our GPU path.

    python tools/bench_pipeline.py --clip CLIP.mp4 --out DIR [--frames 500] [--decode auto|nvdec|cpu]
    (on the GPU machine, through tools/device_check.sh pipeline)

On one 1080p H.264 clip with one face, in one run, each variant in its own process (so that one
variant's caching allocators and compiled kernels do not count against the next one's memory):
1. `peer`: what FaceFusion / Deep-Live-Cam do per frame. OpenCV decodes to host memory; the face
   networks get host frames (each call copies its input up and its output down); the face is cut out
   with cv2.warpAffine, the model runs at batch 1 with host copies, and the result is pasted back
   with full-frame cv2.warpAffine of the face and of its mask and a NumPy blend.
2. `ours_mesh`: our GPU path (stream/gpu/loop.py) with the built-in mesh swapper.
3. `ours_neural`: the same path with the full-size inswapper-architecture model (random weights:
   speed and memory are those of the real model; the output is not a likeness).
Ours include the invisible watermark that every output frame gets (stream/disclosure.py); the peer
path has none, as the peers have none.
In the GPU variants frames are decoded by NVDEC into GPU memory when PyNvVideoCodec is importable,
otherwise by OpenCV on the host and uploaded through pinned memory (`decode` in the results says
which). Latency is measured from the decoded frame to the encoder-ready frame (NV12 in GPU memory for
ours, the blended RGB host frame for the peer), with CUDA events on the GPU clock for ours and the
host clock for the peer; p50 and p99 per stage and end to end. fps is the whole file-mode loop with
encoding excluded (frames go to a null sink). Peak GPU memory is the device's used memory (NVML's
view, cudaMemGetInfo) above what it was before the variant's process started, so it includes the
CUDA context. x264 at 1080p is timed separately when PyAV is installed.

Writes pipeline.json, pipeline.md and pipeline.png into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from benchlib import gpu_name, run_fields  # noqa: E402
VARIANTS = ("peer", "ours_mesh", "ours_neural")
TARGETS = {"p99_ms": 8.0, "fps": 250.0, "gpu_gb": 3.0}
WARMUP = 30
"""Frames processed before measuring: CUDA graph captures and torch.compile happen in these."""


# -- helpers ------------------------------------------------------------------------------------

def pcts(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "mean": round(float(a.mean()), 3), "max": round(float(a.max()), 3)}


def device_used_bytes() -> int:
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


def cv2_frames(clip: Path, limit: int) -> Any:
    """RGB host frames from OpenCV's FFmpeg decoder, with their index."""
    import cv2

    cap = cv2.VideoCapture(str(clip))
    if not cap.isOpened():
        raise SystemExit(f"OpenCV cannot open {clip}")
    i = 0
    try:
        while i < limit:
            ok, bgr = cap.read()
            if not ok:
                break
            yield i, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            i += 1
    finally:
        cap.release()


def neural_config(models: Path, max_batch: int = 1, overrides: list[str] | None = None) -> Any:
    """A config for the full-size inswapper architecture (random weights) in a private models folder.
    `max_batch`: faces per model call (1 for one stream's latency; the multi-stream bench batches 4);
    `overrides`: more KEY=VALUE settings on top of the `live` preset."""
    from swapstream.config import load_config

    write_synthetic_models(models)
    return load_config("live", [f"models_dir={models}", "swapper=inswapper_128", "neural.download=false",
                                "neural.runner=auto", f"neural.max_batch={max_batch}", *(overrides or [])])


def write_synthetic_models(models: Path, face_stack: bool = False) -> None:
    """The built-in face models and the full-size inswapper architecture with random weights (and
    an arcface stand-in), with their hash files, in `models`: what the neural benchmarks run. With
    `face_stack`, also the XSeg occluder and the GFPGAN v1.4 enhancer in their real architectures
    (tools/make_face_models.py, random weights)."""
    sys.path.insert(0, str(TOOLS))
    import make_test_models as tm

    from swapstream.engines.builtin import BUILTIN_MODELS, builtin_model_path
    from swapstream.engines.zoo import crc32_file

    models.mkdir(parents=True, exist_ok=True)
    for name in BUILTIN_MODELS:
        try:
            shutil.copy(builtin_model_path(name), models / name)
        except Exception:  # the full-range detector is not needed on the GPU path
            pass
    built = [("inswapper_128", tm.inswapper(width=128, blocks=6, seed=0)), ("arcface_w600k_r50", tm.arcface_stub(seed=0))]
    if face_stack:
        import make_face_models as fm

        built += [("xseg_1", fm.xseg(seed=0)), ("gfpgan_1.4", fm.gfpgan_1_4(seed=0))]
    for name, model in built:
        path = models / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        (models / f"{name}.hash").write_text(crc32_file(path))


def with_mark(cfg: Any, swap: Any, info: dict[str, Any]) -> Any:
    """The swap followed by what every output frame of ours gets (FileJob.swap_faces): the
    invisible watermark (and the label where configured for files, off by default), on the GPU."""
    from swapstream.disclosure import Disclosure

    disc = Disclosure(cfg, live=False)
    info["mark"] = "on"

    def run(data: Any, faces: list[Any]) -> int:
        n = swap(data, faces)
        if info["mark"] == "on":
            try:
                disc.apply(data, n > 0)
            except Exception as e:  # report it in the results instead of losing the run
                info["mark"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return n

    return run


def build_stages(variant: str, tmp: Path) -> tuple[Any, Any, Any, Any]:
    """(config, analyser, swap function, neural stages or None) for a variant."""
    from swapstream.config import load_config
    from swapstream.demo import astronaut
    from swapstream.gpu.analyser import GpuFaceAnalyser
    from swapstream.swap.mesh import MeshSwapper, source_face

    if variant == "ours_mesh":
        cfg = load_config("live")
        analyser = GpuFaceAnalyser(cfg)
        swapper = MeshSwapper(cfg.mesh, analyser.topology)
        src = astronaut()
        swapper.set_source(src, source_face(analyser.analyse_image(src), "astronaut"))
        return cfg, analyser, swapper.swap, None
    from swapstream.neural.factory import NeuralStages

    cfg = neural_config(tmp / "models")
    stages = NeuralStages(cfg)
    analyser = GpuFaceAnalyser(cfg)
    src = astronaut()
    stages.swapper.set_source(src, source_face(analyser.analyse_image(src), "astronaut"))
    return cfg, analyser, stages.swapper.swap, stages


# -- variants (each runs in a child process) ----------------------------------------------------

def run_peer(clip: Path, frames: int, tmp: Path) -> dict[str, Any]:
    import cv2

    from swapstream.kernels.paste import box_mask_ref
    from swapstream.neural.swapper import align_matrix
    from swapstream.types import Frame

    cfg, analyser, _swap, stages = build_stages("ours_neural", tmp)
    sw = stages.swapper
    c = sw.contract
    runner = sw.runner
    source = sw._source  # the identity vector set above: what the model takes as its second input
    mask = box_mask_ref(np.empty((c.size, c.size), np.float32), blur=sw.blur, padding=(0, 0, 0, 0))
    stages_ms: dict[str, list[float]] = {"analyse": [], "swap": [], "paste": [], "end_to_end": []}
    n = 0
    t0 = time.perf_counter()
    for i, rgb in cv2_frames(clip, frames):
        ta = time.perf_counter()
        faces = analyser.track(Frame(rgb, i, Fraction(1, 25), i))
        tb = time.perf_counter()
        t_paste = 0.0
        for f in faces:
            m = align_matrix(f.kps, c.template, c.size)  # frame -> crop
            crop = cv2.warpAffine(rgb, m[:2], (c.size, c.size), borderMode=cv2.BORDER_REPLICATE)
            blob = ((crop.astype(np.float32) / 255.0 - np.asarray(c.mean, np.float32))
                    / np.asarray(c.std, np.float32)).transpose(2, 0, 1)[None].copy()
            out = runner.infer({c.target_name: blob, c.source_name: source})
            y = next(iter(out.values()))
            y = np.asarray(y.get() if hasattr(y, "get") else y, np.float32)[0].transpose(1, 2, 0)
            if c.output_range == "std_mean":
                y = y * np.asarray(c.std, np.float32) + np.asarray(c.mean, np.float32)
            face = np.clip(y * 255.0, 0, 255).astype(np.uint8)
            tp = time.perf_counter()
            inv = cv2.invertAffineTransform(m[:2])
            h, w = rgb.shape[:2]
            warped = cv2.warpAffine(face, inv, (w, h), borderMode=cv2.BORDER_REPLICATE)
            wmask = cv2.warpAffine(mask, inv, (w, h))[..., None].clip(0, 1)
            rgb[...] = (rgb * (1 - wmask) + warped * wmask).round().astype(np.uint8)
            t_paste += time.perf_counter() - tp
        te = time.perf_counter()
        if i < WARMUP:
            t0 = te
            continue
        stages_ms["analyse"].append((tb - ta) * 1e3)
        stages_ms["swap"].append((te - tb - t_paste) * 1e3)
        stages_ms["paste"].append(t_paste * 1e3)
        stages_ms["end_to_end"].append((te - ta) * 1e3)
        n += 1
    wall = time.perf_counter() - t0
    return {"frames": n, "fps": n / wall, "decode": "opencv (host)", "clock": "host",
            "stages_ms": {k: pcts(v) for k, v in stages_ms.items()}, "e2e_ms": stages_ms["end_to_end"]}


def run_ours(variant: str, clip: Path, frames: int, tmp: Path, decode: str,
             prof: Any = None) -> dict[str, Any]:
    """A GPU variant; `prof` (a cProfile.Profile) is enabled for the measured frames only."""
    import cupy
    import cupyx

    from swapstream.gpu.loop import GpuSwapLoop

    cfg, analyser, swap, stages = build_stages(variant, tmp)
    mark: dict[str, Any] = {}
    swap = with_mark(cfg, swap, mark)
    use_nvdec = False
    if decode in ("auto", "nvdec"):
        from swapstream.gpu.pynvc import nvdec_available

        use_nvdec, why = nvdec_available()
        print(f"NVDEC: {why}", flush=True)
        if decode == "nvdec" and not use_nvdec:
            raise SystemExit(f"NVDEC asked for but unavailable: {why}")
    import cv2

    cap = cv2.VideoCapture(str(clip))
    w, h = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    cap.release()
    loop = GpuSwapLoop(analyser, swap, w, h, timing=True)
    per: dict[str, list[float]] = {"analyse": [], "swap": [], "to_nv12": [], "end_to_end": []}
    host_analyse: list[float] = []
    peak = device_used_bytes()
    pending: deque[Any] = deque()
    faces = 0

    t0 = 0.0

    def finish(item: Any) -> None:
        nonlocal faces, peak, t0
        item.done.synchronize()  # the encoder hand-over
        loop.finished(item)
        if item.index == WARMUP - 1:
            t0 = time.perf_counter()  # CUDA graph captures and torch.compile happen before this
            if prof is not None:
                prof.enable()
        if item.index < WARMUP:
            return
        for k, v in item.stage_ms().items():
            per[k].append(v)
        host_analyse.append(item.host_analyse_s * 1e3)
        faces += item.swapped
        if item.index % 25 == 0:
            peak = max(peak, device_used_bytes())

    n = 0
    decoder_caps: dict[str, Any] = {}
    if use_nvdec:
        from swapstream.gpu.nvdemux import NvdecSource

        # The clip has B-frames: low-latency mode is for live streams without them.
        with NvdecSource(clip, low_latency=False) as src:
            decoder_caps = src.capabilities()
            for fr in src:
                if n >= frames:
                    break
                start = cupy.cuda.Event()
                start.record(fr._stream)
                slot = loop.rgb_slot(fr.index)
                ready = fr.copy_to(slot.buffer)
                pending.append(loop.submit(slot, ready, index=fr.index, pts=fr.pts,
                                           time_base=fr.time_base, start=start))
                n += 1
                while len(pending) > 1:
                    finish(pending.popleft())
            while pending:  # before the decoder's teardown, which is not per-frame work
                finish(pending.popleft())
            wall = time.perf_counter() - t0
    else:
        upload = cupy.cuda.Stream(non_blocking=True)
        pinned = [cupyx.empty_pinned((h, w, 3), np.uint8) for _ in range(3)]
        pin_events: list[Any] = [None] * 3
        for i, rgb in cv2_frames(clip, frames):
            k = i % 3
            if pin_events[k] is not None:
                pin_events[k].synchronize()
            np.copyto(pinned[k], rgb)
            start = cupy.cuda.Event()
            start.record(upload)
            slot = loop.rgb_slot(i)
            slot.buffer.set(pinned[k], stream=upload)
            ready = upload.record()
            pin_events[k] = ready
            pending.append(loop.submit(slot, ready, index=i, pts=i, time_base=Fraction(1, 25), start=start))
            n += 1
            while len(pending) > 1:
                finish(pending.popleft())
    while pending:
        finish(pending.popleft())
    if not use_nvdec:
        wall = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
    peak = max(peak, device_used_bytes())
    if stages is not None:
        stages.close()
    n -= WARMUP
    res = {"frames": n, "fps": n / wall, "faces_swapped": faces, "tracks": len(loop.tracks),
           "decode": "nvdec" if use_nvdec else "opencv (host) + pinned upload", "clock": "cuda events",
           "stages_ms": {k: pcts(v) for k, v in per.items()}, "host_analyse_ms": pcts(host_analyse),
           "e2e_ms": per["end_to_end"], "peak_gpu_bytes_abs": peak, "watermark": mark["mark"]}
    if decoder_caps:
        res["decoder"] = {k: str(v) for k, v in decoder_caps.items()}
    return res


def run_x264(clip: Path, frames: int) -> dict[str, Any]:
    """x264 at 1080p through PyAV, as the GPU job's writer configures it (live preset)."""
    import av

    from swapstream.config import load_config

    enc = load_config("live").encode
    rgb = [f for _, f in cv2_frames(clip, min(frames, 250))]
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        with av.open(str(Path(tmp) / "x.mp4"), "w") as c:
            s = c.add_stream("libx264", rate=25)
            s.width, s.height, s.pix_fmt = rgb[0].shape[1], rgb[0].shape[0], "yuv420p"
            s.options = {"crf": str(enc.crf), "preset": enc.preset}
            if enc.threads:
                s.thread_count = enc.threads
            t0 = time.perf_counter()
            for i, f in enumerate(rgb):
                t = time.perf_counter()
                vf = av.VideoFrame.from_ndarray(f, format="rgb24")
                vf.pts = i
                c.mux(s.encode(vf))
                times.append((time.perf_counter() - t) * 1e3)
            c.mux(s.encode(None))
            wall = time.perf_counter() - t0
    return {"frames": len(rgb), "fps": len(rgb) / wall, "preset": enc.preset, "crf": enc.crf,
            "stages_ms": {"encode_call": pcts(times)}}


# -- parent -------------------------------------------------------------------------------------

def child(args: argparse.Namespace) -> None:
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    with tempfile.TemporaryDirectory() as tmp:
        if args.child == "peer":
            res = run_peer(args.clip, args.frames, Path(tmp))
        elif args.child == "x264":
            res = run_x264(args.clip, args.frames)
        else:
            res = run_ours(args.child, args.clip, args.frames, Path(tmp), args.decode, prof)
    if prof is not None:
        import pstats

        st = pstats.Stats(prof, stream=sys.stderr)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(35)
    print("RESULT " + json.dumps(res), flush=True)


def used_before() -> int:
    """Device memory in use before a variant starts, without making a CUDA context here."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 2**20


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in VARIANTS:
        r = results.get(name)
        if not r or "e2e_ms" not in r:
            continue
        e = np.asarray(r["e2e_ms"])
        a.plot(e, lw=0.7, label=name)
        b.plot(np.sort(e), np.linspace(0, 100, len(e)), label=name)
    a.set(xlabel="frame", ylabel="decoded -> encoder-ready (ms)", yscale="log", title="per-frame latency")
    b.set(xlabel="ms", ylabel="percentile", xscale="log", title="latency CDF")
    b.axvline(TARGETS["p99_ms"], color="k", ls="--", lw=0.8)
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--decode", choices=("auto", "nvdec", "cpu"), default="auto")
    ap.add_argument("--variants", default=",".join(VARIANTS) + ",x264")
    ap.add_argument("--tag", default="", help="suffix for the output file names (e.g. _nvdec)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="cProfile each variant (to stderr)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.out is None:
        ap.error("--out is required")
    results: dict[str, Any] = {}
    for v in args.variants.split(","):
        if v == "x264":
            try:
                import av  # noqa: F401
            except ImportError:
                print("x264: PyAV is not installed here; skipped")
                continue
        base = used_before()
        cmd = [sys.executable, __file__, "--clip", str(args.clip), "--frames", str(args.frames),
               "--decode", args.decode, "--child", v] + (["--profile"] if args.profile else [])
        print(f"== {v}", flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write("\n".join(x[:400] for x in p.stdout.splitlines()[-30:]) + "\n")
        if args.profile:
            sys.stdout.write(p.stderr[-14000:])
        if p.returncode != 0:
            print(f"{v} failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
            results[v] = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
            continue
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
        r = json.loads(line[7:])
        if "peak_gpu_bytes_abs" in r:
            r["peak_gpu_gb"] = round((r.pop("peak_gpu_bytes_abs") - base) / 1e9, 3)
        r["fps"] = round(r["fps"], 1)
        results[v] = r
    write(results, args)


def write(results: dict[str, Any], args: argparse.Namespace) -> None:
    common = run_fields(gpu_name(), f"python tools/bench_pipeline.py --clip CLIP --frames {args.frames} "
                                    f"--decode {args.decode}")
    records = []
    for v, r in results.items():
        if "error" in r:
            records.append({"metric": f"{v}_error", "value": r["error"], **common})
            continue
        records.append({"metric": f"{v}_fps_1080p", "value": r["fps"], "unit": "fps", "stat": "mean",
                        "config": {k: r[k] for k in ("frames", "decode", "faces_swapped", "preset", "crf",
                                                     "watermark") if k in r}, **common})
        for stage, s in r["stages_ms"].items():
            for stat in ("p50", "p99"):
                records.append({"metric": f"{v}_{stage}_ms", "value": s[stat], "unit": "ms", "stat": stat,
                                "config": {"clock": r.get("clock", "host")}, **common})
        if "peak_gpu_gb" in r:
            records.append({"metric": f"{v}_peak_gpu_memory", "value": r["peak_gpu_gb"], "unit": "GB",
                            "stat": "max", **common})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pipeline{args.tag}.json").write_text(json.dumps(records, indent=1) + "\n")
    has_plot = plot(results, args.out / f"pipeline{args.tag}.png")
    lines = [f"# File-mode pipeline, 1080p H.264 clip, one face ({common['device']})", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}. Latency: decoded frame "
             "to encoder-ready frame. fps: the whole loop, encoding excluded.", "",
             "| variant | decode | fps | analyse p50/p99 ms | swap p50/p99 ms | paste or to-NV12 p50/p99 ms "
             "| end to end p50/p99 ms | peak GPU GB |", "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        r = results.get(v)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {v} | failed: {r['error'][:80]} | | | | | | |")
            continue
        s = r["stages_ms"]
        last = s.get("paste", s.get("to_nv12"))
        f = lambda d: f"{d['p50']:.2f} / {d['p99']:.2f}"  # noqa: E731
        lines.append(f"| {v} | {r['decode']} | {r['fps']:.1f} | {f(s['analyse'])} | {f(s['swap'])} | {f(last)} "
                     f"| {f(s['end_to_end'])} | {r.get('peak_gpu_gb', '')} |")
    marks = [f"{v}: {results[v]['watermark']}" for v in VARIANTS
             if v in results and "watermark" in results[v]]
    if marks:
        lines += ["", "Invisible watermark on every swapped frame of ours (the peer path has none): "
                  + "; ".join(marks) + "."]
    if "x264" in results and "error" not in results["x264"]:
        x = results["x264"]
        lines += ["", f"x264 at 1080p (PyAV, preset {x['preset']}, crf {x['crf']}), reported separately: "
                  f"{x['fps']:.1f} fps, encode call p50 {x['stages_ms']['encode_call']['p50']:.2f} ms, "
                  f"p99 {x['stages_ms']['encode_call']['p99']:.2f} ms."]
    n = results.get("ours_neural")
    if n and "error" not in n:
        ok = lambda b: "met" if b else "NOT met"  # noqa: E731
        lines += ["", f"Targets for ours_neural: p99 ≤ {TARGETS['p99_ms']} ms: "
                  f"{n['stages_ms']['end_to_end']['p99']:.2f} ms ({ok(n['stages_ms']['end_to_end']['p99'] <= TARGETS['p99_ms'])}); "
                  f"≥ {TARGETS['fps']:.0f} fps: {n['fps']:.1f} ({ok(n['fps'] >= TARGETS['fps'])}); "
                  f"≤ {TARGETS['gpu_gb']} GB: {n.get('peak_gpu_gb')} ({ok(n.get('peak_gpu_gb', 99) <= TARGETS['gpu_gb'])})."]
    if has_plot:
        lines += ["", f"![latency](pipeline{args.tag}.png)"]
    lines.append("")
    (args.out / f"pipeline{args.tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
