"""Putting synthetic zoo models (tools/make_test_models.py) into a models folder, as a user would."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from swapstream.engines.builtin import builtin_model_path, required_models
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
    """The built-in models every job needs next to the zoo ones, so one folder serves a whole job.
    MediaPipe Hands' files (mask.hands only) are left out: the GPU machine gets them in a carry of
    their own, which does not fit beside the codec wheels, and no test that uses this folder turns
    the option on."""
    for name in required_models():
        shutil.copy(builtin_model_path(name), models / name)


def stack_models(models: Path, *, parser: str = "bisenet") -> Path:
    """The built-in models, a small inswapper and embedder stub, and issue 23's face stack in real
    architectures with random weights: XSeg, BiSeNet-18 (`parser` names the builder in
    make_face_models, e.g. `bisenet_all_skin`) and GFPGAN v1.4 (about 346 MB: a temporary folder)."""
    models.mkdir(parents=True, exist_ok=True)
    copy_builtin(models)
    place(models, "arcface_w600k_r50", make_test_models.arcface_stub(seed=0))
    place(models, "inswapper_128", make_test_models.inswapper(width=8, blocks=1, seed=2))
    place(models, "xseg_1", make_face_models.xseg(seed=0))
    place(models, "bisenet_resnet_18", getattr(make_face_models, parser)(seed=0))
    place(models, "gfpgan_1.4", make_face_models.gfpgan_1_4(seed=0))
    return models
