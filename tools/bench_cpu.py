"""CPU pipeline benchmark at 720p: the product's own commands, this tree against an older commit.

    python tools/bench_cpu.py [--baseline-rev 1363276] [--clip .bench/streams_720p30.mp4]
                              [--repeat 2] [--max-load 0.8] [--out docs/benchmarks]
                              [--cases run_default,run_live_preset,live] [--name cpu_pipeline]
                              [--set KEY=VALUE ...] [--baseline-set KEY=VALUE ...]

Three cases, each as a user runs it, with the invisible mark and the visible label on:

- `run`, default preset: `swapstream run -s SOURCE -i CLIP -o OUT -q --set disclosure.label_files=true`
  (files are not labelled by default; the label is turned on so that every case pays for it). The
  figure is the fps `run` prints in its summary (frames over the time from the first decoded frame
  to the last one written, model loading left out).
- `run`, live preset: the same with `-c live` (detection every 5 frames, x264 `ultrafast`).
- `live`: the job `swapstream live -s SOURCE -i CLIP --hls-dir DIR` builds (`cli._live_job_class`),
  playing the clip in real time into an HLS folder. The CLI's summary has no clock, so a small
  driver builds the job as the CLI does and reads its `LiveStats`: delivered fps is the output
  frames over the span of their hand-over times, and frames dropped to keep up are counted.

Every case runs on the working tree and on a `git worktree` of `--baseline-rev` (by default
1363276: the code before issue 20's commits, and before issue 19's), alternately, in separate
processes, `--repeat` times; the median is reported. The baseline's `swapstream` package is made
to import from its worktree by a folder of symbolic links put first on PYTHONPATH (the venv's
editable install points at this tree); the live driver checks where it imported from.
With `--max-load`, the run waits (up to `--wait` s) until the 1-minute load average is below it
before its first command; the load average is recorded then and before every command (the
benchmark's own commands raise it: the before-the-run figure is the one that says the machine was
quiet).

`--set` and `--baseline-set` add configuration overrides to this tree's and the baseline's
commands: with `--baseline-rev HEAD` the two columns are one code base in two configurations (e.g.
`--set watermark.scheme=v2`: what the v2 mark costs the CPU live path, docs/benchmarks/
watermark_v2_cpu_live.md).

Writes `cpu_pipeline.json` (records as docs/performance.md, "Benchmark records", describes) and
`cpu_pipeline.md` into --out. The clip is the one tools/make_bench_clips.py makes (12 s of the demo's
animated portrait, 1280x720, 30 fps, H.264 without B-frames, AAC).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import run_summary  # noqa: E402
from benchlib import cpu_name, package_links, run_fields, set_flags, source_image  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIP = ROOT / ".bench" / "streams_720p30.mp4"

# Builds the live job exactly as `swapstream live` does (preset `live`, the CLI's job class), runs it
# on a file played in real time into HLS, and prints its figures as one JSON line. It is the same
# text for both trees: it uses only what `cli.py` and `LiveStats` had before issue 20.
LIVE_DRIVER = r"""
import json, statistics, sys
from pathlib import Path
import swapstream
from swapstream.cli import _config, _live_job_class
source, clip, hls = sys.argv[1], sys.argv[2], Path(sys.argv[3])
cfg = _config("live", json.loads(sys.argv[4]) if len(sys.argv) > 4 else [], None)
job = _live_job_class(cfg)(cfg)
try:
    job.set_source(Path(source))
    stats = job.run_live(clip, hls_dir=hls)
finally:
    job.close()
t = list(stats.out_times)
span = t[-1] - t[0] if len(t) > 1 else 0.0
print("LIVE " + json.dumps({
    "frames_in": stats.frames_in, "frames_out": stats.frames_out, "dropped": stats.dropped,
    "faces_swapped": stats.faces_swapped, "audio_packets": stats.audio_packets,
    "delivered_fps": (len(t) - 1) / span if span > 0 else 0.0,
    "latency_p50_ms": statistics.median(stats.latency_ms) if stats.latency_ms else None,
    "package": swapstream.__file__, "job": type(job).__name__}))
"""


CASES = {"run_default": "`swapstream run`, default preset (x264 `veryfast`, CRF 20)",
         "run_live_preset": "`swapstream run -c live` (x264 `ultrafast`, detection every 5 frames)",
         "live": "`swapstream live`, file played in real time into HLS"}


@dataclass
class Tree:
    """A tree of the code to run: this checkout, or a worktree of an older commit."""

    label: str
    rev: str
    pythonpath: str | None
    """A folder to put first on PYTHONPATH (the baseline's shim), or None for this checkout."""
    sets: list[str] = field(default_factory=list)
    """Configuration overrides (KEY=VALUE) for this tree's commands."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


@dataclass
class Case:
    name: str
    title: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def make_baseline(rev: str, tmp: Path, sets: list[str]) -> Tree:
    """A detached worktree of `rev` and a `swapstream` package of links into it
    (benchlib.package_links)."""
    wt = tmp / "baseline"
    git("worktree", "add", "--detach", str(wt), rev)
    tree = Tree("baseline", git("rev-parse", "--short", rev), str(tmp / "shim"), sets)
    # The `swapstream` script and `python -c` must import the worktree's code, not this tree's.
    package_links(wt, tmp / "shim", tree.env())
    return tree


def wait_for_quiet(max_load: float | None, wait_s: float) -> float:
    """The 1-minute load average now, after waiting up to `wait_s` for it to drop below `max_load`."""
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()[0]
    while max_load is not None and load >= max_load and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    return load


def swapstream_cmd() -> list[str]:
    """The venv's `swapstream` script (the one users run), else the module."""
    script = Path(sys.executable).parent / "swapstream"
    return [str(script)] if script.exists() else [sys.executable, "-m", "swapstream.cli"]


def run_file(tree: Tree, preset: str | None, source: Path, clip: Path, out: Path) -> dict[str, Any]:
    opts = (["-c", preset] if preset else []) + set_flags(["disclosure.label_files=true", *tree.sets]) + ["-q"]
    cmd = swapstream_cmd() + ["run", "-s", str(source), "-i", str(clip), "-o", str(out)] + opts
    r = run_summary(cmd, env=tree.env(), cwd=ROOT)
    return {"fps": r["fps"], "frames": r["frames"], "frames_swapped": r["frames_swapped"],
            "command": " ".join(["swapstream run -s", source.name, "-i", clip.name, "-o out.mp4"] + opts)}


def run_live(tree: Tree, source: Path, clip: Path, hls: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-c", LIVE_DRIVER, str(source), str(clip), str(hls), json.dumps(tree.sets)]
    p = subprocess.run(cmd, env=tree.env(), capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in p.stdout.splitlines() if x.startswith("LIVE ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"{tree.label}: live driver failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    res = json.loads(line[5:])
    expected = "/baseline/" if tree.pythonpath else str(ROOT)
    if expected not in str(Path(res["package"]).resolve()):
        raise SystemExit(f"{tree.label}: imported swapstream from {res['package']}, not its tree")
    res["command"] = (" ".join(["swapstream live -s", source.name, "-i", clip.name, "--hls-dir DIR",
                                *set_flags(tree.sets)]) + " "
                      "(job built as the CLI does: tools/bench_cpu.py LIVE_DRIVER)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-rev", default="1363276",
                    help="commit to compare with (default: the code before issue 20's CPU work)")
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each case per tree (median reported)")
    ap.add_argument("--max-load", type=float, default=None,
                    help="wait before the first command until the 1-minute load average is below this")
    ap.add_argument("--wait", type=float, default=300.0, help="longest wait for --max-load, seconds")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--name", default="cpu_pipeline", help="the records' file names (NAME.json, NAME.md)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"which of {', '.join(CASES)} to run")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration override for this tree's commands (repeatable)")
    ap.add_argument("--baseline-set", dest="baseline_sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration override for the baseline's commands (repeatable)")
    args = ap.parse_args()
    wanted = [c for c in args.cases.split(",") if c]
    if not wanted or any(c not in CASES for c in wanted):
        sys.exit(f"error: --cases '{args.cases}': choose from {', '.join(CASES)}")
    # A SIGTERM (a stopped job) unwinds like Ctrl+C, so that the worktree is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench_cpu: terminated"))
    if not args.clip.is_file():
        sys.exit(f"error: no clip at '{args.clip}': make it with python tools/make_bench_clips.py")
    command = "python tools/bench_cpu.py " + " ".join(sys.argv[1:])
    wait_for_quiet(args.max_load, args.wait)
    load_start = os.getloadavg()
    if args.max_load is not None and load_start[0] >= args.max_load:
        sys.exit(f"error: the 1-minute load average stayed at {load_start[0]:.2f} (>= {args.max_load}) "
                 f"for {args.wait:.0f} s: not measuring on a busy machine")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "stream", "kernels",
                     "engines", "configs"))
    cases = [Case(name, CASES[name]) for name in CASES if name in wanted]
    with tempfile.TemporaryDirectory(prefix="bench_cpu_") as tmpdir:
        tmp = Path(tmpdir)
        source = source_image(tmp)
        trees = [Tree("new", git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else ""), None, args.sets)]
        try:
            trees.append(make_baseline(args.baseline_rev, tmp, args.baseline_sets))
            for rep in range(args.repeat):
                for case in cases:
                    # Alternate which tree goes first, so that neither always runs on a warmer machine.
                    for tree in trees if rep % 2 == 0 else trees[::-1]:
                        load = os.getloadavg()[0]
                        work = tmp / f"{case.name}_{tree.label}_{rep}"
                        work.mkdir()
                        if case.name == "live":
                            res = run_live(tree, source, args.clip, work)
                        else:
                            res = run_file(tree, "live" if case.name == "run_live_preset" else None,
                                           source, args.clip, work / "out.mp4")
                        res["load_before"] = round(load, 2)
                        case.runs.setdefault(tree.label, []).append(res)
                        print(f"{case.name:16s} {tree.label:8s} load {load:4.2f}  " + ", ".join(
                            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items()
                            if k not in ("command", "package")), flush=True)
        finally:
            if len(trees) > 1:
                git("worktree", "remove", "--force", str(tmp / "baseline"))
    write_records(args, cases, trees, command, load_start, dirty)


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def write_records(args: argparse.Namespace, cases: list[Case], trees: list[Tree], command: str,
                  load_start: tuple[float, float, float], dirty: bool) -> None:
    common = run_fields(cpu_name(), command)
    revs = {t.label: t.rev for t in trees}
    sets_of = {t.label: t.sets for t in trees}
    records: list[dict[str, Any]] = []
    metrics = {"run_default": [("cpu_run_default_preset_fps_720p", "fps", "fps")],
               "run_live_preset": [("cpu_run_live_preset_fps_720p", "fps", "fps")],
               "live": [("cpu_live_delivered_fps_720p", "delivered_fps", "fps"),
                        ("cpu_live_dropped_frames_720p", "dropped", "frames"),
                        ("cpu_live_latency_p50_720p", "latency_p50_ms", "ms")]}
    for case in cases:
        for metric, key, unit in metrics[case.name]:
            for label, runs in case.runs.items():
                records.append({
                    "metric": metric + ("_baseline" if label == "baseline" else ""),
                    "value": round(median_of(runs, key), 2), "unit": unit, "stat": "median", **common,
                    "config": {"size": "1280x720", "fps_in": 30, "clip": args.clip.name, "faces": 1,
                               "swapper": "mesh", "tree": label,
                               # On unless an override turned them off (the label is turned on for files).
                               "watermark": "watermark.enabled=false" not in sets_of[label],
                               "label": not ({"disclosure.label_live=false", "disclosure.label_files=false"}
                                             & set(sets_of[label])),
                               "rev": revs[label], "uncommitted_changes": dirty and label == "new",
                               "sets": sets_of[label],
                               "runs": [r[key] for r in runs],
                               "load_before": [r["load_before"] for r in runs],
                               "case_command": runs[0]["command"]}})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(records, indent=1) + "\n")

    def fig(case: Case, label: str, key: str, digits: int = 1) -> str:
        runs = case.runs.get(label, [])
        return f"{median_of(runs, key):.{digits}f}" if runs else "-"

    def named(label: str) -> str:
        return revs[label] + "".join(f" `{v}`" for v in sets_of[label])

    new, old = named("new"), named("baseline")
    lines = [f"# CPU pipeline at 720p: `run` and `live` against {old}", "",
             f"`{command}` on {common['device']}, {common['date']}: this tree (commit {new}) against "
             f"a worktree of {old}, {args.repeat} runs of each case per tree, alternately; medians. "
             f"Load average before the run: {' / '.join(f'{x:.2f}' for x in load_start)} (1 / 5 / 15 min).",
             "", f"Clip: `{args.clip.name}` (tools/make_bench_clips.py): 12 s, 1280x720 at 30 fps, one "
             f"face, AAC. Source: the shipped astronaut portrait. Watermark and label on in every case.",
             "", f"| case | {old} | {new} | target |", "|---|---|---|---|"]
    targets = {"run_default": "≥ 15 fps", "run_live_preset": "(none)", "live": "≥ 30 fps, real time"}
    for case in cases:
        if case.name == "live":
            cell = {lb: (f"{fig(case, lb, 'delivered_fps')} fps, {fig(case, lb, 'dropped', 0)} of "
                         f"{fig(case, lb, 'frames_in', 0)} frames dropped, latency p50 "
                         f"{fig(case, lb, 'latency_p50_ms', 0)} ms") for lb in ("baseline", "new")}
        else:
            cell = {lb: f"{fig(case, lb, 'fps')} fps" for lb in ("baseline", "new")}
        lines.append(f"| {case.title} | {cell['baseline']} | {cell['new']} | {targets[case.name]} |")
    same = git("rev-parse", revs["baseline"]) == git("rev-parse", "HEAD") and not dirty
    differ = ("The two columns run the same code; only their configuration overrides differ." if same else
              f"The two trees do not do the same work per face: {old}'s mesh swapper has no occlusion "
              "mask and no source-validity step, which this tree adds (issue 20)." if args.baseline_rev == "1363276"
              else f"The two columns are two revisions, {old} and {new}.")
    lines += ["", differ + " Live: frames in, out "
              "and dropped are the job's own counts; delivered fps is the output frames over the span "
              "of their hand-over to the encoder; latency is from a frame's arrival (decoded) to that "
              "hand-over.", "", "Every run (load average before it):", ""]
    for case in cases:
        for label, runs in case.runs.items():
            key = "delivered_fps" if case.name == "live" else "fps"
            vals = ", ".join(f"{r[key]:.1f} ({r['load_before']:.2f})" for r in runs)
            lines.append(f"- {case.name}, {label} ({named(label)}): {vals}")
    lines += ["", "Commands (the live case's job is built by `tools/bench_cpu.py`'s driver exactly as "
              "`swapstream live` builds it, to read its clock):", ""]
    for case in cases:
        runs = case.runs.get("new") or next(iter(case.runs.values()))
        lines.append(f"- `{runs[0]['command']}`")
    lines.append("")
    (args.out / f"{args.name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
