"""Contact sheets of the mesh swapper's quality test set: one PNG per case, source | target | result.

    python tools/quality_sheet.py [--out docs/quality] [--height 200]

The cases are the tests' own (tests/stream/quality_cases.py: sources cut at the forehead, chin and
cheek, a greyscale source, targets turned by +-30 degrees of yaw), made from the shipped public-domain
portraits. Each tile is the face's neighbourhood scaled to --height pixels.

The occluder cases are the occlusion tests' own (tests/stream/occluders.py: a hand, a bar in front of
the mouth, a hair fringe, glasses frames, painted on the target from its landmarks): one PNG each,
`occluder_<name>.png`, target with the occluder | swap without the occlusion mask (`--set
mask.occlusion=false`) | swap with it (the default), with the occluder's pixels' PSNR against the
target under each result (the tests ask >= 35 dB with the mask).

`occluder_own_skin_hand.png`: an open hand painted in the target's own skin tone (the hands tests'
case, tests/stream/test_hands.py), which the colour model cannot find: target with the hand | swap
with the default occlusion mask | swap with `--set mask.hands=true` as well.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.stream.occluders import PAINTERS, open_hand  # noqa: E402
from tests.stream.quality_cases import cases, first_face  # noqa: E402

from swapstream.config import MaskConfig, MeshConfig, load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper  # noqa: E402
from swapstream.face.analyser import FaceAnalyser  # noqa: E402
from swapstream.demo import render_target_frame  # noqa: E402
from swapstream.swap.mesh import MeshSwapper  # noqa: E402
from swapstream.swap.occlusion import OcclusionMasker  # noqa: E402
from swapstream.types import Frame  # noqa: E402


def tile(img: np.ndarray, box: tuple[int, int, int, int], height: int, label: str) -> np.ndarray:
    x0, y0, x1, y1 = box
    crop = img[max(y0, 0):min(y1, img.shape[0]), max(x0, 0):min(x1, img.shape[1])]
    w = int(round(crop.shape[1] * height / crop.shape[0]))
    t = cv2.resize(crop, (w, height), interpolation=cv2.INTER_AREA)
    cv2.putText(t, label, (6, 18), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    return t


def around(img: np.ndarray, analyser: FaceAnalyser, pad: float = 0.25) -> tuple[int, int, int, int]:
    lm = first_face(analyser, img).landmarks
    lo, hi = lm[:, :2].min(axis=0), lm[:, :2].max(axis=0)
    m = pad * (hi - lo)
    return int(lo[0] - m[0]), int(lo[1] - m[1]), int(hi[0] + m[0]), int(hi[1] + m[1])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def occluder_sheets(analyser: FaceAnalyser, out_dir: Path, height: int) -> None:
    """One sheet per occluder: the target with it, the swap without and with the occlusion mask."""
    target = render_target_frame(grace_hopper(), 0.0)  # the occlusion tests' target
    source = astronaut()
    clean = first_face(analyser, target)
    assert clean.landmarks is not None
    for name, paint in sorted(PAINTERS.items()):
        frame, mask = paint(target, clean.landmarks, analyser.topology, np.random.default_rng(20))
        face = first_face(analyser, frame)  # the landmarks the product would see
        tiles = [tile(frame, around(frame, analyser), height, "target + occluder")]
        for label, masker in (("no occlusion mask", None),
                              ("occlusion mask", OcclusionMasker(MaskConfig(), analyser.topology))):
            sw = MeshSwapper(MeshConfig(), analyser.topology, occlusion=masker)
            sw.set_source(source, first_face(analyser, source))
            out = frame.copy()
            sw.swap(out, [face])
            db = psnr(out[mask], frame[mask])
            tiles.append(tile(out, around(frame, analyser), height, f"{label}: {db:.1f} dB"))
        path = out_dir / f"occluder_{name}.png"
        cv2.imwrite(str(path), cv2.cvtColor(np.hstack(tiles), cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_PNG_COMPRESSION, 9])
        print(f"{path} ({path.stat().st_size // 1024} KB)")


def own_skin_hand_sheet(analyser: FaceAnalyser, out_dir: Path, height: int) -> None:
    """A hand of the target's own skin tone: the default mask, then with `mask.hands`."""
    from fractions import Fraction

    base = load_config()
    hands_cfg = base.model_copy(update={"mask": base.mask.model_copy(update={"hands": True})})
    tracker = FaceAnalyser(hands_cfg)
    target = render_target_frame(grace_hopper(), 0.0)
    source = astronaut()
    clean = first_face(analyser, target)
    assert clean.landmarks is not None
    frame, mask = open_hand(target, clean.landmarks, analyser.topology, np.random.default_rng(31), 15.0)
    for i in range(3):   # found by the palm detector, then followed, as in a stream
        (face,) = tracker.track(Frame(frame, i, Fraction(1, 25), index=i))
    face.track_id = 1
    tiles = [tile(frame, around(frame, analyser), height, "target + own-skin hand")]
    for label, cfg in (("occlusion mask", MaskConfig()), ("+ mask.hands", MaskConfig(hands=True))):
        sw = MeshSwapper(MeshConfig(), analyser.topology, occlusion=OcclusionMasker(cfg, analyser.topology))
        sw.set_source(source, first_face(analyser, source))
        for _ in range(4):   # the mask's moving average settles, as in a stream
            out = frame.copy()
            sw.swap(out, [face])
        db = psnr(out[mask], frame[mask])
        tiles.append(tile(out, around(frame, analyser), height, f"{label}: {db:.1f} dB"))
    tracker.close()
    path = out_dir / "occluder_own_skin_hand.png"
    cv2.imwrite(str(path), cv2.cvtColor(np.hstack(tiles), cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    print(f"{path} ({path.stat().st_size // 1024} KB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/quality"))
    ap.add_argument("--height", type=int, default=200)
    args = ap.parse_args()
    analyser = FaceAnalyser(load_config())
    args.out.mkdir(parents=True, exist_ok=True)
    for case in cases({"astronaut": astronaut(), "grace_hopper": grace_hopper()}, analyser):
        sw = MeshSwapper(MeshConfig())
        sw.set_source(case.source, first_face(analyser, case.source))
        out = case.target.copy()
        sw.swap(out, [first_face(analyser, case.target)])
        # The source is shown whole (its cut is the point); target and result around the face.
        src_box = (0, 0, case.source.shape[1], case.source.shape[0])
        box = around(case.target, analyser)
        row = np.hstack([tile(case.source, src_box, args.height, "source"),
                         tile(case.target, box, args.height, "target"),
                         tile(out, box, args.height, "result")])
        name = case.name.lower().replace("+", "plus ").replace("-", "minus ")
        path = args.out / (re.sub(r"[^a-z0-9]+", "_", name).strip("_") + ".png")
        cv2.imwrite(str(path), cv2.cvtColor(row, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
        print(f"{path} ({path.stat().st_size // 1024} KB)")
    occluder_sheets(analyser, args.out, args.height)
    own_skin_hand_sheet(analyser, args.out, args.height)
    analyser.close()


if __name__ == "__main__":
    main()
