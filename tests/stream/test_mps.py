"""swapstream.gpu.mps on the CPU: starting, asking and stopping a daemon, and the errors a user sees.

A real daemon needs NVIDIA's driver (the device run `bench_streams.py --mps` starts one,
docs/performance.md). Here a small shell script stands in for NVIDIA's control program, speaking
its interface: `-d` starts the daemon, and the client reads one command (`get_server_list`,
`get_client_list PID`, `quit`)
on standard input, exiting non-zero when no daemon listens. It records every call, so the tests
check what the module asked, and when."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swapstream.gpu.mps import CONTROL, MpsError, client_pids, find_control, mps_daemon, server_pids

ROOT = Path(__file__).resolve().parents[2]

FAKE_CONTROL = r"""#!/bin/sh
# Stand-in for nvidia-cuda-mps-control: a daemon "listens" while $CUDA_MPS_PIPE_DIRECTORY/up exists.
up="$CUDA_MPS_PIPE_DIRECTORY/up"
if [ "$1" = "-d" ]; then
  echo "-d" >> "$FAKE_MPS_CALLS"
  [ -n "$FAKE_MPS_START_FAILS" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  touch "$up"; exit 0
fi
read -r cmd
echo "$cmd" >> "$FAKE_MPS_CALLS"
[ -e "$up" ] || { echo "Cannot find MPS control daemon process"; exit 1; }
case "$cmd" in
  get_server_list) [ -n "$FAKE_MPS_SERVER" ] && echo "$FAKE_MPS_SERVER"; exit 0 ;;
  "get_client_list $FAKE_MPS_SERVER") [ -n "$FAKE_MPS_CLIENTS" ] && echo "$FAKE_MPS_CLIENTS"; exit 0 ;;
  quit) [ -n "$FAKE_MPS_QUIT_FAILS" ] && exit 1; rm "$up"; exit 0 ;;
esac
exit 1
"""


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    exe = tmp_path / "fake-mps-control"
    exe.write_text(FAKE_CONTROL)
    exe.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.touch()
    monkeypatch.setenv("FAKE_MPS_CALLS", str(calls))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return str(exe), calls


def _calls(calls: Path) -> list[str]:
    return calls.read_text().split()


def test_a_missing_control_program_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MpsError, match=f"{CONTROL} was not found.*run without --mps"):
        find_control(path=str(tmp_path))


def test_the_daemon_runs_for_the_body_and_is_stopped_after(control: tuple[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    exe, calls = control
    monkeypatch.setenv("FAKE_MPS_SERVER", "4242")
    with mps_daemon(control=exe) as env:
        pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        assert pipe.is_dir() and Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert os.environ.get("CUDA_MPS_PIPE_DIRECTORY") is None  # a copy: this process is not a client
        assert server_pids(env, control=exe) == [4242]
    assert _calls(calls)[0] == "-d" and "quit" in _calls(calls)
    assert not pipe.parent.exists()  # its folders are gone with it


def test_a_failing_body_still_stops_the_daemon_and_its_error_goes_on(control: tuple[str, Path]) -> None:
    exe, calls = control
    with pytest.raises(ValueError, match="the body's own error"):
        with mps_daemon(control=exe) as env:
            root = Path(env["CUDA_MPS_PIPE_DIRECTORY"]).parent
            raise ValueError("the body's own error")
    assert "quit" in _calls(calls)
    assert not root.exists()


def test_a_daemon_that_will_not_quit_is_reported_with_how_to_stop_it(control: tuple[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _calls_file = control
    monkeypatch.setenv("FAKE_MPS_QUIT_FAILS", "1")
    with pytest.raises(MpsError, match=r"did not take 'quit'.*stop it with: echo quit"):
        with mps_daemon(control=exe) as env:
            root = Path(env["CUDA_MPS_PIPE_DIRECTORY"]).parent
    assert root.exists()  # kept: the daemon may still use it
    shutil.rmtree(root)


def test_a_daemon_that_fails_to_start_is_reported_and_its_log_kept(control: tuple[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    exe, calls = control
    monkeypatch.setenv("FAKE_MPS_START_FAILS", "1")
    with pytest.raises(MpsError, match=r"-d failed \(exit 1\): An instance.*log in (\S+)") as e:
        with mps_daemon(control=exe):
            pytest.fail("the body must not run when the daemon did not start")
    log_dir = Path(str(e.value).rsplit("log in ", 1)[1])
    assert log_dir.is_dir()
    shutil.rmtree(log_dir.parent)
    assert "quit" not in _calls(calls)  # nothing answered, so nothing to stop


def test_a_daemon_named_by_the_environment_is_used_and_left_running(control: tuple[str, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    exe, calls = control
    pipe = tmp_path / "theirs"
    pipe.mkdir()
    (pipe / "up").touch()  # their daemon listens
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    with mps_daemon(control=exe) as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert _calls(calls) == ["get_server_list"]  # asked, neither started nor stopped
    assert (pipe / "up").exists()


def test_a_stale_folder_in_the_environment_gets_a_daemon_of_our_own(control: tuple[str, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    exe, calls = control
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "leftover").touch()  # files of a daemon that was killed: nothing answers
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(stale))
    with mps_daemon(control=exe) as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] != str(stale)
    assert "-d" in _calls(calls) and "quit" in _calls(calls)


def test_server_pids_without_a_daemon_is_an_error(control: tuple[str, Path], tmp_path: Path) -> None:
    exe, _ = control
    with pytest.raises(MpsError, match="no MPS control daemon answers"):
        server_pids({**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}, control=exe)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="a GPU machine: serve would start MPS")
def test_serve_mps_without_a_gpu_is_a_clear_error(tmp_path: Path) -> None:
    # No GPU here: --mps cannot be honoured, and serve says so in one line before any worker starts.
    r = subprocess.run([sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", "--workers", "2",
                        "--mps", "--port", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "error: --mps needs an NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_daemons_clients_are_listed_and_serve_says_which_workers_are_not(
        control: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """`client_pids`, and what `serve --workers --mps` does with it once its workers are ready: each
    worker is marked a client or not (`GET /api/workers`' `mps_client`), and those that are not are
    named in the log (they time-slice the GPU)."""
    import asyncio
    import logging

    from swapstream.config import Config
    from swapstream.runtime.workers import WorkerPool

    exe, _calls_file = control
    monkeypatch.setenv("FAKE_MPS_SERVER", "4242")
    monkeypatch.setenv("FAKE_MPS_CLIENTS", "101 102")
    # The pool finds the control program by name, as on a GPU machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(exe, bin_dir / CONTROL)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with mps_daemon(control=exe) as env:
        assert client_pids(env, control=exe) == {101, 102}
        pool = WorkerPool(Config(), devices=["cuda:0"], per_device=3, mps=True)
        try:
            pool._device_env["cuda:0"] = env
            for w, pid in zip(pool.workers, (101, 102, 103)):
                w.proc_pid = pid
            with caplog.at_level(logging.INFO, logger="swapstream.runtime.workers"):
                asyncio.run(pool._check_mps(pool.workers))
            assert [w.mps_client for w in pool.workers] == [True, True, False]
            assert "worker(s) w2 are not clients of its daemon" in caplog.text
            # All of them clients: said once, at INFO.
            env["FAKE_MPS_CLIENTS"] = "101 102 103"  # the daemon's environment, which the pool asks with
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="swapstream.runtime.workers"):
                asyncio.run(pool._check_mps(pool.workers))
            assert all(w.mps_client for w in pool.workers) and "all 3 worker(s) are clients" in caplog.text
        finally:
            pool._exit.close()
            shutil.rmtree(pool._dir, ignore_errors=True)
