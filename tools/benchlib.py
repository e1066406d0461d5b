"""What every benchmark tool records about its run (imported by the tools in this folder)."""

from __future__ import annotations

import os
import subprocess


def git_sha() -> str:
    """The commit the numbers belong to: $GIT_SHA when set (the GPU machine's copy of the tree may
    carry a stale .git, so tools/device_check.sh runs get it from the dev machine), else git's HEAD."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
