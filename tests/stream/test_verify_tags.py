"""The synthetic-content tags, written and read back for real.

- `swapstream verify` reads tags at every level: the container's, each stream's and, for MPEG-TS
  (HLS segments), the service names in the transport stream's SDT, which PyAV does not expose and
  which are the only place an HLS output keeps the note.
- The tags state only what was done: with `watermark.enabled=false` they do not claim a watermark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream import demo  # noqa: E402
from swapstream.config import load_config  # noqa: E402
from swapstream.disclosure import SYNTHETIC_TAGS, Disclosure  # noqa: E402
from swapstream.live.streams import LiveWriter  # noqa: E402
from swapstream.types import Frame  # noqa: E402
from swapstream.verify import verify  # noqa: E402

TIMEOUT = 60


def cli(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "swapstream.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def smooth_frame(h: int, w: int, seed: int) -> np.ndarray:
    """Random but smooth RGB content in 30..225 (the mark is neither clipped nor lost in detail)."""
    import cv2

    rng = np.random.default_rng(seed)
    small = rng.integers(30, 226, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)


# -- 1. verify on an HLS output: the MPEG-TS service names --------------------------------------------


@pytest.fixture(scope="module")
def hls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Disclosure]:
    """A real HLS output of the product's live writer, every frame marked as a live job marks it."""
    playlist = tmp_path_factory.mktemp("hls") / "out" / "index.m3u8"
    disclosure = Disclosure(load_config(overrides=["watermark.stream_id=0x0BADCAFE"]), live=True)
    w = LiveWriter(str(playlist), width=640, height=360, fps=10, time_base=Fraction(1, 10), kind="hls")
    try:
        # Six one-second segments (the writer's window): a reader of a live playlist starts three
        # segments from its end and then waits for more, so it needs that many to read 20 frames.
        for i in range(60):
            f = smooth_frame(360, 640, seed=i)
            assert disclosure.apply(f, swapped=True)
            w.write(Frame(f, pts=i, time_base=Fraction(1, 10)))
    finally:
        w.close()
    assert sorted(playlist.parent.glob("*.ts")), "the HLS writer wrote no segment"
    return playlist, disclosure


def test_verify_reads_the_hls_segments_service_tags(hls: tuple[Path, Disclosure]) -> None:
    playlist, disclosure = hls
    # The live writer's playlist has no ENDLIST (it is a live window): a reader waits for more
    # segments, as a player does, so stop after the frames written.
    rep = verify(str(playlist), max_frames=20)
    programs = [t for where, t in rep.tags.items() if where.startswith("program")]
    assert programs == [{"service_provider": SYNTHETIC_TAGS["service_provider"],
                         "service_name": SYNTHETIC_TAGS["service_name"]}], rep.tags
    assert rep.found and rep.combined is not None and rep.combined.payload == disclosure.payload
    # A segment on its own carries the same service names.
    seg = sorted(playlist.parent.glob("*.ts"))[0]
    assert verify(str(seg)).tags["program 0"]["service_name"] == SYNTHETIC_TAGS["service_name"]


def test_verify_command_reports_hls_tags_and_mark(hls: tuple[Path, Disclosure], tmp_path: Path) -> None:
    playlist, disclosure = hls
    res = cli("verify", playlist, "--summary", "--max-frames", 20, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"program 0: service_name={SYNTHETIC_TAGS['service_name']}" in res.stdout, res.stdout
    assert "no synthetic-content tags" not in res.stdout
    assert "SwapStream watermark FOUND" in res.stdout
    res = cli("verify", playlist, "--json", "--max-frames", 20, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)["summary"]
    assert summary["tags"]["program 0"]["service_provider"] == "SwapStream"
    assert summary["combined"]["payload"]["stream_id"] == disclosure.payload.stream_id


# -- 2. the tags say a watermark is there only when it is ----------------------------------------------


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import cv2

    root = tmp_path_factory.mktemp("tag_assets")
    face, clip = root / "face.png", root / "clip.mp4"
    assert cv2.imwrite(str(face), cv2.cvtColor(demo.astronaut(), cv2.COLOR_RGB2BGR))
    assert demo.write_demo_clip(clip, demo.grace_hopper(), seconds=1.0, fps=10, size=(640, 360)) == 10
    return face, clip


@pytest.mark.parametrize("mark", [False, True], ids=["watermark-off", "watermark-on"])
def test_run_output_tags_mention_the_watermark_only_when_on(assets: tuple[Path, Path], tmp_path: Path,
                                                             mark: bool) -> None:
    face, clip = assets
    out = tmp_path / "swapped.mkv"   # Matroska keeps every tag
    res = cli("run", "-s", face, "-i", clip, "-o", out, "--quiet",
              "--set", f"watermark.enabled={'true' if mark else 'false'}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    with av.open(str(out)) as c:
        tags = {k.lower(): str(v) for k, v in c.metadata.items()}
    text = " ".join(tags.values()).lower()
    # The synthetic-content declaration is there either way.
    assert "ai-modified" in tags["comment"].lower() and "synthetic" in tags["description"].lower()
    assert tags["digital_source_type"].endswith("compositeWithTrainedAlgorithmicMedia")
    assert ("watermark" in text) is mark, tags
    assert verify(str(out)).found is mark
