"""Watermark v2 (stream/watermark_v2.py): the payload comes back after the geometric attacks it is
built for, from windows of frames, through a real x264 encode and through `verify`; unmarked
frames give nothing; the mark is texture-masked and within its PSNR budget.

Every run marks a fresh random stream id, so a detector that returned a fixed or cached payload
would fail. Attacks are applied with OpenCV to frames of the demo clip (a moving portrait).
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

from swapstream.config import load_config
from swapstream.demo import grace_hopper, render_target_frame
from swapstream.disclosure import Disclosure
from swapstream.errors import ConfigError
from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker, detect, luma_of
from swapstream.watermark_v2 import MASK, WatermarkerV2, WindowDetector, detect_v2, pattern_for

FPS = 30


@pytest.fixture(scope="module")
def clip() -> list[np.ndarray]:
    portrait = grace_hopper()
    return [np.ascontiguousarray(render_target_frame(portrait, i / FPS, (1280, 720))) for i in range(8)]


@pytest.fixture()
def payload() -> Payload:
    return Payload(PRODUCT_SWAPSTREAM, int(np.random.default_rng().integers(0, 2 ** 32)))


def _mark(frames: list[np.ndarray], payload: Payload) -> list[np.ndarray]:
    wm = WatermarkerV2(payload)
    out = []
    for f in frames:
        g = f.copy()
        wm.embed(g)
        out.append(g)
    return out


def _crop(f: np.ndarray, frac: float) -> np.ndarray:
    h, w = f.shape[:2]
    return f[round(h * frac):h - round(h * frac), round(w * frac):w - round(w * frac)]


def _rotate(f: np.ndarray, deg: float) -> np.ndarray:
    h, w = f.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), deg, 1.0)
    return cv2.warpAffine(f, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)


def _letterbox(f: np.ndarray) -> np.ndarray:
    h, w = f.shape[:2]
    out = np.zeros((w * 3 // 4, w, 3), np.uint8)  # 16:9 inside 4:3, black bars above and below
    out[(out.shape[0] - h) // 2:][:h] = f
    return out


def _pillarbox(f: np.ndarray) -> np.ndarray:
    h, w = f.shape[:2]
    out = np.full((h, h * 21 // 9 // 2 * 2, 3), 16, np.uint8)  # 16:9 inside 21:9, dark grey bars
    out[:, (out.shape[1] - w) // 2:][:, :w] = f
    return out


# What 8 nearly still frames (a quarter of a second of the demo clip) carry with a margin (scores
# 0.79-0.93 over random payloads, measured with the weaker mask before dac0555; bars are cut off before the detector reads the picture, which
# took letterboxing from 0.71-0.79 to 0.92). A flip with a 7% crop and a 3 degree turn decoded on
# every payload tried but with scores of 0.71-0.79, too close to failing for a test that must not
# flake: tools/watermark_robustness.py --v2 measures it on 2 s windows of moving clips, and
# docs/responsible_use.md reports what it found.
ATTACKS = {
    "none": lambda f: f,
    "crop 10% per side": lambda f: _crop(f, 0.10),
    "crop 4% per side, off centre": lambda f: f[40:-10, 70:-20],
    "rescale 0.5x": lambda f: cv2.resize(f, (640, 360), interpolation=cv2.INTER_AREA),
    "rescale 2x": lambda f: cv2.resize(f, (2560, 1440), interpolation=cv2.INTER_CUBIC),
    "horizontal flip": lambda f: f[:, ::-1],
    "rotate +5 deg": lambda f: _rotate(f, 5.0),
    "rotate -5 deg": lambda f: _rotate(f, -5.0),
    "flip and rotate -4 deg": lambda f: _rotate(f[:, ::-1], -4.0),
    "letterbox into 4:3": _letterbox,
    "pillarbox into 21:9": _pillarbox,
}


def test_picture_box_cuts_bars_and_nothing_else(clip: list[np.ndarray]) -> None:
    from swapstream.watermark_v2 import picture_box

    f = clip[0]
    assert picture_box(luma_of(f)) == (slice(0, 720), slice(0, 1280))  # no bars: the whole frame
    assert picture_box(luma_of(_letterbox(f))) == (slice(120, 840), slice(0, 1280))
    rows, cols = picture_box(luma_of(_pillarbox(f)))
    assert (rows, cols.start, cols.stop) == (slice(0, 720), 200, 1480)
    black = np.zeros((720, 1280), np.uint8)  # a fade to black is not all bars
    assert picture_box(black) == (slice(0, 720), slice(0, 1280))


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_payload_survives_the_attack(clip: list[np.ndarray], payload: Payload, attack: str) -> None:
    marked = _mark(clip, payload)  # 8 frames: a quarter of a second
    lumas = [luma_of(np.ascontiguousarray(ATTACKS[attack](f))) for f in marked]
    d = detect_v2(lumas)
    assert d.found, (attack, d.detection.reason, d.detection.score, d.alignment)
    assert d.detection.payload == payload
    assert d.alignment is not None and d.alignment.flipped == ("flip" in attack)


def test_unmarked_frames_give_nothing(clip: list[np.ndarray]) -> None:
    rng = np.random.default_rng()
    frames = [clip[0], np.zeros((720, 1280, 3), np.uint8), np.full((480, 854, 3), 200, np.uint8),
              rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8),
              np.repeat(np.repeat(np.linspace(0, 255, 1280, dtype=np.float32)[None, :, None], 720, 0), 3, 2)
              .astype(np.uint8)]
    for f in frames:
        d = detect_v2(luma_of(f))
        assert not d.found, d
    # A v1 mark is not a v2 mark, and a v2 mark is not a v1 mark.
    v1 = clip[1].copy()
    Watermarker(Payload(PRODUCT_SWAPSTREAM, 7)).embed(v1)
    assert not detect_v2(luma_of(v1)).found
    v2 = _mark([clip[1]], Payload(PRODUCT_SWAPSTREAM, 7))[0]
    assert not detect(luma_of(v2)).found


def test_a_window_decides_what_single_frames_do_not(clip: list[np.ndarray], payload: Payload) -> None:
    """Noise (sigma 14 levels) that hides the mark in most single frames: the 8-frame window finds it."""
    rng = np.random.default_rng()
    marked = _mark(clip, payload)
    # Sigma 14, measured over 30 random stream ids and noises: 0-3 of the 8 single frames decoded,
    # and the window decoded all 30; at sigma 20 the window missed 4 of 20. Sigma 8 hid the mark
    # before the stronger texture mask (2.5 levels); since, up to all 8 single frames decoded.
    noisy = [np.clip(f.astype(np.float32) + rng.normal(0, 14, f.shape[:2])[..., None], 0, 255).astype(np.uint8)
             for f in marked]
    lumas = [luma_of(f) for f in noisy]
    singles = [detect_v2(y) for y in lumas]
    assert sum(s.found for s in singles) <= len(singles) // 2, singles
    d = detect_v2(lumas)
    assert d.found and d.detection.payload == payload, d


def test_mark_is_texture_masked_and_within_its_psnr_budget(clip: list[np.ndarray], payload: Payload) -> None:
    frame = clip[2]
    marked = _mark([frame], payload)[0]
    mse = float(np.mean((marked.astype(np.float64) - frame.astype(np.float64)) ** 2))
    assert 10 * np.log10(255.0 ** 2 / mse) >= 42.0
    # Half flat grey, half texture: the flat half gets MASK.m_lo of the pattern, the textured half all.
    rng = np.random.default_rng()
    test = np.full((720, 1280, 3), 128, np.uint8)
    test[:, 640:] = rng.integers(40, 216, (720, 640, 3), dtype=np.uint8)
    out = test.copy()
    WatermarkerV2(payload).embed(out)
    d = out.astype(np.int64) - test.astype(np.int64)
    p = pattern_for(payload, 720, 1280)
    # Column 640 is a block boundary: every block left of it is flat (scale m_lo), every block right
    # of it busy (scale m_hi); nothing clips (the texture stays within 40..216).
    np.testing.assert_array_equal(d[:, :640, 0], np.rint(np.float32(MASK.m_lo) * p[:, :640]))
    np.testing.assert_array_equal(d[:, 640:, 0], np.rint(np.float32(MASK.m_hi) * p[:, 640:]))
    np.testing.assert_array_equal(d[..., 0], d[..., 2])  # the same on every channel
    assert np.sqrt(np.mean(d[:, :640, 0] ** 2)) < 0.5 * np.sqrt(np.mean(d[:, 640:, 0] ** 2))


def test_found_after_x264(clip: list[np.ndarray], payload: Payload, tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    marked = _mark(clip, payload)
    path = tmp_path / "v2.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = 1280, 720, "yuv420p"
        s.options = {"preset": "veryfast", "crf": "23"}
        for i, f in enumerate(marked):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts, vf.time_base = i, Fraction(1, FPS)
            c.mux(s.encode(vf))
        c.mux(s.encode(None))
    with av.open(str(path)) as c:
        lumas = [f.to_ndarray(format="gray") for f in c.decode(video=0)]
    assert len(lumas) == len(clip)
    d = detect_v2([y.astype(np.float32) for y in lumas])
    assert d.found and d.detection.payload == payload, d

    from swapstream.verify import verify

    rep = verify(str(path), c2pa=False)
    assert rep.found_v2 and not rep.found_v1
    assert rep.v2_combined is not None and rep.v2_combined.payload == payload
    assert rep.v2_window_count == 1 and rep.v2_payloads[payload] == 1
    assert rep.to_dict()["summary"]["v2"]["marked_windows"] == 1

    # As a user runs it: one line per window, the summary rows, exit 0.
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", "verify", str(path)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "TERM": "dumb"})
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert f"window 0 0.000s v2 marked {payload} score" in text, text
    assert f"v2 windows (2 s) 1 of 1 marked, {payload}: 1 windows" in text, text
    assert "SwapStream watermark FOUND" in text


def test_found_on_a_pan_after_x264(payload: Payload, tmp_path: Path) -> None:
    """A camera pan over texture (tools/watermark_robustness.py's "pan" clip, 2 s) through the upload
    encode: x264's motion compensation drags the static mark along with the picture, and the texture
    passing by does not average out of the window sum. With the mask at full scale from 6 levels the
    plain sum found no sync here and only the motion path decoded; at 2.5 either may (the next test
    has a chain where only the motion path does)."""
    pytest.importorskip("av")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import watermark_robustness as wr

    marked = _mark(wr.render_clip("pan", 2 * FPS), payload)
    path = tmp_path / "pan.mp4"
    wr.encode(marked, path, "crf")           # CRF 23 capped at 2 Mbit/s, as the upload
    lumas = [y.astype(np.float32) for y in wr.decode(path)]
    d = WindowDetector()
    for y in lumas:
        d.add(y)
    r = d.decode()
    assert r.found and r.detection.payload == payload, (str(payload), r)


@pytest.mark.parametrize("stream_id", [None, 0x8A21412F])
def test_found_on_a_pan_at_half_size_in_a_window_without_an_intra_frame(stream_id: int | None, payload: Payload,
                                                                        tmp_path: Path) -> None:
    """The pan, uploaded, rescaled to 0.5x and encoded again (the robustness benchmark's scale_0.5x
    chain), read in its second 2 s window, which holds no I-frame of either encode: there x264 keeps
    the least of the static mark (its predicted frames carry the last I-frame's mark along with the
    picture), and the plain sum finds no sync; the motion path must decode it. With the texture mask
    at full scale from 6 levels instead of 2.5 no such window decoded over 6 stream ids
    (docs/benchmarks/watermark_payload_sweep.md). A fresh random stream id, and 0x8a21412f: its
    window failed in CI when only the fold with the highest sync peak was decoded (the third passed;
    `WindowDetector` now decodes up to `LIST_DECODE` distinct folds)."""
    if stream_id is not None:
        payload = Payload(PRODUCT_SWAPSTREAM, stream_id)
    pytest.importorskip("av")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import watermark_robustness as wr
    from watermark_payload_sweep import intra_frames

    marked = _mark(wr.render_clip("pan", 4 * FPS), payload)
    up = tmp_path / "up.mp4"
    wr.encode(marked, up, "crf")
    lumas = wr.attacked_lumas(up, wr.decode(up, "rgb24"), "scale_0.5x", tmp_path / "half.mp4")
    assert len(lumas) == 4 * FPS and lumas[0].shape == (360, 640)
    for path in (up, tmp_path / "half.mp4"):
        intra = intra_frames(path)
        # The chain this test is about; if x264 places an I-frame here now, the test needs another window.
        assert not any(2 * FPS <= i < 4 * FPS for i in intra), (path.name, intra)
    r = detect_v2([y.astype(np.float32) for y in lumas[2 * FPS:]])
    assert r.found and r.detection.payload == payload, (str(payload), r)


def test_scheme_is_a_config_key() -> None:
    cfg = load_config(None, ["watermark.scheme=v2", "watermark.stream_id=42"])
    disc = Disclosure(cfg, live=False)
    assert isinstance(disc.watermarker, WatermarkerV2)
    assert ("watermark", "product 0x5353 stream 0x0000002a, scheme v2 (swapstream verify)") in disc.describe()
    assert isinstance(Disclosure(load_config(), live=False).watermarker, Watermarker)  # v1 by default
    with pytest.raises(ConfigError, match="watermark.scheme"):
        load_config(None, ["watermark.scheme=v3"])
