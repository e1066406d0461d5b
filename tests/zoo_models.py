"""Putting synthetic zoo models (tools/make_test_models.py) into a models folder, as a user would."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from swapstream.engines.builtin import BUILTIN_MODELS, builtin_model_path
from swapstream.engines.zoo import crc32_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import make_test_models  # noqa: E402,F401  (the one import of tools/make_test_models.py for all tests)
import make_face_models  # noqa: E402,F401  (likewise for tools/make_face_models.py; needs torch)


def place(models: Path, name: str, model: object) -> None:
    """A model file and its FaceFusion-style .hash beside it, as a user would put them by hand."""
    path = models / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())  # type: ignore[attr-defined]
    (models / f"{name}.hash").write_text(crc32_file(path))


def copy_builtin(models: Path) -> None:
    """The built-in face models next to the zoo ones, so one folder serves a whole job."""
    for name in BUILTIN_MODELS:
        shutil.copy(builtin_model_path(name), models / name)
