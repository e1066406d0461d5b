"""Watermark v2 on its hardest chain, over many stream ids and texture masks (CPU).

    python tools/watermark_payload_sweep.py [--clip pan] [--attack scale_0.5x] [--frames 300]
                                            [--payloads 6] [--mask-levels 6,4,3,2.5] [--seed 11]
                                            [--out docs/benchmarks]

The robustness benchmark (`tools/watermark_robustness.py --v2`) marks one fixed payload. A window
that decodes there with little margin may fail for another stream id (each id gives other coded
bits, so other chips carry the weak ones). This tool marks the clip with `--payloads` random stream
ids (seeded, so a run can be repeated) for each texture mask in `--mask-levels` (the mean |luma
difference| per pixel at which the mask reaches full scale: `MaskParams.inv_act` = 1 / level, the
flat-block scale and the top as shipped), sends each through the benchmark's chain (the upload, then
`--attack` and its encode) and decodes every 2 s window with the shipped detector. Each window
records whether it holds a keyframe of either encode (keyframes carry the most of the mark; a pan's
predicted frames the least), its sync peak, data score and outcome. It also records each mask's
mark PSNR and bitrate at equal CRF on the clip, as the benchmark measures them.
Writes watermark_payload_sweep.json (records as docs/performance.md, "Benchmark records",
describes) and watermark_payload_sweep.md into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, run_fields  # noqa: E402
from watermark_robustness import ATTACKS, CLIPS, FPS, WINDOW, attacked_lumas, decode, encode, psnr, \
    render_clip  # noqa: E402

from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload  # noqa: E402
from swapstream.watermark_v2 import MASK, MaskParams, WatermarkerV2, WindowDetector  # noqa: E402


def keyframes(path: Path) -> list[int]:
    """Indices of the keyframes of `path`, in decode order (no B-frames reorder the display here:
    the frames' count and order match the encoder's input)."""
    with av.open(str(path)) as c:
        return [i for i, f in enumerate(c.decode(video=0)) if f.key_frame]


def levels(text: str) -> list[float]:
    try:
        out = [float(v) for v in text.split(",")]
    except ValueError:
        sys.exit(f"error: --mask-levels takes numbers joined by commas, got {text!r}")
    if not out or min(out) <= 0:
        sys.exit(f"error: --mask-levels must be numbers > 0, got {text!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clip", default="pan", choices=CLIPS)
    ap.add_argument("--attack", default="scale_0.5x", choices=[a for a in ATTACKS if a != "upload_720p_2M"])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--payloads", type=int, default=6)
    ap.add_argument("--mask-levels", default="6,4,3,2.5")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args()
    if args.frames < WINDOW:
        sys.exit(f"error: --frames must be at least one window ({WINDOW}), got {args.frames}")
    if args.payloads < 1:
        sys.exit(f"error: --payloads must be at least 1, got {args.payloads}")
    mask_levels = levels(args.mask_levels)
    common = run_fields(cpu_name(), "python tools/watermark_payload_sweep.py --clip {} --attack {} --frames {} "
                        "--payloads {} --mask-levels {} --seed {}".format(
                            args.clip, args.attack, args.frames, args.payloads, args.mask_levels, args.seed))
    rng = np.random.default_rng(args.seed)
    ids = [int(rng.integers(0, 2 ** 32)) for _ in range(args.payloads)]
    plain = render_clip(args.clip, args.frames)
    records: list[dict[str, Any]] = []
    rows: list[tuple[float, float, float, int, int, int, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        base_rate = encode(plain, tmp / "plain.mp4", "platform")
        for level in mask_levels:
            t0 = time.perf_counter()
            mask = MaskParams(inv_act=1.0 / level, m_lo=MASK.m_lo, m_hi=MASK.m_hi)
            windows: list[dict[str, Any]] = []
            mark_db = rate = 0.0
            for k, sid in enumerate(ids):
                payload = Payload(PRODUCT_SWAPSTREAM, sid)
                marker = WatermarkerV2(payload, mask=mask)
                marked = [f.copy() for f in plain]
                for f in marked:
                    marker.embed(f)
                if k == 0:  # the mask's cost: one payload's is every payload's, within noise
                    mark_db = float(np.mean([psnr(a, b) for a, b in zip(plain, marked)]))
                    rate = encode(marked, tmp / "cost.mp4", "platform")
                up = tmp / "up.mp4"
                encode(marked, up, "crf")
                attacked = tmp / "attacked.mp4"
                lumas = attacked_lumas(up, decode(up, "rgb24"), args.attack, attacked)
                keys = set(keyframes(up)) | set(keyframes(attacked))
                for start in range(0, len(lumas) - WINDOW + 1, WINDOW):
                    d = WindowDetector()
                    for y in lumas[start:start + WINDOW]:
                        d.add(y.astype(np.float32))
                    r = d.decode()
                    windows.append({
                        "stream_id": f"{sid:#010x}", "start_frame": start,
                        "keyframe": any(start <= i < start + WINDOW for i in keys),
                        "decoded": bool(r.found and r.detection.payload == payload),
                        "wrong_payload": bool(r.found and r.detection.payload != payload),
                        "sync": None if r.alignment is None else round(r.alignment.peak, 2),
                        "score": round(r.detection.score, 3), "reason": r.detection.reason})
            no_key = [w for w in windows if not w["keyframe"]]
            scores = [w["score"] for w in no_key if w["decoded"]]
            row = (level, mark_db, rate, sum(w["decoded"] for w in windows), len(windows),
                   sum(w["decoded"] for w in no_key), len(no_key),
                   min(scores) if scores else float("nan"), max(scores) if scores else float("nan"))
            rows.append(row)
            wrong = sum(w["wrong_payload"] for w in windows)
            records.append({
                "metric": f"watermark_v2_sweep_{args.clip}_{args.attack}_mask{level:g}",
                "value": round(row[3] / row[4], 4), "unit": "fraction", "stat": "mean",
                "config": {"clip": args.clip, "attack": args.attack, "frames": args.frames,
                           "mask_full_scale_level": level,
                           "payloads": args.payloads, "windows": row[4], "decoded": row[3],
                           "keyframeless_windows": row[6], "keyframeless_decoded": row[5], "wrong_payloads": wrong,
                           "mark_psnr_db": round(mark_db, 2), "crf23_mbit_s": round(rate, 3),
                           "unmarked_crf23_mbit_s": round(base_rate, 3), "windows_detail": windows},
                **common})
            print(f"mask level {level:g}: {row[3]}/{row[4]} windows, keyframe-less {row[5]}/{row[6]}, "
                  f"wrong {wrong}, {time.perf_counter() - t0:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watermark_payload_sweep.json").write_text(json.dumps(records, indent=2) + "\n")
    lines = [f"# Watermark v2 over {args.payloads} stream ids: {args.clip}, {args.attack} (CPU)", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}, {common['device']}. "
             f"Each stream id's marked clip ({args.frames} frames, 1280x720, {FPS} fps) is uploaded (x264 CRF 23 "
             f"capped at 2 Mbit/s), then `{args.attack}` and its encode, as in `watermark_robustness.py --v2`; "
             f"every 2 s window decoded alone by the shipped detector. Mask level: the mean |luma difference| "
             f"per pixel at which the texture mask reaches full scale (shipped: {1 / MASK.inv_act:g}). "
             f"Keyframe-less: windows holding no keyframe of either encode. Bitrate at equal CRF (x264 veryfast "
             f"CRF 23, no cap); the unmarked clip: {base_rate:.3f} Mbit/s.", "",
             "| mask level | mark PSNR | Mbit/s at CRF 23 | windows decoded | keyframe-less decoded "
             "| their data scores |", "|---|---|---|---|---|---|"]
    for level, db, rate, good, n, kgood, kn, lo, hi in rows:
        sc = "-" if kgood == 0 else f"{lo:.2f}-{hi:.2f}"
        lines.append(f"| {level:g} | {db:.1f} dB | {rate:.3f} (+{100 * (rate / base_rate - 1):.0f}%) | "
                     f"{good} of {n} | {kgood} of {kn} | {sc} |")
    lines.append("")
    (args.out / "watermark_payload_sweep.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
