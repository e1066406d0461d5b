"""Where watermark v2's bitrate goes, and what motion-aware embedding would save (a study, CPU).

    python tools/watermark_cost_study.py [--frames 300] [--clips demo pan noisy]
                                         [--detect-attacks upload_720p_2M reencode_480p_1M]
                                         [--out docs/benchmarks]

Issue 24 asks for a mark that costs at most 10% more x264 bitrate at equal CRF. v2 costs far more
(`watermark_robustness_v2.md` has its current figures). This tool measures, on the robustness benchmark's
clips, embedders that differ from v2 in one thing each, with v2's pattern, amplitude and texture
mask (`MASK`, as shipped when the tool runs) otherwise:
- `static`: v2 as shipped (checked here to give v2's bytes exactly);
- `temporal`: each 8x8 block's scale is also multiplied by a gain that drops to 0 where the block's
  (blurred) luma changed since the previous frame by 1-3 levels or more, and comes back by `recover`
  a frame once the block is still (`temporal` 0.1, `temporal_slow` 0.02);
- `follow`: the tile moves with the frame's global motion (phase correlation of the previous and this
  frame at half size), so that an encoder's motion compensation carries it along with the picture;
- `follow_temporal_slow`: both.
For the demo clip it also splits v2's cost between the pixels that never change (the backdrop) and
the rest. Then it decodes 2 s windows of each embedder after `--detect-attacks` with the shipped
detector (`swapstream.watermark_v2.detect_v2`). These embedders are NumPy only and not in the product:
the study is what decided that (docs/responsible_use.md, "Tried and dropped").
Writes watermark_cost_study.json and .md into --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, run_fields
from swapstream.kernels.watermark_v2 import MASK_BLOCK, block_scale_ref, integer_luma
from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload
from swapstream.watermark_v2 import AMPLITUDE, MASK, TILE, WatermarkerV2, chip_size, detect_v2, tile_values
from watermark_robustness import ATTACKS, CLIPS, WINDOW, attacked_lumas, decode, encode, psnr, render_clip

T_LO, T_HI = 1.0, 3.0
"""Mean |blurred luma change| of a block (levels) under which it keeps the mark, over which it loses it."""


def tile_at(values: np.ndarray, h: int, w: int, chip: float, oy: float, ox: float) -> np.ndarray:
    """v2's bilinear tiling (`render_tiled`, float64 as there) moved by (oy, ox) pixels."""
    def axis(n: int, off: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = (np.arange(n) + 0.5 - off) / chip - 0.5
        i0 = np.floor(u)
        return i0.astype(np.int64) % TILE, (i0.astype(np.int64) + 1) % TILE, u - i0

    y0, y1, fy = axis(h, oy)
    x0, x1, fx = axis(w, ox)
    v = values.astype(np.float64)
    top = v[y0][:, x0] * (1 - fx) + v[y0][:, x1] * fx
    bottom = v[y1][:, x0] * (1 - fx) + v[y1][:, x1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


def global_shift(prev: np.ndarray, cur: np.ndarray) -> tuple[float, float, float]:
    """(dy, dx, peak) by which `cur` is `prev` moved: phase correlation at half size, the peak placed by
    a parabola. OpenCV's phaseCorrelate was off by 0.3-0.5 px a frame on the pan clip (3.45 for 3),
    which moves the tile off the picture within a second; this is within 0.01 px there."""
    h, w = cur.shape
    a = cv2.resize(prev, (w // 2, h // 2), interpolation=cv2.INTER_AREA)
    b = cv2.resize(cur, (w // 2, h // 2), interpolation=cv2.INTER_AREA)
    win = cv2.createHanningWindow((w // 2, h // 2), cv2.CV_32F)
    r = np.fft.rfft2(b * win) * np.conj(np.fft.rfft2(a * win))
    c = np.fft.irfft2(r / (np.abs(r) + 1e-9), s=a.shape)
    hh, ww = c.shape
    py, px = divmod(int(np.argmax(c)), ww)

    def sub(lo: float, mid: float, hi: float) -> float:
        den = lo - 2 * mid + hi
        return 0.0 if den >= 0 else float(np.clip(0.5 * (lo - hi) / den, -0.5, 0.5))

    dx = (px if px < ww // 2 else px - ww) + sub(c[py, px - 1], c[py, px], c[py, (px + 1) % ww])
    dy = (py if py < hh // 2 else py - hh) + sub(c[py - 1, px], c[py, px], c[(py + 1) % hh, px])
    return 2 * dy, 2 * dx, float(c[py, px])


class StudyEmbedder:
    """v2's embedding with the study's options (module doc). Keeps the previous frame's blurred luma."""

    def __init__(self, payload: Payload, *, follow: bool, recover: float | None) -> None:
        self.values = tile_values(payload)
        self.follow, self.recover = follow, recover
        self.prev: np.ndarray | None = None
        self.gain: np.ndarray | None = None
        self.offset = np.zeros(2)

    def embed(self, frame: np.ndarray) -> None:
        h, w = frame.shape[:2]
        luma = cv2.GaussianBlur(integer_luma(frame).astype(np.float32), (0, 0), 1.5)
        dy = dx = 0.0
        if self.follow and self.prev is not None:
            sy, sx, peak = global_shift(self.prev, luma)
            # A weak peak is no rigid motion; under a quarter pixel is drift (a zoom's centre).
            if peak > 0.2 and math.hypot(sy, sx) >= 0.25:
                dy, dx = sy, sx
                self.offset += (dy, dx)
        scale = block_scale_ref(frame, MASK)
        if self.recover is not None:
            if self.prev is None or self.gain is None:
                self.gain = np.ones_like(scale)
            else:
                moved = cv2.warpAffine(self.prev, np.float32([[1, 0, dx], [0, 1, dy]]), (w, h),
                                       borderMode=cv2.BORDER_REPLICATE)
                change = np.abs(luma - moved).reshape(h // MASK_BLOCK, MASK_BLOCK, w // MASK_BLOCK,
                                                      MASK_BLOCK).mean(axis=(1, 3))
                now = np.clip((T_HI - change) / (T_HI - T_LO), 0.0, 1.0).astype(np.float32)
                self.gain = np.minimum(now, self.gain + np.float32(self.recover))
            scale = scale * self.gain
        self.prev = luma
        pattern = (AMPLITUDE * tile_at(self.values, h, w, chip_size(h, w), *self.offset)).astype(np.float32)
        full = np.repeat(np.repeat(scale, MASK_BLOCK, 0), MASK_BLOCK, 1)[:h, :w]
        delta = np.rint(full * pattern).astype(np.int16)
        frame[...] = np.clip(frame.astype(np.int16) + delta[..., None], 0, 255).astype(np.uint8)


def embedders(payload: Payload) -> dict[str, Callable[[], Any]]:
    return {
        "static": lambda: StudyEmbedder(payload, follow=False, recover=None),
        "temporal": lambda: StudyEmbedder(payload, follow=False, recover=0.1),
        "temporal_slow": lambda: StudyEmbedder(payload, follow=False, recover=0.02),
        "follow": lambda: StudyEmbedder(payload, follow=True, recover=None),
        "follow_temporal_slow": lambda: StudyEmbedder(payload, follow=True, recover=0.02),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--clips", nargs="*", default=list(CLIPS), choices=CLIPS)
    ap.add_argument("--detect-attacks", nargs="*", default=["upload_720p_2M", "reencode_480p_1M"],
                    choices=list(ATTACKS))
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args()
    payload = Payload(PRODUCT_SWAPSTREAM, 0x5EC0A11D)
    common = run_fields(cpu_name(), "python tools/watermark_cost_study.py --frames "
                        f"{args.frames} --clips {' '.join(args.clips)} --detect-attacks {' '.join(args.detect_attacks)}")
    records: list[dict[str, Any]] = []
    rows: list[str] = []
    det_rows: list[str] = []
    split_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for clip in args.clips:
            t0 = time.perf_counter()
            plain = render_clip(clip, args.frames)
            base = encode(plain, tmp / "plain.mp4", "platform")
            shipped = [f.copy() for f in plain]
            marker = WatermarkerV2(payload)
            for f in shipped:
                marker.embed(f)
            for name, make in embedders(payload).items():
                marked = [f.copy() for f in plain]
                e = make()
                for f in marked:
                    e.embed(f)
                if name == "static" and not all(np.array_equal(a, b) for a, b in zip(marked, shipped)):
                    raise SystemExit("the study's static embedder no longer matches v2's: update it")
                rate = encode(marked, tmp / f"{name}.mp4", "platform")
                mark_db = float(np.mean([psnr(a, b) for a, b in zip(plain, marked)]))
                extra = 100 * (rate / base - 1)
                rows.append(f"| {clip} | {name} | {base:.3f} | {rate:.3f} | {extra:+.1f}% | {mark_db:.1f} dB |")
                records.append({"metric": f"watermark_study_cost_{clip}_{name}", "value": round(extra, 1),
                                "unit": "% bitrate", "stat": "mean",
                                "config": {"clip": clip, "embedder": name, "unmarked_mbit_s": round(base, 3),
                                           "marked_mbit_s": round(rate, 3), "mark_psnr_db": round(mark_db, 2),
                                           "frames": args.frames, "x264": "veryfast crf 23"}, **common})
                if name == "static" and clip == "demo":
                    still = np.all(np.stack(plain) == plain[0], axis=(0, 3))
                    for part, keep in (("pixels that never change", still), ("the rest", ~still)):
                        split = [np.where(keep[..., None], m, p) for m, p in zip(marked, plain)]
                        r = encode(split, tmp / "split.mp4", "platform")
                        split_rows.append(f"| {part} ({100 * keep.mean():.0f}% of the frame) | {100 * (r / base - 1):+.1f}% |")
                if name in ("temporal", "follow"):
                    continue  # detection: the shipped embedder and the slow-recovery ones
                up = tmp / f"{name}_up.mp4"
                encode(marked, up, "crf")
                uploaded = decode(up, "rgb24")
                for attack in args.detect_attacks:
                    lumas = attacked_lumas(up, uploaded, attack, tmp / f"{name}_{attack}.mp4")
                    found, syncs = 0, []
                    for i in range(0, len(lumas) - WINDOW + 1, WINDOW):
                        d = detect_v2([y.astype(np.float32) for y in lumas[i:i + WINDOW]])
                        found += int(d.found and d.detection.payload == payload)
                        syncs.append(d.alignment.peak if d.alignment else 0.0)
                    n = len(syncs)
                    det_rows.append(f"| {clip} | {name} | {attack} | {found} of {n} | "
                                    f"{min(syncs):.1f}-{max(syncs):.1f} |")
                    records.append({"metric": f"watermark_study_windows_{clip}_{name}_{attack}",
                                    "value": round(found / n, 4), "unit": "fraction", "stat": "mean",
                                    "config": {"clip": clip, "embedder": name, "attack": attack, "windows": n,
                                               "sync_min": round(min(syncs), 2)}, **common})
            print(f"{clip}: {time.perf_counter() - t0:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watermark_cost_study.json").write_text(json.dumps(records, indent=2) + "\n")
    lines = ["# Watermark v2's bitrate cost: a study of motion-aware embedding (CPU)", "",
             (f"`{common['command']}`, commit {common['commit']}, {common['date']}. Clips of {args.frames} "
             "frames at 1280x720, 30 fps (the robustness benchmark's). Cost: x264 veryfast CRF 23 without a "
             "cap, marked against unmarked. Embedders: see the tool's doc; only `static` is in the product."), "",
             "| clip | embedder | unmarked Mbit/s | marked Mbit/s | extra bitrate | mark PSNR |",
             "|---|---|---|---|---|---|", *rows, ""]
    if split_rows:
        lines += ["v2's cost on the demo clip, marking only part of each frame:", "",
                  "| marked part | extra bitrate |", "|---|---|", *split_rows, ""]
    lines += [("2 s windows decoded by the shipped detector (after the upload encode, x264 CRF 23 capped at "
              "2 Mbit/s, then the attack and its encode), and the sync peak's range (a window needs 5 or "
              "more to be decoded at all):"), "",
              "| clip | embedder | attack | windows decoded | sync |", "|---|---|---|---|---|", *det_rows, ""]
    (args.out / "watermark_cost_study.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
