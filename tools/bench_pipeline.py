"""File-mode pipeline benchmark: the CPU job and the GPU job (mesh swapper) on the same 1080p clip.

    python tools/bench_pipeline.py --out DIR [--seconds 4]     (on the GPU machine)

Reports, for each job: frames per second end to end (decode, analysis, swap, encode, audio copy) and
the host seconds spent per stage. Writes pipeline.json and pipeline.md into --out.
This is the first part of issue 5's benchmark: the host-bound peer-style path and the neural
variant, per-stage p50/p99 latencies and peak GPU memory are still to come.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from swapstream.config import load_config
from swapstream.demo import astronaut, grace_hopper, write_demo_clip
from swapstream.gpu.job import GpuFileJob
from swapstream.pipeline import FileJob


def run(cls: type, clip: Path, out: Path) -> tuple[Any, dict[str, float]]:
    job = cls(load_config())
    try:
        job.set_source_image(astronaut(), "astronaut")
        stats = job.run(clip, out)
        return stats, getattr(job, "stage_seconds", {})
    finally:
        job.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    common = {"device": os.environ.get("DEVICE_NAME", "GPU machine"), "commit": os.environ.get("GIT_SHA", "unknown"),
              "date": dt.date.today().isoformat(), "command": "python tools/bench_pipeline.py"}
    records = []
    lines = ["# File-mode pipeline, 1080p demo clip, one face, mesh swapper", "",
             f"`{common['command']}`, commit {common['commit']}, {common['date']}.", "",
             "| job | frames | fps (end to end, incl. x264) | host s: analyse | submit (upload+swap+download launch) | encode (incl. wait) |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "clip.mp4"
        write_demo_clip(clip, grace_hopper(), seconds=args.seconds, size=(1920, 1080))
        for name, cls in (("cpu_job", FileJob), ("gpu_job", GpuFileJob)):
            stats, stages = run(cls, clip, Path(tmp) / f"{name}.mp4")
            records.append({"metric": f"{name}_fps_1080p", "value": round(stats.fps, 2), "unit": "fps",
                            "stat": "mean", "config": {"frames": stats.frames, "stages_s": stages}, **common})
            lines.append(f"| {name} | {stats.frames} | {stats.fps:.1f} | {stages.get('analyse', float('nan')):.2f} "
                         f"| {stages.get('submit', float('nan')):.2f} | {stages.get('encode', float('nan')):.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.out / "pipeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
