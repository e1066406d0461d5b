"""`swapstream run` as users run it, timed by its own summary: the median of several runs.

    python tools/bench_run.py --clip .bench/streams_1080p30.mp4 [--repeat 3] [--swapper inswapper_128]
        [--synthetic-models] [--config PRESET] [--set key=value ...] [--out docs/benchmarks] [--name run_gpu]
        [--only file|null] [--baseline-tree DIR --baseline-label REV] [--variant LABEL:key=value[,key=value]]
        [--append]

Each run is one `swapstream run -s SOURCE -i CLIP -o OUT -q` process (the built-in astronaut as
the source face). Each round runs it twice: `-o OUT.mp4`, encoding included (the command writes its
file with the encoder it picks: NVENC where the GPU has one, else x264), and `-o null:`, the same
job with encoding excluded (frames still labelled and marked, nothing downloaded or encoded). The
figure is the run's own summary line (`speed N fps`, frames over the loop's wall time, model loading
excluded), the decoder is the summary's `decode` line, and the file is decoded back to check its
frame count. With `--synthetic-models` the neural swapper is the full-size inswapper architecture
with random weights (speed is the real model's; the output is not a likeness). With
`--baseline-tree`, another revision's `swapstream run` (its tree: a checkout, or `git archive REV
stream kernels engines configs` unpacked) runs in each round too, with encoding excluded, so that a
change in speed can be told from a change in the machine. Each `--variant` is this tree's run with
encoding excluded and further settings (e.g. `--variant gil0.2:runtime.switch_interval_ms=0.2`),
in the same rounds: settings compared on one machine state. With a baseline, the record gives each
round's figure over the baseline's in that round (the machine's drift cancels there). `--append`
adds this call's rounds to the record an earlier call of the same benchmark wrote (same clip,
preset, outputs, commit and device), so that several device calls, each within its time limit, make
one record of all their rounds.
Writes `<out>/<name>.json` and `<out>/<name>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from benchlib import device_name, git_sha, package_links, set_flags, source_image  # noqa: E402


def run_summary(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Run one `swapstream run` command; its summary's speed, frames and frames swapped (exits with
    the command's output if it failed or printed no summary)."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    fps = re.search(r"speed\s+([\d.]+) fps", p.stdout)
    frames = re.search(r"frames\s+(\d+)\s", p.stdout)
    swapped = re.search(r"frames swapped\s+(\d+)", p.stdout)
    decode = re.search(r"decode\s+(\S+)", p.stdout)
    if not (fps and frames and swapped):
        sys.exit(f"error: no summary in the output of {' '.join(cmd)}:\n{p.stdout[-3000:]}")
    # Each stage's time a frame (`stage ms/frame`; `loop ms/frame` in revisions before the run was a
    # runtime stream); a long row may wrap.
    loop = re.search(r"(?:stage|loop) ms/frame\s+((?:[a-z-]+ [\d.]+\s*)+)", p.stdout)
    steps = {k: float(v) for k, v in re.findall(r"([a-z-]+) ([\d.]+)", loop.group(1))} if loop else {}
    # Each frame's time from the decoder to the encoder (absent from revisions before it was printed).
    lat = re.search(r"latency ms\s+p50 ([\d.]+) p99 ([\d.]+) max ([\d.]+)", p.stdout)
    latency = dict(zip(("p50", "p99", "max"), map(float, lat.groups()))) if lat else {}
    slow = re.search(r"slowest step\s+([a-z-]+) ([\d.]+) ms, (\d+) frames taken", p.stdout)
    slowest = {"step": slow.group(1), "ms": float(slow.group(2)), "frames_taken": int(slow.group(3))} if slow else {}
    return {"fps": float(fps.group(1)), "frames": int(frames.group(1)), "frames_swapped": int(swapped.group(1)),
            "decode": decode.group(1) if decode else "?", "loop_ms": steps, "latency_ms": latency,
            "slowest": slowest,
            "summary": p.stdout.strip().splitlines()[-15:]}


def run_setup(work: Path, *, config: str | None, swapper: str, synthetic: bool,
              sets: list[str]) -> tuple[Path, list[str]]:
    """What each timed `swapstream run` takes: the source image (the built-in astronaut, written into
    `work`) and the options after `-q`; with `synthetic`, the full-size inswapper architecture with
    random weights, written into `work/models` (bench_pipeline.write_synthetic_models)."""
    source = source_image(work)
    opts = (["-c", config] if config else []) + set_flags([f"swapper={swapper}", *sets])
    if synthetic:
        from bench_pipeline import write_synthetic_models

        write_synthetic_models(work / "models")
        opts += ["--set", f"models_dir={work / 'models'}", "--set", "neural.download=false", "--accept-licence"]
    return source, opts


def run_command(source: Path, clip: Path, output: str, opts: list[str]) -> list[str]:
    """`swapstream run` on `clip` into `output` (a file, or `null:`), quiet, as a subprocess command."""
    return [sys.executable, "-m", "swapstream.cli", "run", "-s", str(source), "-i", str(clip), "-o", output, "-q", *opts]


def baseline_env(tree: Path, work: Path) -> dict[str, str]:
    """The environment that runs another revision's `swapstream` (benchlib.package_links), first on
    the path, before what PYTHONPATH already holds (the GPU machine's carried wheels)."""
    shim = work / "baseline-shim"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    package_links(tree, shim, env)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--swapper", default="inswapper_128")
    ap.add_argument("--only", choices=("file", "null"), default=None, help="run one output only")
    ap.add_argument("--config", default=None, help="preset for `swapstream run -c` (default: the default preset)")
    ap.add_argument("--synthetic-models", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--name", default="run_gpu")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="a checkout (or `git archive` of stream/, kernels/, engines/, configs/) of another revision: "
                         "its `swapstream run` is timed too, in the same rounds, with encoding excluded")
    ap.add_argument("--baseline-label", default="baseline", help="what the record calls that revision")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:key=value[,key=value]",
                    help="also time this tree with encoding excluded and these settings, in the same rounds")
    ap.add_argument("--append", action="store_true",
                    help="add this call's rounds to the record an earlier call of the same benchmark wrote")
    args = ap.parse_args()
    variants = parse_variants(args.variant)
    if args.baseline_tree is not None and args.baseline_label in variants:
        sys.exit(f"error: --baseline-label '{args.baseline_label}' is also a --variant's label; give them two")
    if not args.clip.is_file():
        sys.exit(f"error: no clip at '{args.clip}': make it with python tools/make_bench_clips.py")
    import av

    work = Path(tempfile.mkdtemp(prefix="bench-run-"))
    source, opts = run_setup(work, config=args.config, swapper=args.swapper, synthetic=args.synthetic_models,
                             sets=args.set)
    with av.open(str(args.clip)) as c:
        clip_frames = c.streams.video[0].frames
    # Both outputs in each round, alternating, so the two figures share the machine's state.
    modes = {"file": "with x264 (the file written)", "null": "encoding excluded (-o null:)"}
    if args.only:
        modes = {args.only: modes[args.only]}
    envs: dict[str, dict[str, str] | None] = {m: None for m in modes}
    extra: dict[str, list[str]] = {m: [] for m in modes}
    for label, sets in variants.items():
        modes[f"null_{label}"] = f"encoding excluded (-o null:), {label}: {', '.join(sets)}"
        envs[f"null_{label}"], extra[f"null_{label}"] = None, set_flags(sets)
    if args.baseline_tree is not None:
        # The other revision runs in the same rounds, after this one's, with encoding excluded: the
        # two figures then share the machine's state (a run-to-run drift shows in both).
        base = f"null_{args.baseline_label}"
        modes[base] = f"encoding excluded (-o null:), {args.baseline_label}"
        envs[base], extra[base] = baseline_env(args.baseline_tree, work), []
    device = device_name()
    shown = " ".join(["swapstream run -s astronaut.png -i", args.clip.name, "-o out.mp4|null: -q"]
                     + [o if " " not in o else repr(o) for o in opts]).replace(str(work), "WORK")
    command = "python tools/bench_run.py " + " ".join(sys.argv[1:])
    date = datetime.date.today().isoformat()
    info = RecordInfo(git_sha(), device, shown, command, date, clip_frames, modes)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    if args.append:
        runs, info = earlier_rounds(args, info)
    done = len(runs[next(iter(modes))])
    call = 1 + max((r["call"] for rs in runs.values() for r in rs), default=0)
    for i in range(args.repeat):
        for mode in modes:
            out = work / f"out{i}.mp4"
            cmd = run_command(source, args.clip, str(out) if mode == "file" else "null:", opts + extra[mode])
            t0 = time.monotonic()
            r = run_summary(cmd, env=envs[mode])
            if mode == "file":
                with av.open(str(out)) as c:
                    r["frames_written"] = sum(1 for _ in c.decode(video=0))
                out.unlink()
            else:
                r["frames_written"] = 0
            r["mode"], r["call"] = mode, call
            # The process's whole time (start, models, warm-up, the clip, exit): what a device call
            # must budget for each run.
            r["process_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps({k: v for k, v in r.items() if k != "summary"}), flush=True)
            runs[mode].append(r)
        # After every round: a call stopped by its time limit still leaves the rounds it finished.
        write_record(args, runs, done + i + 1, done + args.repeat, info)
    print((args.out / f"{args.name}.md").read_text())


RUN_FIELDS = {"fps": "runs_fps", "frames": "frames", "frames_written": "frames_written",
              "frames_swapped": "frames_swapped", "loop_ms": "loop_ms_per_frame", "latency_ms": "latency_ms",
              "slowest": "slowest_step", "process_s": "process_s", "call": "calls"}
"""A run's figures -> the record's list of them, one entry a run."""


def earlier_rounds(args: argparse.Namespace, info: RecordInfo) -> tuple[dict[str, list[dict[str, Any]]], RecordInfo]:
    """`--append`: the runs of the record at `<out>/<name>.json`, by output, and the record's info
    with its commands before this one (exits if there is none, or it is of another benchmark)."""
    path = args.out / f"{args.name}.json"
    if not path.is_file():
        sys.exit(f"error: --append: no record at '{path}' to add rounds to; run once without --append first")
    try:
        recs = json.loads(path.read_text())
        by_output = {r["config"]["output"]: r for r in recs}
        first = recs[0]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        sys.exit(f"error: --append: '{path}' is not a record of tools/bench_run.py ({e}); move it away or "
                 f"give another --name")
    theirs = {"outputs": sorted(by_output), "clip": first["config"]["clip"], "preset": first["config"]["preset"],
              "commit": first["commit"], "device": first["device"]}
    ours = {"outputs": sorted(info.modes.values()), "clip": args.clip.name, "preset": args.config or "default",
            "commit": info.commit or "unknown", "device": info.device}
    differ = [f"{k} {theirs[k]} against {ours[k]}" for k in theirs if theirs[k] != ours[k]]
    if differ:
        sys.exit(f"error: --append: the record at '{path}' is of another benchmark ({'; '.join(differ)}): its "
                 f"rounds cannot be counted with this call's; give another --name")
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode, text in info.modes.items():
        c = by_output[text]["config"]
        n = len(c["runs_fps"])
        columns = {k: c[key] if key in c else [1] * n for k, key in RUN_FIELDS.items()}  # `calls`: since --append
        runs[mode] = [{k: col[i] for k, col in columns.items()}
                      | {"decode": "/".join(c["decode"]), "mode": mode, "summary": []} for i in range(n)]
    return runs, replace(info, command=f"{first['command']}; then {info.command}", date=first["date"])


def baseline_ratios(runs: dict[str, list[dict[str, Any]]], mode: str, base: str | None) -> list[float]:
    """Each round's fps of `mode` over the baseline's in the same round (empty without a baseline)."""
    if base is None or mode == base:
        return []
    return [round(a["fps"] / b["fps"], 3) for a, b in zip(runs[mode], runs[base])]


def parse_variants(specs: list[str]) -> dict[str, list[str]]:
    """`--variant LABEL:key=value[,key=value]` -> {label: ["key=value", ...]} (exits on a bad one)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        label, _, sets = spec.partition(":")
        pairs = [p.strip() for p in sets.split(",") if p.strip()]
        if not re.fullmatch(r"[\w.-]+", label) or not pairs or any("=" not in p for p in pairs):
            sys.exit(f"error: --variant '{spec}': write it as LABEL:key=value[,key=value], the label letters, "
                     f"digits, '.', '-' or '_' (e.g. gil0.2:runtime.switch_interval_ms=0.2)")
        if label in out or label in ("file", "null"):
            sys.exit(f"error: --variant '{spec}': the label '{label}' is taken; give each variant its own")
        out[label] = pairs
    return out


@dataclass(frozen=True)
class RecordInfo:
    """What every rewrite of the record says besides the runs."""

    commit: str
    device: str
    shown: str
    """The `swapstream run` command line as the record shows it."""
    command: str
    date: str
    clip_frames: int
    modes: dict[str, str]
    """Output mode -> how the record describes it."""


def write_record(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], rounds: int, asked: int,
                 info: RecordInfo) -> None:
    """Write `<out>/<name>.json` and `.md` from the runs of the rounds finished so far (`asked`: the
    rounds earlier calls finished, `--append`, and the rounds this call asks for)."""
    commit, device, shown, command = info.commit, info.device, info.shown, info.command
    date, clip_frames, modes = info.date, info.clip_frames, info.modes
    fps = {m: statistics.median(r["fps"] for r in rs) for m, rs in runs.items()}
    base = f"null_{args.baseline_label}" if f"null_{args.baseline_label}" in modes and args.baseline_tree else None
    rec = [{"metric": f"{args.name}_fps" + {"file": "", "null": "_no_encode"}.get(m, f"_no_encode_{m[len('null_'):]}"),
            "value": fps[m], "unit": "fps",
            "stat": "median" if rounds == asked else f"median of the {rounds} rounds finished (of {asked})",
            "config": {"preset": args.config or "default", "clip": args.clip.name, "clip_frames": clip_frames, "repeat": asked, "rounds_completed": rounds, "output": modes[m],
                       "decode": sorted({r["decode"] for r in runs[m]}),
                       "runs_fps": [r["fps"] for r in runs[m]],
                       "frames": [r["frames"] for r in runs[m]],
                       "frames_written": [r["frames_written"] for r in runs[m]],
                       "frames_swapped": [r["frames_swapped"] for r in runs[m]],
                       "loop_ms_per_frame": [r["loop_ms"] for r in runs[m]],
                       "latency_ms": [r["latency_ms"] for r in runs[m]],
                       "slowest_step": [r["slowest"] for r in runs[m]],
                       "process_s": [r["process_s"] for r in runs[m]],
                       "calls": [r["call"] for r in runs[m]],
                       "over_baseline_per_round": baseline_ratios(runs, m, base), "run_command": shown},
            "device": device, "commit": commit or "unknown", "date": date, "command": command}
           for m in modes]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    lines = [f"# swapstream run, {args.config or 'default'} preset ({device}, {commit}, {date})", "",
             f"Command: `{command}`; each run: `{shown}`. The outputs (and the baseline, if any) "
             "alternate, one of each per round, in one process tree on one machine.", "",
             "| output | decode | runs (fps, each run's summary) | median | frames | frames written | frames swapped |",
             "|---|---|---|---|---|---|---|"]
    if rounds < asked:
        lines[2:2] = [f"**{rounds} of the {asked} rounds asked for finished** (the record is rewritten after "
                      "each round; this one was stopped before the rest).", ""]
    for m, text in modes.items():
        rs = runs[m]
        lines.append(f"| {text} | {', '.join(sorted({r['decode'] for r in rs}))} | "
                     f"{', '.join(str(r['fps']) for r in rs)} | **{fps[m]} fps** | "
                     f"{'/'.join(str(r['frames']) for r in rs)} | {'/'.join(str(r['frames_written']) for r in rs)} | "
                     f"{'/'.join(str(r['frames_swapped']) for r in rs)} |")
    lines += ["", ("Each stage's time a frame, median of the runs (a run's summary prints it as `stage ms/frame`; "
                   "the stages run in threads of their own and overlap; `queue` is a decoded frame's wait for the "
                   "analysis; revisions before the runtime printed their loop's steps as `loop ms/frame`):"), ""]
    for m, text in modes.items():
        keys = list(runs[m][0]["loop_ms"])
        cells = [f"{k} {statistics.median(r['loop_ms'].get(k, 0.0) for r in runs[m]):.2f}" for k in keys]
        lines.append(f"- {text}: {', '.join(cells) if cells else 'not printed by this revision'}")
        slow = [f"{r['slowest']['step']} {r['slowest']['ms']} ms, {r['slowest']['frames_taken']} frames taken"
                for r in runs[m] if r["slowest"]]
        if slow:
            lines.append(f"  - the longest single step of each run: {'; '.join(slow)}")
    if base is not None:
        lines += ["", f"Each round's figure over {args.baseline_label}'s in the same round (the machine's drift "
                      "between rounds cancels here):", ""]
        for m, text in modes.items():
            if m != base:
                ratios = baseline_ratios(runs, m, base)
                lines.append(f"- {text}: {', '.join(f'{r:.2f}' for r in ratios)} "
                             f"(median {statistics.median(ratios):.2f})")
    if len({r["call"] for rs in runs.values() for r in rs}) > 1:
        lines += ["", "The rounds came from more than one call (`--append`); each run's call is in the JSON (`calls`)."]
    lines += ["", "The last run's summary:", "", "```", *runs[list(modes)[0]][-1]["summary"], "```", ""]
    (args.out / f"{args.name}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
