"""NVIDIA's Multi-Process Service (MPS) for a run of several GPU processes.

Without MPS, CUDA time-slices the GPU between processes: one process's kernels run while the
others' wait, so several worker processes that each launch small batches leave the GPU partly idle
and queue behind each other. Under MPS their kernels share the GPU at once. On the H200, 32 streams
with random arrival phases in 8 worker processes went from p99 275 ms and 4% drops to p99 30 ms and
no drops (docs/performance.md).

`mps_daemon()` starts a private control daemon (its own pipe and log folders, so it touches no
other user's MPS and needs no change to the GPU's compute mode), hands back the environment that
makes a child process one of its clients, and stops it at the end. A daemon that the caller's
environment already names (`CUDA_MPS_PIPE_DIRECTORY`) and that answers is used as it is and left
running.

A CUDA process that cannot reach the daemon runs without MPS and says nothing (NVIDIA's manual), so
`server_pids()` asks the daemon which servers it runs (none once the children have initialised CUDA
means they are not its clients) and `client_pids()` which processes each server serves.

Every question goes through NVIDIA's control client (`nvidia-cuda-mps-control` reading a command on
standard input); the names of the daemon's pipes are its own business.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
# Where NVIDIA's container toolkit mounts the driver's tools when they are not on PATH.
_DRIVER_BIN = "/usr/local/nvidia/bin"
# The control client answers at once when a daemon listens, and fails at once when none does.
_ASK_TIMEOUT_S = 10.0
# quit waits for the servers' clients to end: the benchmark's workers take a few seconds.
_QUIT_TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """MPS could not be started, used or stopped: the message says why and what to do."""


def find_control(path: str | None = None) -> str:
    """The control program's executable, or MpsError naming where it was looked for."""
    search = path if path is not None else os.environ.get("PATH", "") + os.pathsep + _DRIVER_BIN
    exe = shutil.which(CONTROL, path=search)
    if exe is None:
        raise MpsError(f"{CONTROL} was not found on PATH or in {_DRIVER_BIN}: MPS ships with the NVIDIA "
                       "driver; install the driver's utilities, or run without --mps")
    return exe


def _ask(exe: str, env: dict[str, str], command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """One command to the daemon that `env` names, through the control client."""
    try:
        return subprocess.run([exe], input=command + "\n", env=env, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MpsError(f"{exe} could not be asked '{command}' ({e}); run without --mps") from e


def _server_list(exe: str, env: dict[str, str]) -> tuple[list[int] | None, str]:
    """The server pids of the daemon that `env` names, or None when no daemon answers (the client
    then exits non-zero, or prints an error instead of process ids); and what the client said."""
    r = _ask(exe, env, "get_server_list", _ASK_TIMEOUT_S)
    pids = _pids(r)
    return (None, (r.stderr or r.stdout).strip()[:300]) if pids is None else (pids, "")


def _pids(r: subprocess.CompletedProcess[str]) -> list[int] | None:
    """The process ids a control command printed, or None when it failed: the client exits non-zero,
    or prints an error instead of process ids."""
    toks = r.stdout.split()
    if r.returncode != 0 or not all(tok.isdigit() for tok in toks):
        return None
    return [int(tok) for tok in toks]


def _answers(exe: str, env: dict[str, str]) -> bool:
    return _server_list(exe, env)[0] is not None


def server_pids(env: dict[str, str], control: str | None = None) -> list[int]:
    """The MPS servers that the daemon named by `env` runs (one per user whose CUDA processes became
    its clients); MpsError if no daemon answers there."""
    pids, said = _server_list(control or find_control(), env)
    if pids is None:
        raise MpsError(f"no MPS control daemon answers in {env.get('CUDA_MPS_PIPE_DIRECTORY', '/tmp/nvidia-mps')}: {said}")
    return pids


def client_pids(env: dict[str, str], control: str | None = None) -> set[int]:
    """The processes that are clients of the MPS servers of the daemon named by `env` (NVIDIA's
    `get_client_list` for each server of `get_server_list`); MpsError if no daemon answers there."""
    exe = control or find_control()
    clients: set[int] = set()
    for server in server_pids(env, control=exe):
        r = _ask(exe, env, f"get_client_list {server}", _ASK_TIMEOUT_S)
        pids = _pids(r)
        if pids is None:
            raise MpsError(f"the MPS daemon in {env.get('CUDA_MPS_PIPE_DIRECTORY')} did not list the clients of "
                           f"server {server}: {(r.stderr or r.stdout).strip()[:300]}")
        clients.update(pids)
    return clients


def _stop(exe: str, env: dict[str, str], root: Path) -> str | None:
    """Stop our daemon, if one answers, and wait until it no longer does; then remove its folders.
    Returns what went wrong (the folders are then kept: the daemon may still use them), or None."""
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    how = f"stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe} {exe}"
    try:
        if _answers(exe, env):
            # quit waits for the servers' clients to end; the body has ended its children by now.
            r = _ask(exe, env, "quit", _QUIT_TIMEOUT_S)
            if r.returncode != 0:
                return f"the MPS daemon in {pipe} did not take 'quit' (exit {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}); {how}"
            deadline = time.monotonic() + _QUIT_TIMEOUT_S
            while _answers(exe, env):
                if time.monotonic() > deadline:
                    return f"the MPS daemon in {pipe} still answers {_QUIT_TIMEOUT_S:g} s after 'quit'; {how}"
                time.sleep(0.1)
    except MpsError as e:
        return f"{e}; {how}"
    shutil.rmtree(root, ignore_errors=True)
    return None


@contextmanager
def mps_daemon(control: str | None = None, base_env: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Run an MPS control daemon for the body of the `with`; yields a copy of os.environ (or of
    `base_env`) that makes a child process an MPS client. With `CUDA_VISIBLE_DEVICES` in `base_env`
    naming one GPU, the daemon serves that GPU alone: `serve --workers` runs one per GPU.

    MpsError if the daemon cannot be found or started, or does not stop (its folder, named in the
    message, is then kept; after a failed start the folder with the daemon's log is kept too). If
    the body raises, its exception goes on, with a failure to stop added as a note."""
    env = dict(os.environ if base_env is None else base_env)
    exe = control or find_control()
    if env.get("CUDA_MPS_PIPE_DIRECTORY") and _answers(exe, env):
        yield env  # someone else's daemon: use it, leave it running
        return
    root = Path(tempfile.mkdtemp(prefix="swapstream-mps-"))
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(root / "pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = log = str(root / "log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(log)
    try:
        try:
            r = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=_ASK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"{exe} -d could not be run ({e}); run without --mps") from e
        if r.returncode != 0:
            raise MpsError(f"{exe} -d failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[:300]}; "
                           f"run without --mps, or see the daemon's log in {log}")
        deadline = time.monotonic() + _ASK_TIMEOUT_S
        while not _answers(exe, env):
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon did not answer in {_ASK_TIMEOUT_S:g} s; see its log in {log}")
            time.sleep(0.05)
    except MpsError as e:
        # Stop a daemon that started but did not answer in time; its log stays for the user.
        problem = _stop(exe, env, Path(env["CUDA_MPS_PIPE_DIRECTORY"]))
        if problem:
            e.add_note(problem)
        raise
    try:
        yield env
    except BaseException as e:
        problem = _stop(exe, env, root)
        if problem:
            e.add_note(problem)
        raise
    problem = _stop(exe, env, root)
    if problem:
        raise MpsError(problem)
