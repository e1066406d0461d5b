"""The built-in demo: public-domain portraits, an animated target clip, and a contact sheet.

Both portraits are in the public domain and ship inside installed packages, so the demo runs offline:
`skimage.data.astronaut()` (Eileen Collins, NASA) and matplotlib's `grace_hopper.jpg` (US Navy).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from .errors import OutputError


def astronaut() -> np.ndarray:
    """Eileen Collins, NASA portrait (public domain), 512x512 RGB."""
    from skimage import data

    return np.ascontiguousarray(data.astronaut())


def grace_hopper() -> np.ndarray:
    """Grace Hopper, US Navy portrait (public domain), 512x600 RGB."""
    import matplotlib.cbook as cbook
    import matplotlib.image as mpimg

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        return np.ascontiguousarray(mpimg.imread(f, format="jpg"))


def head_motion(t: float) -> tuple[float, float, float, float, float]:
    """(angle in degrees, scale, dx, dy, light gain) at time t: slow, incommensurate sways like a head."""
    angle = 7.0 * math.sin(2 * math.pi * 0.35 * t)
    scale = 1.0 + 0.06 * math.sin(2 * math.pi * 0.23 * t + 0.7)
    dx = 70.0 * math.sin(2 * math.pi * 0.18 * t)
    dy = 18.0 * math.sin(2 * math.pi * 0.41 * t + 1.3)
    gain = 0.88 + 0.12 * math.cos(2 * math.pi * 0.3 * t)
    return angle, scale, dx, dy, gain


def render_target_frame(portrait: np.ndarray, t: float, size: tuple[int, int] = (1280, 720),
                        out: np.ndarray | None = None) -> np.ndarray:
    """One frame of the target clip: the portrait moving on a static studio backdrop."""
    w, h = size
    if out is None:
        out = np.empty((h, w, 3), dtype=np.uint8)
    # Backdrop: a vertical grey-blue gradient, static, so that "background unchanged" is checkable.
    ramp = np.linspace(60, 140, h, dtype=np.float32)[:, None, None]
    out[...] = (ramp * np.array([0.8, 0.9, 1.0], dtype=np.float32)).astype(np.uint8)
    angle, scale, dx, dy, gain = head_motion(t)
    ph, pw = portrait.shape[:2]
    base = 1.25 * h / ph  # the portrait fills the frame's height with its face near the middle
    m = cv2.getRotationMatrix2D((pw / 2, ph * 0.42), angle, base * scale)
    m[0, 2] += w / 2 - pw / 2 + dx
    m[1, 2] += h * 0.45 - ph * 0.42 + dy
    lit = np.clip(portrait.astype(np.float32) * gain, 0, 255).astype(np.uint8)
    cv2.warpAffine(lit, m, (w, h), dst=out, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)
    return out


def write_demo_clip(path: Path, portrait: np.ndarray, *, seconds: float = 4.0, fps: int = 25,
                    size: tuple[int, int] = (1280, 720), tone_hz: float = 440.0,
                    keyframe_s: float | None = None) -> int:
    """Write the animated target clip (H.264 + an AAC tone) and return its frame count.
    `keyframe_s`: a keyframe every that many seconds and no B-frames, as a live encoder sends (a
    player joining an RTMP stream starts at a keyframe); None: x264's defaults."""
    import av  # here, not at the top: the GPU test machine renders frames without PyAV

    path.parent.mkdir(parents=True, exist_ok=True)
    n = int(round(seconds * fps))
    try:
        container = av.open(str(path), "w")
    except OSError as exc:
        raise OutputError(f"cannot write '{path}': {exc.strerror or exc}. Choose a writable folder "
                          f"with --out-dir.") from None
    with container:
        vs = container.add_stream("libx264", rate=fps)
        vs.width, vs.height = size
        vs.pix_fmt = "yuv420p"
        vs.options = {"crf": "18", "preset": "veryfast"}
        if keyframe_s is not None:
            vs.options = {**vs.options, "g": str(max(1, round(keyframe_s * fps))), "bf": "0"}
        rate = 48000
        aus = container.add_stream("aac", rate=rate)
        aus.layout = "mono"
        frame_buf = np.empty((size[1], size[0], 3), dtype=np.uint8)
        samples_per_frame = 1024
        audio_pts = 0
        for i in range(n):
            render_target_frame(portrait, i / fps, size, frame_buf)
            vf = av.VideoFrame.from_ndarray(frame_buf, format="rgb24")
            vf.pts = i
            vf.time_base = Fraction(1, fps)
            container.mux(vs.encode(vf))
            # Keep the audio up to the video's time.
            while audio_pts < (i + 1) * rate / fps:
                t = (audio_pts + np.arange(samples_per_frame)) / rate
                wave = (0.2 * np.sin(2 * np.pi * tone_hz * t)).astype(np.float32)[None]
                af = av.AudioFrame.from_ndarray(wave, format="fltp", layout="mono")
                af.sample_rate = rate
                af.pts = audio_pts
                af.time_base = Fraction(1, rate)
                container.mux(aus.encode(af))
                audio_pts += samples_per_frame
        container.mux(vs.encode(None))
        container.mux(aus.encode(None))
    return n


def read_frames(path: Path, indices: list[int]) -> dict[int, np.ndarray]:
    """Decode the frames with the given indices (RGB), for contact sheets and tests."""
    import av

    want = set(indices)
    got: dict[int, np.ndarray] = {}
    with av.open(str(path)) as c:
        for i, f in enumerate(c.decode(video=0)):
            if i in want:
                got[i] = f.to_ndarray(format="rgb24")
            if len(got) == len(want):
                break
    return got


def contact_sheet(before: Path, after: Path, out: Path, n: int = 4, width: int = 480) -> Path:
    """Save a PNG with `n` rows of (target | swapped) frames taken evenly through the clips."""
    import av

    with av.open(str(before)) as c:
        total = c.streams.video[0].frames or 0
    idx = [int(round(k * (total - 1) / max(n - 1, 1))) for k in range(n)] if total else list(range(n))
    a, b = read_frames(before, idx), read_frames(after, idx)
    rows = []
    for i in idx:
        if i not in a or i not in b:
            continue
        h = int(round(a[i].shape[0] * width / a[i].shape[1]))
        pair = [cv2.resize(x[i], (width, h), interpolation=cv2.INTER_AREA) for x in (a, b)]
        for img, label in zip(pair, (f"target  frame {i}", f"swapped  frame {i}")):
            cv2.putText(img, label, (10, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2,
                        cv2.LINE_AA)
        rows.append(np.hstack(pair))
    sheet = np.vstack(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(out), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR)):
        raise OutputError(f"cannot write '{out}'. Choose a writable folder with --out-dir.")
    return out
