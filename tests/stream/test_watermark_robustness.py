"""The watermark through real x264: payload recovery, false marks, rescaling, invisibility.

Three 1-second 720p clips (tools/watermark_robustness.py renders them): the demo's animated portrait,
a fast pan over a detailed photo, and a slow zoom with camera-like noise. Each is marked with the
product's embedder, encoded with x264 at 2 Mbit/s (CRF 23 capped by the VBV, and CBR), decoded and
checked; then scaled to 854x480 and re-encoded at 1 Mbit/s, and checked again. The same clips
unmarked, through the same encodes, and the suite's own sample clips must show no mark.
`python tools/watermark_robustness.py` runs the longer version whose figures are in
docs/responsible_use.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import watermark_robustness as wr  # noqa: E402

from swapstream.demo import grace_hopper, write_demo_clip  # noqa: E402
from swapstream.verify import verify  # noqa: E402
from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker, detect, luma_of  # noqa: E402

from .clips import numbered_frame, write_clip  # noqa: E402

FRAMES = 30
PAYLOAD = Payload(PRODUCT_SWAPSTREAM, 0xC0FFEE42)


class Chains:
    """Every clip, marked and not, through every chain, decoded and checked once per module."""

    def __init__(self, tmp: Path) -> None:
        marker = Watermarker(PAYLOAD)
        self.psnr: dict[str, list[float]] = {}
        self.rate: dict[tuple[str, str], float] = {}
        self.found: dict[tuple[str, str, str], list[Any]] = {}
        for clip in wr.CLIPS:
            plain = wr.render_clip(clip, FRAMES)
            marked = [f.copy() for f in plain]
            for f in marked:
                marker.embed(f)
            self.psnr[clip] = [wr.psnr(a, b) for a, b in zip(plain, marked)]
            for which, frames in (("marked", marked), ("unmarked", plain)):
                for mode in ("crf", "cbr"):
                    p720 = tmp / f"{clip}_{which}_{mode}.mp4"
                    rate = wr.encode(frames, p720, mode)
                    if which == "marked":
                        self.rate[(clip, mode)] = rate
                    self.found[(clip, which, f"{mode}_720p")] = wr.detections(wr.decode(p720))
                    if which == "marked":
                        p480 = tmp / f"{clip}_{mode}_480p.mp4"
                        small = wr.rescale(wr.decode(p720, "rgb24"), (854, 480))
                        wr.encode(small, p480, "cbr", kbps=1000)
                        self.found[(clip, which, f"{mode}_480p")] = wr.detections(wr.decode(p480))

    def recovered(self, clip: str, chain: str) -> float:
        ds = self.found[(clip, "marked", chain)]
        return sum(1 for d in ds if d.found and d.payload == PAYLOAD) / len(ds)

    def wrong(self, clip: str, chain: str) -> int:
        return sum(1 for d in self.found[(clip, "marked", chain)] if d.found and d.payload != PAYLOAD)


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Chains:
    return Chains(tmp_path_factory.mktemp("wm_chains"))


def test_mark_is_invisible_by_psnr(chains: Chains) -> None:
    for clip, values in chains.psnr.items():
        print(f"{clip}: PSNR marked vs unmarked mean {np.mean(values):.1f} dB, min {np.min(values):.1f} dB")
        assert min(values) >= 40.0, (clip, min(values))


@pytest.mark.parametrize("mode", ["crf", "cbr"])
def test_payload_recovered_after_x264_2mbps_720p(chains: Chains, mode: str) -> None:
    for clip in wr.CLIPS:
        rate, got = chains.rate[(clip, mode)], chains.recovered(clip, f"{mode}_720p")
        print(f"{clip} {mode}: {rate:.2f} Mbit/s, payload recovered in {100 * got:.0f}% of frames")
        # The rate control holds 2 Mbit/s (CRF 23 stays under its cap on these clips; x264's VBV
        # may overshoot a 1-second clip a little).
        assert rate <= 2.35, (clip, mode, rate)
        assert got >= 0.95, (clip, mode, got)
        assert chains.wrong(clip, f"{mode}_720p") == 0


@pytest.mark.parametrize("mode", ["crf", "cbr"])
def test_mark_survives_scaling_to_480p_and_a_reencode(chains: Chains, mode: str) -> None:
    for clip in wr.CLIPS:
        got = chains.recovered(clip, f"{mode}_480p")
        print(f"{clip} {mode} -> 480p CBR 1 Mbit/s: payload recovered in {100 * got:.0f}% of frames")
        assert chains.wrong(clip, f"{mode}_480p") == 0
        # The fast pan over fine detail loses the frames just after the keyframe, where x264's
        # CBR buffer is empty and the motion drags the static mark out of place: 83-93% measured on
        # this 1-second clip, 96-100% on 3-second ones (docs/responsible_use.md). Everything else
        # keeps every frame.
        assert got >= (0.75 if clip == "pan" else 0.95), (clip, mode, got)


def test_no_false_marks_on_unmarked_frames(chains: Chains, tmp_path: Path) -> None:
    frames = false = 0
    for (clip, which, chain), ds in chains.found.items():
        if which == "unmarked":
            frames += len(ds)
            false += sum(1 for d in ds if d.found)
    # The suite's sample clips, unmodified: the demo's target clip and a numbered clip, through
    # `verify` as a user would run it, plus blank and noise frames.
    demo_clip = tmp_path / "demo_target.mp4"
    write_demo_clip(demo_clip, grace_hopper(), seconds=1.0, fps=25, size=(1280, 720))
    numbered = tmp_path / "numbered.mp4"
    write_clip(numbered, frames=30, size=(640, 360))
    for path in (demo_clip, numbered):
        rep = verify(str(path))
        frames += rep.frame_count
        false += rep.marked
        assert not rep.found
    rng = np.random.default_rng()
    others = [np.zeros((720, 1280, 3), np.uint8), np.full((720, 1280, 3), 255, np.uint8),
              numbered_frame(1234, 1280, 720)]
    others += [rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(5)]
    frames += len(others)
    false += sum(1 for f in others if detect(luma_of(f)).found)
    print(f"false marks: {false} of {frames} unmarked frames")
    assert frames >= 200
    assert false <= 0.01 * frames
