"""The watermark's scheme (stream/watermark.py): payload, CRC, code, key layout, and detection on
frames that were only resampled (the x264 chains are in test_watermark_robustness.py)."""

from __future__ import annotations

import hashlib

import cv2
import numpy as np
import pytest

from swapstream.demo import grace_hopper, render_target_frame
from swapstream.watermark import (CODED_BITS, GRID, MESSAGE_BITS, PRODUCT_SWAPSTREAM, Payload,
                                  Watermarker, _key_sequences, chip_signs, conv_encode, crc16,
                                  decode_soft, detect, encode_payload, luma_of, viterbi_decode)


KEY_LAYOUT_SHA256_PREFIX = "d7725427851ad452"  # swapstream-bdct-v1


def bits_of(data: bytes) -> np.ndarray:
    return np.unpackbits(np.frombuffer(data, np.uint8))


def test_crc16_is_ccitt_false() -> None:
    # The catalogue's check value of CRC-16/CCITT-FALSE for the ASCII digits 1-9 is 0x29B1.
    got = crc16(bits_of(b"123456789"))
    assert int("".join(map(str, got)), 2) == 0x29B1


def test_payload_bits_round_trip() -> None:
    rng = np.random.default_rng()
    for _ in range(20):
        p = Payload(int(rng.integers(0, 1 << 16)), int(rng.integers(0, 1 << 32)))
        assert Payload.from_bits(p.bits()) == p
    assert str(Payload(0x5353, 0xAB)) == "product 0x5353 stream 0x000000ab"
    with pytest.raises(ValueError, match="stream_id"):
        Payload(PRODUCT_SWAPSTREAM, 1 << 32)


def test_viterbi_corrects_errors_the_crc_alone_would_reject() -> None:
    rng = np.random.default_rng()
    for _ in range(10):
        msg = rng.integers(0, 2, MESSAGE_BITS).astype(np.uint8)
        code = conv_encode(msg)
        assert code.size == CODED_BITS
        soft = code.astype(np.float64) * 2 - 1
        # Six hard errors spread out, plus noise: well inside the code's free distance of 10 per
        # constraint span, so the message comes back exactly.
        flip = rng.choice(np.arange(0, CODED_BITS, 20), 6, replace=False)
        soft[flip] *= -1
        soft += rng.normal(0, 0.3, CODED_BITS)
        assert np.array_equal(viterbi_decode(soft, MESSAGE_BITS), msg)


def test_decode_soft_accepts_a_codeword_and_refuses_noise() -> None:
    p = Payload(PRODUCT_SWAPSTREAM, 0x1234ABCD)
    good = decode_soft(encode_payload(p).astype(np.float64) * 2 - 1)
    assert good.found and good.payload == p and good.score == pytest.approx(1.0)
    rng = np.random.default_rng()
    noise = [decode_soft(rng.standard_normal(CODED_BITS)) for _ in range(200)]
    assert not any(d.found for d in noise)
    assert max(d.score for d in noise) < 0.75
    assert decode_soft(np.zeros(CODED_BITS)).reason == "no signal"


def test_key_layout_is_fixed() -> None:
    """The layout is a specification: marks made by this version must be found by later ones. If
    this fails, the scheme changed and needs a new name and key (watermark.SCHEME)."""
    pn, bit_of = _key_sequences()
    assert pn.size == bit_of.size == GRID[0] * GRID[1] * 7
    assert set(np.unique(pn)) == {-1, 1} and abs(int(pn.sum())) < 400        # balanced
    counts = np.bincount(bit_of, minlength=CODED_BITS)
    assert counts.min() >= 115 and counts.max() <= 116                        # evenly spread
    digest = hashlib.sha256(pn.tobytes() + bit_of.astype("<i8").tobytes()).hexdigest()
    assert digest[:16] == KEY_LAYOUT_SHA256_PREFIX


@pytest.mark.parametrize("size", [(720, 1280), (1080, 1920), (480, 854), (1280, 720), (360, 640)])
def test_mark_found_at_any_size_and_after_rescaling(size: tuple[int, int]) -> None:
    h, w = size
    frame = render_target_frame(grace_hopper(), 0.4, (w, h))
    if h > w:
        frame = np.ascontiguousarray(np.rot90(render_target_frame(grace_hopper(), 0.4, (h, w))))
    p = Payload(PRODUCT_SWAPSTREAM, 0xFEEDF00D)
    Watermarker(p).embed(frame)
    assert detect(luma_of(frame)).payload == p
    for scale in (0.5, 0.75, 1.5):
        resized = cv2.resize(frame, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA
                             if scale < 1 else cv2.INTER_CUBIC)
        d = detect(luma_of(resized))
        if min(resized.shape[:2]) >= 180:
            assert d.found and d.payload == p, (size, scale, d.reason, d.score)
        else:
            assert not d.found and d.reason == "frame too small"


def test_chip_signs_carry_the_payload() -> None:
    p = Payload(PRODUCT_SWAPSTREAM, 7)
    s = chip_signs(p)
    assert s.shape == (GRID[1], GRID[0], 7) and s.dtype == np.int8
    assert not np.array_equal(s, chip_signs(Payload(PRODUCT_SWAPSTREAM, 8)))
    assert np.array_equal(chip_signs(p, (GRID[1], GRID[0])).reshape(-1), s.reshape(-1))
