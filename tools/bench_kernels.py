"""Kernel benchmark at 1080p on the GPU, with the OpenCV/NumPy CPU equivalent of each op in the same run.

    python tools/bench_kernels.py --out DIR     (run by tools/device_check.sh on the device)

For each op: median GPU time over many launches (CUDA events around each call, after warm-up), the
bytes the op must move at the least (each input read once, each output written once), the achieved
GB/s, and that rate as a fraction of the device-to-device copy bandwidth measured first in the same
run. Writes kernels.json (records as docs/performance.md, "Benchmark records", describes) and
kernels.md into --out; device_check.sh copies them to docs/benchmarks/ when run from the repository.
"""

from __future__ import annotations

import sys

import argparse
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import gpu_name, median_ms, run_fields, wall_median_ms  # noqa: E402

W, H = 1920, 1080



def gpu_time_us(cp: Any, fn: Callable[[], Any], reps: int = 200, warm: int = 10) -> float:
    """Median time of `fn` between CUDA events on the current stream, in microseconds."""
    return median_ms(cp, fn, cp.cuda.get_current_stream(), reps, warm) * 1e3


def graph_time_us(cp: Any, fn: Callable[[], Any], reps: int = 200) -> float | None:
    """Median replay time of `fn` captured as a CUDA graph: the GPU's own time, without Python's
    launch overhead. None when `fn` cannot be captured (it copies from the host, or synchronises)."""
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        with stream:
            fn()
            stream.synchronize()
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    except Exception as e:  # capture is refused for host copies and syncs; report and go on
        print(f"  (no graph: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
        return None
    return median_ms(cp, lambda: graph.launch(stream), stream, reps) * 1e3


def cpu_time_us(fn: Callable[[], Any], reps: int = 20, warm: int = 2) -> float:
    return wall_median_ms(fn, reps, warm) * 1e3


def copy_bandwidth_gbs(cp: Any) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written (METHOD.md)."""
    n = 1 << 30
    a = cp.empty(n, cp.uint8)
    a.fill(7)
    b = cp.empty_like(a)
    t = gpu_time_us(cp, lambda: cp.copyto(b, a), reps=20, warm=3)
    return 2 * n / (t * 1e-6) / 1e9


def demo_face_1080p(cp: Any) -> tuple[np.ndarray, Any, Any, Any]:
    """A 1080p frame of the demo clip, its tracked face, and a mesh swapper set to the astronaut."""
    from swapstream.config import load_config
    from swapstream.demo import astronaut, grace_hopper, render_target_frame
    from swapstream.face.analyser import FaceAnalyser
    from swapstream.swap.mesh import MeshSwapper, source_face
    from swapstream.types import Frame

    cfg = load_config()
    analyser = FaceAnalyser(cfg)
    img = render_target_frame(grace_hopper(), 0.8, (W, H))
    faces = analyser.track(Frame(img, pts=0, time_base=Fraction(1, 25)))
    src = astronaut()
    sw_gpu, sw_cpu = MeshSwapper(cfg.mesh), MeshSwapper(cfg.mesh)
    face = source_face(analyser.analyse_image(src), "astronaut")
    sw_gpu.set_source(src, face)
    sw_cpu.set_source(src, face)
    analyser.close()
    return img, faces, sw_gpu, sw_cpu


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    dev_name = gpu_name()
    common = run_fields(dev_name, "tools/device_check.sh bench")
    records: list[dict[str, Any]] = []
    rows: list[tuple[str, float | None, float | None, float | None, float | None, float | None, str]] = []

    bw = copy_bandwidth_gbs(cp)
    records.append({"metric": "copy_bandwidth_d2d", "value": round(bw, 1), "unit": "GB/s",
                    "stat": "p50", "config": {"bytes": 1 << 30}, **common})

    def add(metric: str, fn: Callable[[], Any] | None, nbytes: int, cpu_us: float | None,
            cpu_what: str, config: dict[str, Any], target_us: float | None = None,
            call_us: float | None = None, graph_us: float | None = None) -> None:
        """Time `fn` per call (events around each Python call) and as a graph replay (GPU time),
        or take both figures as given."""
        if fn is not None:
            call_us = gpu_time_us(cp, fn)
            graph_us = graph_time_us(cp, fn)
        gpu_us = graph_us if graph_us is not None else call_us
        gbs = nbytes / (gpu_us * 1e-6) / 1e9 if gpu_us else None
        if call_us is not None:
            records.append({"metric": metric + "_per_call", "value": round(call_us, 2), "unit": "us",
                            "stat": "p50", "config": {**config, "includes": "Python launch overhead"},
                            **common})
        if graph_us is not None:
            records.append({"metric": metric, "value": round(graph_us, 2), "unit": "us", "stat": "p50",
                            "config": {**config, "bytes": nbytes, "gbs": round(gbs or 0, 1),
                                       "fraction_of_copy_bw": round((gbs or 0) / bw, 3),
                                       "target_us": target_us}, **common})
        if cpu_us is not None:
            records.append({"metric": metric + "_cpu", "value": round(cpu_us, 1), "unit": "us",
                            "stat": "p50", "config": {**config, "cpu": cpu_what}, **common})
        rows.append((metric, graph_us, call_us, gbs, target_us, cpu_us, cpu_what))

    # NV12 <-> RGB ----------------------------------------------------------------------------
    try:
        from swapstream.kernels.nv12 import nv12_to_rgb, rgb_to_nv12

        rgb_h = cv2.resize(rng.integers(0, 256, (135, 240, 3), dtype=np.uint8), (W, H))
        yuv = cv2.cvtColor(rgb_h, cv2.COLOR_RGB2YUV_I420)
        y_h = np.ascontiguousarray(yuv[:H])
        uv_h = np.empty((H // 2, W), np.uint8)  # I420 planes interleaved into NV12
        uv_h[:, 0::2] = yuv[H:H + H // 4].reshape(H // 2, W // 2)
        uv_h[:, 1::2] = yuv[H + H // 4:].reshape(H // 2, W // 2)
        y, uv = cp.asarray(y_h), cp.asarray(uv_h)
        rgb = cp.empty((H, W, 3), cp.uint8)
        nv12_h = np.vstack([y_h, uv_h])
        c = cpu_time_us(lambda: cv2.cvtColor(nv12_h, cv2.COLOR_YUV2RGB_NV12))
        add("nv12_to_rgb_1080p", lambda: nv12_to_rgb(y, uv, rgb, matrix="bt709"), W * H * 3 // 2 + W * H * 3, c, "cv2.cvtColor NV12->RGB",
            {"size": "1920x1080"}, 25.0)
        yo, uvo = cp.empty((H, W), cp.uint8), cp.empty((H // 2, W), cp.uint8)
        c = cpu_time_us(lambda: cv2.cvtColor(rgb_h, cv2.COLOR_RGB2YUV_I420))
        add("rgb_to_nv12_1080p", lambda: rgb_to_nv12(rgb, yo, uvo, matrix="bt709"), W * H * 3 + W * H * 3 // 2, c, "cv2.cvtColor RGB->I420",
            {"size": "1920x1080"}, 25.0)
    except Exception as e:
        print(f"skipped NV12: {type(e).__name__}: {e}")

    # Batched crop + pre-processing -------------------------------------------------------------
    frame_h = cv2.resize(rng.integers(0, 256, (135, 240, 3), dtype=np.uint8), (W, H))
    frame = cp.asarray(frame_h)
    try:
        from swapstream.kernels.crop import crop_batch

        S = 128
        mats = np.stack([np.array([[2.0 * np.cos(a), -2.0 * np.sin(a), 300 + 350 * k],
                                   [2.0 * np.sin(a), 2.0 * np.cos(a), 200 + 100 * k]])
                         for k, a in enumerate((0.1, -0.2, 0.3, 0.0))]).astype(np.float32)
        d_mats = cp.asarray(mats)
        out = cp.empty((4, 3, S, S), cp.float16)

        def cpu_crop() -> None:
            for m in mats:
                x = cv2.warpAffine(frame_h, m.astype(np.float64), (S, S),
                                   flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                   borderMode=cv2.BORDER_REPLICATE)
                (x.astype(np.float32) / 255.0).transpose(2, 0, 1).astype(np.float16)

        c = cpu_time_us(cpu_crop)
        add("crop_4faces_128_fp16_1080p", lambda: crop_batch(frame, d_mats, out), 4 * S * S * 3 * (4 + 2), c,
            "4x cv2.warpAffine + normalise + NCHW fp16", {"faces": 4, "size": S}, 30.0)
    except Exception as e:
        print(f"skipped crop: {type(e).__name__}: {e}")

    # Paste-back + mask + colour + sharpen, one face ------------------------------------------------
    try:
        from swapstream.kernels.paste import paste_back
        from swapstream.kernels.sharpen import sharpen

        S = 128
        crop_h = cv2.resize(rng.uniform(0, 255, (16, 16, 3)).astype(np.float32), (S, S))
        crop = cp.asarray(crop_h)
        a, s = 0.15, 3.2  # a 410 px face in the 1080p frame
        m = np.array([[s * np.cos(a), -s * np.sin(a), 760.0], [s * np.sin(a), s * np.cos(a), 300.0]])
        gain = np.array([1.05, 0.97, 1.02], np.float32)
        off = np.array([3.0, -2.0, 1.0], np.float32)
        work = frame.copy()

        def gpu_paste() -> None:
            box = paste_back(work, crop, m, blur=0.3, color_gain=gain, color_offset=off)
            sharpen(work, box, amount=0.5, radius=1.0)

        corners = np.array([[0, 0], [S, 0], [0, S], [S, S]]) @ m[:, :2].T + m[:, 2]
        bw_, bh_ = np.ptp(corners, axis=0)
        area = int(bw_ * bh_)

        def cpu_paste() -> None:
            f = frame_h.copy()
            mask = np.zeros((S, S), np.float32)
            mask[4:-4, 4:-4] = 1
            mask = cv2.GaussianBlur(mask, (0, 0), 0.25 * int(0.5 * S * 0.3))
            wc = cv2.warpAffine(crop_h, m, (W, H), borderMode=cv2.BORDER_REPLICATE)
            wm = cv2.warpAffine(mask, m, (W, H))[..., None]
            out = f * (1 - wm) + wc * wm
            blur = cv2.GaussianBlur(out, (0, 0), 1.0)
            np.clip(out + 0.5 * (out - blur), 0, 255).astype(np.uint8)

        c = cpu_time_us(cpu_paste)
        add("paste_mask_color_sharpen_1face_1080p", gpu_paste, area * 3 * 2 * 2 + S * S * 12, c,
            "cv2.warpAffine crop+mask, blend, GaussianBlur unsharp (peer style, full frame)",
            {"crop": S, "face_px": int(max(bw_, bh_))}, 80.0)
    except Exception as e:  # a missing or failing op must not cost the rest of the run
        print(f"skipped paste-back: {type(e).__name__}: {e}")

    # Whole mesh swap of one face ---------------------------------------------------------------
    img, faces, sw_gpu, sw_cpu = demo_face_1080p(cp)
    d_img = cp.asarray(img)
    work = d_img.copy()

    def gpu_swap() -> None:
        cp.copyto(work, d_img)  # a fresh target each time, as in a stream (counted: ~6 MB copy)
        sw_gpu.swap(work, faces)

    t_copy = gpu_time_us(cp, lambda: cp.copyto(work, d_img))
    t_call = gpu_time_us(cp, gpu_swap) - t_copy
    x0, y0, rw, rh = sw_gpu.region(faces[0], img.shape)
    c = cpu_time_us(lambda: sw_cpu.swap(img.copy(), faces), reps=10)
    # Step by step, each captured as a graph where it can be, to show where GPU time goes.
    from swapstream.face.topology import closed_mesh_points
    from swapstream.kernels.mesh import rasterize_mesh
    from swapstream.kernels.meshswap import STATS_LEN, color_stats, mesh_mask, transfer_blend
    from swapstream.kernels.warp import remap_bilinear

    topo = sw_gpu.topo
    dev = sw_gpu._on(cp)
    dst_h = closed_mesh_points(faces[0].landmarks[:, :2], topo)
    dst = cp.asarray(dst_h)
    outline = cp.asarray(dst_h[topo.face_oval])
    keep = cp.asarray(dst_h[topo.lips_inner])
    origin = (x0, y0)
    mp = cp.empty((rh, rw, 2), cp.float32)
    warped = cp.empty((rh, rw, 3), cp.float32)
    mask = cp.empty((rh, rw), cp.float32)
    stats = cp.empty(STATS_LEN, cp.float64)
    sigma = 0.05 * max(rw, rh) / 2.5
    steps = [
        ("rasterize_mesh", lambda: rasterize_mesh(dst, dev["pts"], dev["tris"], origin, mp)),
        ("remap_bilinear", lambda: remap_bilinear(dev["img"], mp, warped)),
        ("mesh_mask", lambda: mesh_mask(outline, keep, (keep.shape[0],), mp, origin, sigma,
                                        sigma / 2, mask)),
        ("color_stats_lab", lambda: color_stats(warped, work, mask, origin, "lab", stats)),
        ("transfer_blend_lab", lambda: transfer_blend(work, warped, mask, stats, origin, "lab")),
    ]
    step_total = 0.0
    for name, fn in steps:
        call = gpu_time_us(cp, fn)
        graph = graph_time_us(cp, fn)
        step_total += graph if graph is not None else call
        records.append({"metric": f"mesh_swap_step_{name}_1080p", "value": round(graph or call, 2),
                        "unit": "us", "stat": "p50",
                        "config": {"face_px": int(max(rw, rh)), "graph": graph is not None,
                                   "per_call_us": round(call, 2)}, **common})
        print(f"  mesh swap step {name}: graph {graph} us, per call {call:.1f} us")
    add("mesh_swap_1face_1080p", None, rw * rh * (3 * 2 + 3 * 4 + 8 + 4), c,
        "the same swap through the NumPy references", {"face_px": int(max(rw, rh)),
                                                       "sum_of_step_gpu_us": round(step_total, 1)},
        150.0, call_us=t_call, graph_us=step_total)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# Kernel benchmark, 1080p, {dev_name}", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}. Copy bandwidth "
             f"measured in the same run: **{bw:.0f} GB/s** (device to device, read + write).", "",
             "GPU µs is the CUDA-graph replay (the GPU's own time); per call adds Python's launch",
             "overhead (events around each call). For the mesh swap, GPU µs is the sum of its steps.", "",
             "| op | GPU µs | per call µs | target µs | GB/s (min bytes) | % of copy bw | CPU µs | CPU equivalent |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=1: "n/a" if v is None else f"{v:.{p}f}"
    for metric, g, call, gbs, target, cpu, what in rows:
        pct = None if gbs is None else 100 * gbs / bw
        lines.append(f"| {metric} | {f(g)} | {f(call)} | {target or ''} | {f(gbs)} | {f(pct)}% "
                     f"| {f(cpu, 0)} | {what} |")
    lines.append("")
    (args.out / "kernels.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
