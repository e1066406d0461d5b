"""tools/bench_face_stack.py at smoke scale on the CPU: it runs the product's TorchRunner on a face-stack
model in its real architecture and writes records that say what ran; bad arguments get an error that
names them. Its figures here are not a result (the GPU run is the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_face_stack.py"


def test_the_tool_times_the_occluder_and_writes_its_record(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path), "--models", "xseg_1",
                          "--batches", "1", "--device", "cpu", "--reps", "1"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = json.loads((tmp_path / "face_stack.json").read_text())
    (rec,) = recs  # one model, one batch size, no GPU memory on the CPU
    assert rec["metric"] == "face_stack_xseg_1_ms_per_face_b1" and rec["unit"] == "ms"
    assert rec["value"] > 0 and rec["config"]["input"] == [1, 256, 256, 3]
    assert rec["config"]["precision"] == "fp32" and rec["config"]["cuda_graphs"] is False
    assert rec["command"].startswith("python tools/bench_face_stack.py")
    md = (tmp_path / "face_stack.md").read_text()
    assert "| xseg_1 | occluder (XSeg) |" in md and "smoke run" in md


@pytest.mark.parametrize("argv, says", [(["--models", "xseg_9"], "--models takes names among"),
                                        (["--batches", "0"], "--batches must be between 1 and 8"),
                                        (["--batches", "one"], "--batches takes whole numbers")])
def test_bad_arguments_are_named(tmp_path: Path, argv: list[str], says: str) -> None:
    res = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path), "--device", "cpu", *argv],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and says in res.stderr and "Traceback" not in res.stderr


PROFILE = Path(__file__).resolve().parents[2] / "tools" / "profile_mesh_gpu.py"


@pytest.mark.parametrize("argv, says", [(["--clip", "no-such.mp4"], "no clip at 'no-such.mp4'"),
                                        (["--neural", "--batches", "5"], "--batches must be between 1 and 4"),
                                        (["--neural", "--batches", "x"], "--batches takes whole numbers")])
def test_the_swap_profiler_names_bad_arguments(tmp_path: Path, argv: list[str], says: str) -> None:
    """tools/profile_mesh_gpu.py (`--neural`: the face stack's swap call) runs on a GPU only; here its
    argument checks, which come before anything needs CUDA."""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    args = argv if "--clip" in argv else ["--clip", str(clip), *argv]
    res = subprocess.run([sys.executable, str(PROFILE), *args], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and says in res.stderr and "Traceback" not in res.stderr
