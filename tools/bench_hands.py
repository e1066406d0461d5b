"""What `mask.hands` costs in `swapstream run`: a 720p clip with a hand in front of the face, the
same command with the option off and on, alternating.

    python tools/bench_hands.py [--seconds 4] [--repeat 3] [--config PRESET] [--hands-model lite|full]
                                [--out docs/benchmarks] [--name hands_cpu]

The clip is made first: the demo's animated portrait (`swapstream.demo.render_target_frame`, Grace
Hopper moving on a studio backdrop, 1280x720, 30 fps) with an open hand of the face's own skin tone
painted in front of the mouth in every frame, placed from that frame's landmarks (the hands tests'
`tests/stream/occluders.open_hand`). Each run is one process,
`swapstream run -s astronaut.png -i CLIP -o null: -q [-c PRESET] --set mask.hands=false|true`; the
figure is the run's own summary (`speed N fps`: frames over the loop's time, model loading left out).
Encoding is excluded (`-o null:`) so that the difference is the hand models' and the mask's.
On the GPU the command takes the GPU path, as a user's does. Writes `<out>/<name>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(ROOT))


def make_clip(path: Path, seconds: float, fps: int = 30) -> int:
    """Write the clip; returns its frame count."""
    import av
    import numpy as np
    from tests.stream.occluders import open_hand

    from swapstream.config import load_config
    from swapstream.demo import grace_hopper, render_target_frame
    from swapstream.face.analyser import FaceAnalyser

    analyser = FaceAnalyser(load_config())
    portrait = grace_hopper()
    rng = np.random.default_rng(7)
    n = int(round(seconds * fps))
    with av.open(str(path), "w") as out:
        st = out.add_stream("libx264", rate=fps)
        st.width, st.height, st.pix_fmt = 1280, 720, "yuv420p"
        st.options = {"crf": "16", "preset": "veryfast", "bf": "0"}
        st.time_base = Fraction(1, fps)
        for i in range(n):
            frame = render_target_frame(portrait, i / fps)
            faces = analyser.analyse_image(frame)
            if faces:
                tilt = 12.0 * np.sin(2 * np.pi * i / (2.0 * fps))   # the hand rocks a little
                frame, _ = open_hand(frame, faces[0].landmarks, analyser.topology, rng, float(tilt))
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts = i
            out.mux(st.encode(vf))
        out.mux(st.encode(None))
    analyser.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--config", default=None, help="preset for `swapstream run -c` (default: the default preset)")
    ap.add_argument("--hands-model", choices=("lite", "full"), default="lite")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--name", default="hands_cpu")
    args = ap.parse_args()
    from bench_run import run_summary
    from benchlib import cpu_name, gpu_name, run_fields, source_image

    work = Path(tempfile.mkdtemp(prefix="bench-hands-"))
    clip = work / "hand_720p30.mp4"
    frames = make_clip(clip, args.seconds)
    source = source_image(work)
    base = [sys.executable, "-m", "swapstream.cli", "run", "-s", str(source), "-i", str(clip), "-o", "null:", "-q",
            *(["-c", args.config] if args.config else []), "--set", f"mask.hands_model={args.hands_model}"]
    cases = {"off": ["--set", "mask.hands=false"], "on": ["--set", "mask.hands=true"]}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    for _ in range(args.repeat):
        for k, extra in cases.items():   # alternating, so both share the machine's state
            r = run_summary(base + extra)
            print(json.dumps({"hands": k, "fps": r["fps"], "frames": r["frames"],
                              "frames_swapped": r["frames_swapped"], "decode": r["decode"]}), flush=True)
            runs[k].append(r)
    fps = {k: statistics.median(r["fps"] for r in rs) for k, rs in runs.items()}
    ms = {k: 1000.0 / v for k, v in fps.items()}
    # The summary names the decoder "NVDEC (GPU)" on a GPU (bench_run keeps its first word).
    gpu = any(r["decode"].lower() == "nvdec" for rs in runs.values() for r in rs)
    device = gpu_name() if gpu else cpu_name()
    command = "python tools/bench_hands.py " + " ".join(sys.argv[1:])
    shown = " ".join(["swapstream run -s astronaut.png -i hand_720p30.mp4 -o null: -q"]
                     + base[base.index("-q") + 1:])
    fields = run_fields(device, command)
    rec = [{"metric": f"{args.name}_fps_hands_{k}", "value": fps[k], "unit": "fps", "stat": "median",
            "config": {"preset": args.config or "default", "hands_model": args.hands_model, "clip_frames": frames,
                       "repeat": args.repeat, "runs_fps": [r["fps"] for r in runs[k]],
                       "frames_swapped": [r["frames_swapped"] for r in runs[k]],
                       "decode": sorted({r["decode"] for r in runs[k]}),
                       "run_command": f"{shown} --set mask.hands={'true' if k == 'on' else 'false'}"},
            **fields} for k in cases]
    rec.append({"metric": f"{args.name}_ms_per_frame", "value": round(ms["on"] - ms["off"], 2), "unit": "ms",
                "stat": "difference of the medians", "config": {"hands_model": args.hands_model}, **fields})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    lines = [f"# mask.hands in swapstream run, {args.config or 'default'} preset, {args.hands_model} models "
             f"({device}, {fields['commit']}, {fields['date']})", "",
             f"Command: `{command}`. Each run: `{shown} --set mask.hands=false|true`, alternating, on a "
             f"{frames}-frame 720p30 clip with a hand of the face's own skin tone in front of the mouth in "
             "every frame. Encoding excluded; the figure is each run's own summary.", "",
             "| mask.hands | runs (fps) | median | ms per frame | frames swapped |", "|---|---|---|---|---|"]
    for k in cases:
        lines.append(f"| {k} | {', '.join(str(r['fps']) for r in runs[k])} | **{fps[k]} fps** | {ms[k]:.1f} | "
                     f"{'/'.join(str(r['frames_swapped']) for r in runs[k])} |")
    lines += ["", f"The hand models and the mask cost **{ms['on'] - ms['off']:.1f} ms a frame** here, one hand "
              "followed in every frame and the palm detector on its cadence (`mask.hands_detect_every`).", ""]
    (args.out / f"{args.name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
