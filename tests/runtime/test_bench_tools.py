"""The tools that measure `swapstream run`, on the CPU at small scale: bench_run's variants (other
settings of the same tree, timed in the same rounds) reach the command and the record, a bad one is
refused by name; profile_run reads py-spy's raw stacks by thread, with set-up work apart. Their
figures here are not results (the GPU runs are the benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def bench_run(clip: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOLS / "bench_run.py"), "--clip", str(clip), "--repeat", "1",
                           "--only", "null", "--swapper", "mesh", "--out", str(out), "--name", "ab", *extra],
                          capture_output=True, text=True, timeout=600)


def test_bench_run_times_a_variant_in_the_same_rounds(clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    path, frames = clip
    res = bench_run(path, tmp_path, "--variant", "gil0.2:runtime.switch_interval_ms=0.2")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    recs = {r["metric"]: r for r in json.loads((tmp_path / "ab.json").read_text())}
    assert set(recs) == {"ab_fps_no_encode", "ab_fps_no_encode_gil0.2"}
    for r in recs.values():
        # Every frame of the clip went through, and its faces were swapped (the portrait moves in
        # every frame of it).
        assert r["config"]["frames"] == [len(frames)] and r["config"]["frames_swapped"] == [len(frames)]
        assert r["value"] == r["config"]["runs_fps"][0] > 0
    assert "runtime.switch_interval_ms=0.2" in recs["ab_fps_no_encode_gil0.2"]["config"]["output"]
    assert "gil0.2: runtime.switch_interval_ms=0.2" in (tmp_path / "ab.md").read_text()


def test_a_variants_settings_reach_the_command_and_a_bad_variant_is_refused(
        clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    path, _ = clip
    # Out of the setting's range: the variant's `swapstream run` itself refuses it, so its
    # settings were passed on.
    res = bench_run(path, tmp_path, "--variant", "slow:runtime.switch_interval_ms=99")
    assert res.returncode != 0 and "switch_interval_ms" in res.stderr
    assert "Traceback" not in res.stderr
    for bad in ("nolabel", ":runtime.degrade=false", "x:notakeyvalue", "null:runtime.degrade=false"):
        res = bench_run(path, tmp_path, "--variant", bad)
        assert res.returncode == 1 and f"--variant '{bad}'" in res.stderr and "Traceback" not in res.stderr


def test_appended_calls_make_one_record_of_all_rounds_with_each_over_the_baseline(
        clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    path, frames = clip
    # This tree as its own baseline: a real second `swapstream` tree through the same links.
    base = ["--baseline-tree", str(TOOLS.parent), "--baseline-label", "again"]
    res = bench_run(path, tmp_path, "--append", *base)
    assert res.returncode == 1 and "no record at" in res.stderr and "Traceback" not in res.stderr
    for extra in ([], ["--append"]):
        res = bench_run(path, tmp_path, *base, *extra)
        assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    recs = {r["metric"]: r for r in json.loads((tmp_path / "ab.json").read_text())}
    assert set(recs) == {"ab_fps_no_encode", "ab_fps_no_encode_again"}
    ours, theirs = recs["ab_fps_no_encode"]["config"], recs["ab_fps_no_encode_again"]["config"]
    for c in (ours, theirs):
        # Both calls' rounds, each run's call named, every frame of the clip swapped in each.
        assert c["calls"] == [1, 2] and c["rounds_completed"] == c["repeat"] == 2
        assert c["frames"] == c["frames_swapped"] == [len(frames)] * 2
    assert recs["ab_fps_no_encode"]["value"] == (ours["runs_fps"][0] + ours["runs_fps"][1]) / 2
    assert ours["over_baseline_per_round"] == [round(a / b, 3) for a, b in zip(ours["runs_fps"], theirs["runs_fps"])]
    assert theirs["over_baseline_per_round"] == []
    md = (tmp_path / "ab.md").read_text()
    assert "then python tools/bench_run.py" in md and "over again's in the same round" in md
    # Another benchmark's rounds are not counted with these: refused by name, the record kept.
    before = (tmp_path / "ab.json").read_text()
    res = bench_run(path, tmp_path, "--append", *base, "--variant", "gil0.2:runtime.switch_interval_ms=0.2")
    assert res.returncode == 1 and "another benchmark (outputs" in res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "ab.json").read_text() == before


RAW = """\
thread (7001);_run_module_as_main (<frozen runpy>:189);_find_and_load (<frozen importlib._bootstrap>:1176) 40
thread (7001): MainThread;main (stream/cli.py:806);run_until_complete (asyncio/base_events.py:641);_run_once (asyncio/base_events.py:1906);_run (asyncio/events.py:80) 12
thread (7001): MainThread;main (stream/cli.py:806);run (stream/runtime/run.py:215);load_config (stream/config.py:400) 5
thread (7002): analysis-cuda:0_0;_worker (concurrent/futures/thread.py:83);run (concurrent/futures/thread.py:58);warm_analyse (stream/runtime/manager.py:395);track (stream/face/analyser.py:100) 30
thread (7002): analysis-cuda:0_0;_worker (concurrent/futures/thread.py:83);run (concurrent/futures/thread.py:58);_analyse_batch (stream/runtime/manager.py:330);track (stream/face/analyser.py:100) 20
thread (7002): analysis-cuda:0_0;_worker (concurrent/futures/thread.py:83);run (concurrent/futures/thread.py:58);_analyse_batch (stream/runtime/manager.py:330);synchronize (cupy/cuda/stream.py:1) 7
thread (7002): analysis-cuda:0_0;_worker (concurrent/futures/thread.py:83);run (concurrent/futures/thread.py:58);build_analysis (stream/runtime/manager.py:350);prepare (swapstream/gpu/analyser.py:72) 4
thread (7003): swap-cuda:0_0 3
thread (7003): swap-cuda:0_0;_run (stream/runtime/manager.py:250);swap (stream/runtime/swappers.py:90);prepare (stream/neural/face_stack.py:110) 2
"""


def test_profile_run_reads_threads_and_leaves_set_up_apart(tmp_path: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import profile_run
    finally:
        sys.path.remove(str(TOOLS))
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    t = profile_run.parse(raw)
    assert set(t) == {"MainThread", "analysis-cuda:0", "swap-cuda:0"}
    # The main thread's imports (before it was named) and its config load are set-up; its loop's
    # callbacks are frame work.
    assert (t["MainThread"]["frames"], t["MainThread"]["setup"]) == (12, 45)
    # The warm-up's analysis and the graphs' capture are set-up; the batches' are the frames'.
    assert (t["analysis-cuda:0"]["frames"], t["analysis-cuda:0"]["setup"]) == (27, 34)
    assert t["analysis-cuda:0"]["leaves"].most_common() == [("track (stream/face/analyser.py:100)", 20),
                                                            ("synchronize (cupy/cuda/stream.py:1)", 7)]
    # A per-frame `prepare` (the face stack's) is frame work.
    assert t["swap-cuda:0"]["leaves"] == {"(no Python frame)": 3, "prepare (stream/neural/face_stack.py:110)": 2}
    run = {"summary": {"frames": 100, "fps": 50.0}, "threads": t}
    rows, share = profile_run.table(run, 1000, "gil")
    # 12 + 27 + 5 frame samples at 1000 a second over a loop of 100 frames at 50 fps (2 s).
    assert share == pytest.approx(0.022)
    assert rows[0] == {"thread": "analysis-cuda:0", "gil_ms_per_frame": 0.27, "setup_s": 0.03,
                       "top": [["track (stream/face/analyser.py:100)", 0.2], ["synchronize (cupy/cuda/stream.py:1)", 0.07]]}
