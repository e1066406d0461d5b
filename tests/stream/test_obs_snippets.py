"""The `rtmp_server.py` snippet of docs/obs.md, run as a user runs it: it starts nginx-rtmp and the
stream-key check, and SIGTERM stops all of it (no nginx, key server or resource tracker left)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swapstream.live.nginx import find_nginx_rtmp, free_port, wait_for_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "obs.md"
MARKER = "# rtmp_server.py"


def rtmp_server_snippet() -> str:
    """The ```python block whose first line is the `# rtmp_server.py` comment, dedented."""
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", DOC.read_text(), re.M | re.S):
        indent, body = m.group(1), m.group(2)
        code = "\n".join(ln[len(indent):] for ln in body.splitlines())
        if code.lstrip().startswith(MARKER):
            return code + "\n"
    raise AssertionError(f"no ```python block starting with {MARKER!r} in {DOC}")


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) in process group `pgid`, read from /proc."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(d.name))
    return found


def test_rtmp_server_snippet_starts_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    try:
        find_nginx_rtmp()
    except Exception as e:  # noqa: BLE001 - the message names what to install
        pytest.skip(str(e))
    script = tmp_path / "rtmp_server.py"
    script.write_text(rtmp_server_snippet())
    port = free_port()
    env = dict(os.environ, RTMP_PORT=str(port), PYTHONUNBUFFERED="1")
    # Its own session: every process it starts is in its process group, whose id is its pid.
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=30)
        # The line comes once both servers are up (and '' if it died): only then is it running.
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert f"rtmp://127.0.0.1:{port}/live" in first, first
        assert len(group_members(proc.pid)) >= 3   # python, the key server, nginx
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, out + err
        assert "Traceback" not in err, err
        deadline = time.monotonic() + 5
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(proc.pid) == [], "processes left behind after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in group_members(proc.pid):   # only what this test started, by id
            os.kill(pid, signal.SIGKILL)
