"""Where `swapstream run`'s threads spend a frame: py-spy samples of the command users run.

    python tools/profile_run.py --clip .bench/streams_1080p30.mp4 [--swapper inswapper_128]
        [--synthetic-models] [--config live] [--set key=value ...] [--rate 1000] [--out DIR] [--name run_profile]

A diagnostic beside `bench_run.py` (which gives the figures): the same `swapstream run -o null:`
(encoding excluded) runs twice under py-spy (`--nonblocking`, so the process is not paused to be
read): once sampling the threads that hold the GIL, once the threads that are on a CPU (py-spy
counts a thread that is runnable, waiting for a core, as on a CPU too). Each
thread's samples over the clip's frames give its milliseconds a frame with the GIL, and on a CPU;
the GIL's share of the loop is every thread's GIL samples over the loop's wall time (the run's
summary `time`). Samples of set-up work (models, warm-up, imports: SETUP) are counted apart, so the
figures are the frames' own. A frame's stage that takes longer than its thread's time on a CPU
waited: for the GIL, for the GPU, or for the thread before it.

py-spy 0.4.2's GIL view is to be trusted on Python 3.11 (the CPU machine), not on 3.12 (the GPU
machine): there it found GIL samples in two threads only, none in a swap thread that was on a CPU
2.3 ms a frame. The on-a-CPU view does not depend on it.

py-spy comes from the carried wheels on the GPU machine (`tools/device_prepare.sh` puts it in
.whl-spy), or `pip install py-spy` elsewhere. Writes `<out>/<name>.json` and `<out>/<name>.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from bench_run import run_command, run_setup, run_summary  # noqa: E402
from benchlib import device_name, run_fields  # noqa: E402

SETUP = re.compile(r"^(?:_?warm\w*|build\w*|capture\w*|_find_and_load|load_config|fetch_models|nvdec_available"
                   r"|close\w*|nvmlInit\w*) \("
                   r"|^prepare \([^)]*(?:gpu/analyser|engines/\w+)\.py")
"""Functions whose samples are set-up or shut-down, not a frame's work (a stack through any of them);
`prepare` only where it captures the networks' CUDA graphs (the face stack has a per-frame one).
The first GPU run (run_gpu_profile.md) counted `nvdec_available`, `close_backends` and `nvmlInit`
as frame work, about 0.8 ms a frame, before they were added here."""
LOOP = "_run_once ("
"""The event loop's iteration: the main thread's samples within the loop."""
TOP = 6
"""Leaf functions listed per thread."""


def find_py_spy(given: str | None) -> str:
    """The py-spy executable: `given`, else on PATH, else a `bin/py-spy` beside an import path (a
    wheel installed with `pip --target`, as on the GPU machine)."""
    candidates = [given] if given else [shutil.which("py-spy")] + [str(Path(p) / "bin" / "py-spy") for p in sys.path if p]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit(f"error: no py-spy {'at ' + given if given else 'on PATH or beside the import path'}: "
             "pip install py-spy, or carry .whl-spy (tools/device_prepare.sh) on the GPU machine")


HEAD = re.compile(r"thread \((\w+)\)(?:: (.*))?$")
"""A raw stack's thread field: `thread (TID): NAME`, or `thread (TID)` before the thread had a name."""


def parse(raw: Path) -> dict[str, dict[str, Any]]:
    """py-spy's raw (collapsed) stacks -> per thread name (pool indices dropped: `swap-cuda:0_0` ->
    `swap-cuda:0`): frame samples, set-up samples, and the leaf functions of the frame samples. A
    thread's samples from before it had a name count under the name it got (the main thread's
    imports)."""
    rows = []
    names: dict[str, str] = {}
    # A name py-spy read from the process may hold bytes that are not UTF-8 (native frames).
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        m = HEAD.match(frames[0])
        if not stack or not count.isdigit() or not m:
            continue
        if m.group(2):
            names[m.group(1)] = re.sub(r"_\d+$", "", m.group(2))
        rows.append((m.group(1), frames[1:], int(count)))
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"frames": 0, "setup": 0, "leaves": Counter()})
    for tid, frames, n in rows:
        name = names.get(tid, f"thread {tid}")
        t = out[name]
        setup = any(SETUP.match(f) for f in frames)
        if name == "MainThread" and not setup:
            setup = not any(f.startswith(LOOP) for f in frames)  # start-up, import, exit: not the loop
        if setup:
            t["setup"] += n
        else:
            t["frames"] += n
            t["leaves"][frames[-1] if frames else "(no Python frame)"] += n
    return out


def profile(spy: str, cmd: list[str], raw: Path, rate: int, gil: bool) -> dict[str, Any]:
    """One profiled run: its summary and its parsed samples."""
    spy_cmd = [spy, "record", "--threads", "--nonblocking", "--rate", str(rate), "--format", "raw",
               "-o", str(raw), *(["--gil"] if gil else []), "--", *cmd]
    summary = run_summary(spy_cmd)
    return {"summary": summary, "threads": parse(raw)}


def table(run: dict[str, Any], rate: int, what: str) -> tuple[list[dict[str, Any]], float]:
    """Per thread ms a frame of `what` samples, and their sum's share of the loop's wall time."""
    s = run["summary"]
    frames, loop_s = s["frames"], s["frames"] / s["fps"]
    rows = []
    for name, t in sorted(run["threads"].items(), key=lambda kv: -kv[1]["frames"]):
        if not t["frames"]:
            continue
        rows.append({"thread": name, f"{what}_ms_per_frame": round(t["frames"] / rate * 1e3 / frames, 3),
                     "setup_s": round(t["setup"] / rate, 2),
                     "top": [[f, round(n / rate * 1e3 / frames, 3)] for f, n in t["leaves"].most_common(TOP)]})
    share = sum(t["frames"] for t in run["threads"].values()) / rate / loop_s
    return rows, round(share, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--swapper", default="inswapper_128")
    ap.add_argument("--config", default=None, help="preset for `swapstream run -c`")
    ap.add_argument("--synthetic-models", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--rate", type=int, default=1000, help="samples a second")
    ap.add_argument("--py-spy", default=None, help="the py-spy executable (default: found on PATH or beside the imports)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--name", default="run_profile")
    args = ap.parse_args()
    if not args.clip.is_file():
        sys.exit(f"error: no clip at '{args.clip}': make it with python tools/make_bench_clips.py")
    if not 10 <= args.rate <= 5000:
        sys.exit("error: --rate must be 10-5000 samples a second")
    spy = find_py_spy(args.py_spy)
    work = Path(tempfile.mkdtemp(prefix="profile-run-"))
    source, opts = run_setup(work, config=args.config, swapper=args.swapper, synthetic=args.synthetic_models,
                             sets=args.set)
    cmd = run_command(source, args.clip, "null:", opts)
    rec: dict[str, Any] = {**run_fields(device_name(), "python tools/profile_run.py " + " ".join(sys.argv[1:])),
                           "run_command": " ".join(cmd[1:]).replace(str(work), "WORK"), "rate": args.rate}
    for what, gil in (("gil", True), ("cpu", False)):
        run = profile(spy, cmd, work / f"{what}.txt", args.rate, gil)
        rows, share = table(run, args.rate, what)
        s = run["summary"]
        rec[what] = {"fps": s["fps"], "frames": s["frames"], "stage_ms_per_frame": s["loop_ms"],
                     "latency_ms": s["latency_ms"], "share_of_loop": share, "threads": rows}
        print(f"{what}: {s['fps']} fps, share of the loop {share}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(rec))
    print((args.out / f"{args.name}.md").read_text())


def markdown(rec: dict[str, Any]) -> str:
    lines = [f"# Where `swapstream run`'s threads spend a frame ({rec['device']}, {rec['commit']}, {rec['date']})", "",
             f"Command: `{rec['command']}`; each run: `{rec['run_command']}` under py-spy at {rec['rate']} samples "
             "a second (`--nonblocking`), once for the threads holding the GIL, once for the threads on a CPU "
             "(or runnable, waiting for a core). "
             "Set-up (models, warm-up, imports) is left out; ms are per frame of the clip.", ""]
    for what, title in (("gil", "holding the GIL"), ("cpu", "on a CPU")):
        r = rec[what]
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_ms_per_frame"].items())
        lines += [f"## Threads {title} (the run: {r['fps']} fps; stage ms/frame {stages})", "",
                  f"All threads together: **{r['share_of_loop']:.0%} of the loop's wall time**.", "",
                  "| thread | ms a frame | where (leaf function, ms a frame) |", "|---|---|---|"]
        for t in r["threads"]:
            top = "; ".join(f"`{f}` {ms}" for f, ms in t["top"][:3])
            lines.append(f"| {t['thread']} | {t[f'{what}_ms_per_frame']} | {top} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
