"""CPU pipeline benchmark on the demo clip: per-stage times and end-to-end fps at 720p.

    python tools/bench_cpu.py [--seconds 4] [--out docs/benchmarks]

Writes `cpu_pipeline.json` (records as docs/performance.md, "Benchmark records", describes) and
`cpu_pipeline.md` into --out.
Stages are timed with perf_counter around each call, one frame at a time, single process.
"""

from __future__ import annotations

import sys

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from swapstream.config import load_config
from swapstream.demo import astronaut, grace_hopper, write_demo_clip
from swapstream.face.analyser import FaceAnalyser
from swapstream.io.video import AudioPacket, VideoReader, VideoWriter, probe
from swapstream.pipeline import SYNTHETIC_TAGS
from swapstream.swap.mesh import MeshSwapper, source_face
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, run_fields  # noqa: E402



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args()
    cfg = load_config()
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "target.mp4"
        n = write_demo_clip(clip, grace_hopper(), seconds=args.seconds)
        analyser = FaceAnalyser(cfg)
        swapper = MeshSwapper(cfg.mesh, analyser.topology)
        src = astronaut()
        swapper.set_source(src, source_face(analyser.analyse_image(src), "astronaut"))
        info = probe(clip)
        times: dict[str, list[float]] = {"decode": [], "analyse": [], "swap": [], "encode": []}
        t_start = time.perf_counter()
        with VideoReader(clip) as reader, VideoWriter(
                Path(tmp) / "out.mp4", width=info.width, height=info.height,
                time_base=info.time_base, rate=info.avg_rate, crf=cfg.encode.crf,
                preset=cfg.encode.preset, audio_from=reader.audio_stream,
                metadata=SYNTHETIC_TAGS) as writer:
            it = iter(reader)
            while True:
                t0 = time.perf_counter()
                item = next(it, None)
                t1 = time.perf_counter()
                if item is None:
                    break
                if isinstance(item, AudioPacket):
                    writer.write_audio(item)
                    continue
                times["decode"].append(t1 - t0)
                faces = analyser.track(item)
                t2 = time.perf_counter()
                swapper.swap(item.data, faces)
                t3 = time.perf_counter()
                writer.write(item)
                t4 = time.perf_counter()
                times["analyse"].append(t2 - t1)
                times["swap"].append(t3 - t2)
                times["encode"].append(t4 - t3)
        total = time.perf_counter() - t_start
    frames = len(times["swap"])
    assert frames == n, f"decoded {frames} of {n} frames"
    common = {**run_fields(cpu_name(), "python tools/bench_cpu.py"),
              "config": {"size": "1280x720", "frames": frames, "faces": 1, "swapper": "mesh",
                         "preset": cfg.encode.preset}}
    records = []
    for stage, v in times.items():
        ms = np.array(v) * 1e3
        for stat, val in (("p50", np.median(ms)), ("p99", np.percentile(ms, 99)), ("mean", ms.mean())):
            records.append({"metric": f"cpu_{stage}_720p", "value": round(float(val), 2), "unit": "ms",
                            "stat": stat, **common})
    records.append({"metric": "cpu_file_job_fps_720p", "value": round(frames / total, 2), "unit": "fps",
                    "stat": "mean", **common})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_pipeline.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# CPU pipeline, 720p demo clip ({frames} frames, one face)", "",
             f"`{common['command']}` on {common['device']}, commit {common['commit']}, {common['date']}.",
             "", "| stage | p50 ms | p99 ms | mean ms |", "|---|---|---|---|"]
    for stage in times:
        vals = {r["stat"]: r["value"] for r in records if r["metric"] == f"cpu_{stage}_720p"}
        lines.append(f"| {stage} | {vals['p50']} | {vals['p99']} | {vals['mean']} |")
    lines += ["", f"End to end (decode, analyse, swap, encode, audio copy): **{frames / total:.1f} fps**.", ""]
    (args.out / "cpu_pipeline.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
