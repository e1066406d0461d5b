"""File-mode pipeline benchmark (issue 5; since issue 18 it times `swapstream run` itself): the
host-bound peer-style path against the command that users run.

    python tools/bench_pipeline.py --clip CLIP.mp4 --out DIR [--frames 500] [--decode auto|nvdec|cpu]
        [--variants peer,ours_mesh,ours_neural,x264]
    (on the GPU machine, through tools/device_check.sh pipeline)

On one 1080p H.264 clip with one face, in one run, each variant in its own process:
1. `peer`: what FaceFusion / Deep-Live-Cam do per frame. OpenCV decodes to host memory; the face
   networks get host frames (each call copies its input up and its output down); the face is cut out
   with cv2.warpAffine, the model runs at batch 1 with host copies, and the result is pasted back
   with full-frame cv2.warpAffine of the face and of its mask and a NumPy blend. This loop is a model
   of the peers' code, so it lives here; its first WARMUP frames are not timed.
2. `ours_mesh`: `swapstream run -c live -o null:` with the built-in mesh swapper: the command as a
   user runs it, the whole clip, encoding excluded (every frame still labelled and marked). This tool
   holds no loop of ours; the figures are the run's own summary (`tools/bench_run.py`'s reader):
   its fps, its time a frame by stage, and each frame's latency from the decoder to the
   encoder (`JobStats.latency`).
3. `ours_neural`: the same with the full-size inswapper architecture (random weights: speed and
   memory are those of the real model; the output is not a likeness), batched as `run` batches it.
4. `x264`: x264 at 1080p through PyAV as the live preset configures it, timed alone.
The `--decode` choice is `run`'s `decoder` setting (NVDEC where it can decode the clip with `auto`).
Peak GPU memory is the device's used memory (nvidia-smi, polled by this process, which makes no
CUDA context) above what it was before the variant started, so it includes the CUDA context.

Writes pipeline.json and pipeline.md into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
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


def peer_stages(tmp: Path) -> tuple[Any, Any]:
    """(GPU face analyser, neural swapper with the astronaut's identity set) for the peer path."""
    from swapstream.demo import astronaut
    from swapstream.gpu.analyser import GpuFaceAnalyser
    from swapstream.neural.factory import NeuralStages
    from swapstream.swap.mesh import source_face

    cfg = neural_config(tmp / "models")
    stages = NeuralStages(cfg)
    analyser = GpuFaceAnalyser(cfg)
    src = astronaut()
    stages.swapper.set_source(src, source_face(analyser.analyse_image(src), "astronaut"))
    return analyser, stages.swapper


# -- variants -------------------------------------------------------------------------------------

def run_peer(clip: Path, frames: int, tmp: Path) -> dict[str, Any]:
    import cv2

    from swapstream.kernels.paste import box_mask_ref
    from swapstream.neural.swapper import align_matrix
    from swapstream.types import Frame

    analyser, sw = peer_stages(tmp)
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


def run_ours(variant: str, clip: Path, tmp: Path, decode: str) -> dict[str, Any]:
    """`swapstream run` on the clip as a user runs it, to the null output: its own summary's figures."""
    from bench_run import run_command, run_setup, run_summary

    neural = variant == "ours_neural"
    source, opts = run_setup(tmp, config="live", swapper="inswapper_128" if neural else "mesh", synthetic=neural,
                             sets=[f"decoder={decode}"])
    cmd = run_command(source, clip, "null:", opts)
    r = run_summary(cmd)
    return {"frames": r["frames"], "fps": r["fps"], "frames_swapped": r["frames_swapped"],
            "decode": r["decode"], "loop_ms": r["loop_ms"], "latency_ms": r["latency_ms"],
            "slowest": r["slowest"], "run_command": " ".join(cmd[3:]).replace(str(tmp), "TMP"), "summary": r["summary"]}


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
    """A variant in its own process (so that one variant's caching allocators and compiled kernels do
    not count against the next one's memory); prints its result as one RESULT line."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.child == "peer":
            res = run_peer(args.clip, args.frames, Path(tmp))
        elif args.child == "x264":
            res = run_x264(args.clip, args.frames)
        else:
            res = run_ours(args.child, args.clip, Path(tmp), args.decode)
    print("RESULT " + json.dumps(res), flush=True)


class DeviceMemory:
    """The device's used memory while a variant runs, polled with nvidia-smi from a thread of this
    process (which makes no CUDA context); nothing where there is no nvidia-smi."""

    def __init__(self) -> None:
        self.base = self.peak = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def _used() -> int | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        return int(out.split()[0]) * 2**20

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            used = self._used()
            if used is not None and self.peak is not None:
                self.peak = max(self.peak, used)

    def __enter__(self) -> "DeviceMemory":
        if self.base is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def peak_gb(self) -> float | None:
        return None if self.base is None or self.peak is None else round((self.peak - self.base) / 1e9, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--frames", type=int, default=500, help="most frames the peer path and x264 take "
                    "(`swapstream run` takes the whole clip)")
    ap.add_argument("--decode", choices=("auto", "nvdec", "cpu"), default="auto")
    ap.add_argument("--variants", default=",".join(VARIANTS) + ",x264")
    ap.add_argument("--tag", default="", help="suffix for the output file names (e.g. _nvdec)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.out is None:
        ap.error("--out is required")
    if not args.clip.is_file():
        sys.exit(f"error: no clip at '{args.clip}': make it with python tools/make_bench_clips.py")
    results: dict[str, Any] = {}
    for v in args.variants.split(","):
        if v == "x264":
            try:
                import av  # noqa: F401
            except ImportError:
                print("x264: PyAV is not installed here; skipped")
                continue
        cmd = [sys.executable, __file__, "--clip", str(args.clip), "--frames", str(args.frames),
               "--decode", args.decode, "--child", v]
        print(f"== {v}", flush=True)
        with DeviceMemory() as mem:
            p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write("\n".join(x[:400] for x in p.stdout.splitlines()[-30:]) + "\n")
        lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            print(f"{v} failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
            tail = (p.stderr.strip() or p.stdout.strip() or "failed").splitlines()[-1]
            results[v] = {"error": tail}
            continue
        r = json.loads(lines[-1][7:])
        if v != "x264" and mem.peak_gb() is not None:
            r["peak_gpu_gb"] = mem.peak_gb()
        r["fps"] = round(r["fps"], 1)
        results[v] = r
    write(results, args)


def write(results: dict[str, Any], args: argparse.Namespace) -> None:
    common = run_fields(gpu_name(), f"python tools/bench_pipeline.py --clip CLIP --frames {args.frames} "
                                    f"--decode {args.decode} --variants {args.variants}")
    records: list[dict[str, Any]] = []
    for v, r in results.items():
        if "error" in r:
            records.append({"metric": f"{v}_error", "value": r["error"], **common})
            continue
        records.append({"metric": f"{v}_fps_1080p", "value": r["fps"], "unit": "fps", "stat": "mean",
                        "config": {k: r[k] for k in ("frames", "decode", "frames_swapped", "preset", "crf",
                                                     "run_command") if k in r}, **common})
        if "latency_ms" in r:  # ours: the run's own summary
            for stat in ("p50", "p99", "max"):
                records.append({"metric": f"{v}_end_to_end_ms", "value": r["latency_ms"].get(stat),
                                "unit": "ms", "stat": stat,
                                "config": {"from": "decoder", "to": "encoder hand-over", "clock": "host"}, **common})
            for step, ms in r["loop_ms"].items():
                records.append({"metric": f"{v}_stage_{step.replace('-', '_')}_ms", "value": ms, "unit": "ms",
                                "stat": "mean", "config": {"clock": "host"}, **common})
            if r.get("slowest"):
                sl = r["slowest"]
                records.append({"metric": f"{v}_slowest_step_ms", "value": sl["ms"], "unit": "ms", "stat": "max",
                                "config": {"step": sl["step"], "frames_taken": sl["frames_taken"], "clock": "host"},
                                **common})
        for stage, st in r.get("stages_ms", {}).items():  # the peer path and x264: timed here
            for stat in ("p50", "p99", "mean", "max"):
                records.append({"metric": f"{v}_{stage}_ms", "value": st[stat], "unit": "ms", "stat": stat,
                                "config": {"clock": "host"}, **common})
        if "peak_gpu_gb" in r:
            records.append({"metric": f"{v}_peak_gpu_memory", "value": r["peak_gpu_gb"], "unit": "GB",
                            "stat": "max", **common})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pipeline{args.tag}.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# File-mode pipeline, {args.clip.name}, one face ({common['device']})", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}. Ours is `swapstream run -c "
             "live -o null:` itself (encoding excluded), its figures from its own summary; the peer path is "
             "this tool's model of the peers' per-frame code. Latency: from the decoded frame to the frame "
             "ready for the encoder (ours: handed to it; the peer's: the blended host frame), host clock.", "",
             "| variant | decode | frames | fps | analyse ms a frame | swap ms a frame | end to end p50 / p99 / max ms "
             "| peak GPU GB |", "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        r = results.get(v)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {v} | failed: {r['error'][:80]} | | | | | | |")
            continue
        if "latency_ms" in r:
            lat, loop = r["latency_ms"], r["loop_ms"]
            e2e = " / ".join(f"{lat[k]:.2f}" if k in lat else "?" for k in ("p50", "p99", "max"))
            analyse, swap = (f"{loop[k]:.2f}" if k in loop else "?" for k in ("analyse", "swap"))
        else:
            st = r["stages_ms"]
            e2e = " / ".join(f"{st['end_to_end'][k]:.2f}" for k in ("p50", "p99", "max"))
            analyse, swap = f"{st['analyse']['mean']:.2f}", f"{st['swap']['mean'] + st['paste']['mean']:.2f}"
        lines.append(f"| {v} | {r['decode']} | {r['frames']} | {r['fps']:.1f} | {analyse} | {swap} | {e2e} "
                     f"| {r.get('peak_gpu_gb', '')} |")
    lines += ["", "Analyse and swap: time a frame, mean (ours: the run's `stage ms/frame`, each stage in a "
              "thread of its own, the swap's time shared among a batch's frames; the peer's swap includes its "
              "paste). Ours marks "
              "every frame, as every output of `run` is (the visible label is off for file outputs by default, "
              "`disclosure.label_files`); the peer path has neither mark nor label, as the peers have neither."]
    for v in ("ours_mesh", "ours_neural"):
        r = results.get(v)
        if r and "loop_ms" in r:
            steps = ", ".join(f"{k} {ms:.2f}" for k, ms in r["loop_ms"].items())
            slow = r.get("slowest")
            worst = (f"; its longest step: {slow['step']} {slow['ms']} ms, {slow['frames_taken']} frames taken"
                     if slow else "")
            lines.append(f"- {v}: `swapstream {r['run_command']}`; stage ms/frame: {steps}{worst}.")
    if "x264" in results and "error" not in results["x264"]:
        x = results["x264"]
        lines += ["", f"x264 on the clip's frames (PyAV, preset {x['preset']}, crf {x['crf']}), reported separately: "
                  f"{x['fps']:.1f} fps, encode call p50 {x['stages_ms']['encode_call']['p50']:.2f} ms, "
                  f"p99 {x['stages_ms']['encode_call']['p99']:.2f} ms."]
    n = results.get("ours_neural")
    if n and "error" not in n and n.get("latency_ms"):
        ok = lambda b: "met" if b else "NOT met"  # noqa: E731
        p99 = n["latency_ms"]["p99"]
        lines += ["", f"Targets for ours_neural: p99 ≤ {TARGETS['p99_ms']} ms: {p99:.2f} ms "
                  f"({ok(p99 <= TARGETS['p99_ms'])}); ≥ {TARGETS['fps']:.0f} fps: {n['fps']:.1f} "
                  f"({ok(n['fps'] >= TARGETS['fps'])}); ≤ {TARGETS['gpu_gb']} GB: {n.get('peak_gpu_gb')} "
                  f"({ok(n.get('peak_gpu_gb', 99) <= TARGETS['gpu_gb'])})."]
    lines.append("")
    (args.out / f"pipeline{args.tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
