"""swapstream.gpu.mps on the CPU: the errors a user sees, and a running daemon left alone.

Starting a real daemon needs NVIDIA's driver tools (the device run `bench_streams.py --mps` does it,
docs/performance.md); these tests cover what happens around it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swapstream.gpu.mps import CONTROL, MpsError, find_control, mps_daemon

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_control_daemon_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MpsError, match=f"{CONTROL} was not found.*run without --mps"):
        find_control(path=str(tmp_path))


def test_a_daemon_that_fails_to_start_is_reported_and_its_log_kept() -> None:
    false = shutil.which("false")
    assert false is not None
    with pytest.raises(MpsError, match=r"-d failed \(exit 1\).*log in (\S+)") as e:
        with mps_daemon(control=false):
            pytest.fail("the body must not run when the daemon did not start")
    log_dir = Path(str(e.value).rsplit("log in ", 1)[1])
    assert log_dir.is_dir()  # kept for the user to read
    shutil.rmtree(log_dir.parent)


def test_a_daemon_named_by_the_environment_is_used_and_left_running(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "control").touch()  # where a running daemon keeps its pipes
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    # A control program that would fail if it were called: it must not be, for start or quit.
    with mps_daemon(control=shutil.which("false")) as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)
    assert (tmp_path / "control").exists()


@pytest.mark.skipif(shutil.which(CONTROL, path="/usr/local/nvidia/bin:" + os.environ.get("PATH", ""))
                    is not None, reason="this machine has MPS: the benchmark would start its workers")
def test_bench_streams_mps_without_the_driver_tools_is_a_clear_error(tmp_path: Path) -> None:
    clip = str(tmp_path / "clip.mp4")  # not read: the error comes before any worker starts
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_streams.py"), "--mps", "--ns", "1", "--res", "720",
                        "--clip720", clip, "--clip1080", clip],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0
    assert "error: --mps:" in r.stderr and "Traceback" not in r.stderr, r.stderr
