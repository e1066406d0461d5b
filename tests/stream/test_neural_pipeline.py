"""The neural swapper in `swapstream run` (a lossless runtime stream), on the CPU, with synthetic zoo models placed by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
av = pytest.importorskip("av")

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, read_frames, write_demo_clip  # noqa: E402
from swapstream.errors import USER_ERRORS  # noqa: E402
from swapstream.runtime.run import RunJob  # noqa: E402

from ..zoo_models import make_test_models as tm  # noqa: E402
from ..zoo_models import copy_builtin, place  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("neural")
    models = tmp / "models"
    models.mkdir()
    copy_builtin(models)
    place(models, "arcface_w600k_r50", tm.arcface_stub(seed=0))
    place(models, "inswapper_128", tm.inswapper(width=8, blocks=1, seed=2))
    place(models, "hyperswap_1a_256", tm.identity_swapper(size=256, mean=(0.5,) * 3, std=(0.5,) * 3,
                                                          output_space="normalised"))
    clip = tmp / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=0.6, fps=10, size=(640, 360))
    import cv2

    src = tmp / "source.png"
    cv2.imwrite(str(src), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    return models, clip, src


def run(models: Path, clip: Path, src: Path, out: Path, swapper: str) -> object:
    cfg = load_config(overrides=[f"swapper={swapper}", "neural.download=false",
                                 "neural.runner=onnxruntime", f"models_dir={models}"])
    job = RunJob(cfg, device="cpu")
    try:
        job.set_source(src)
        return job.run(clip, out)
    finally:
        job.close()


def test_inswapper_file_job_swaps_faces_and_keeps_everything_else(setup, tmp_path: Path) -> None:
    models, clip, src = setup
    out = tmp_path / "out.mp4"
    stats = run(models, clip, src, out, "inswapper_128")
    assert stats.frames == 6 and stats.faces_swapped == 6
    # Six faces went through in two model calls of up to 4: batching across frames.
    a, b = read_frames(clip, [0, 3, 5]), read_frames(out, [0, 3, 5])
    for i in a:
        diff = np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2)
        # The random-weight model repaints the face; far from it only x264's requantisation moves.
        assert (diff > 40).sum() > 500
        assert np.percentile(diff[:, :120], 99) <= 12 and np.percentile(diff[:, -120:], 99) <= 12


def test_identity_swapper_file_job_gives_the_frames_back(setup, tmp_path: Path) -> None:
    models, clip, src = setup
    out = tmp_path / "identity.mp4"
    stats = run(models, clip, src, out, "hyperswap_1a_256")
    assert stats.frames == 6 and stats.faces_swapped == 6
    a, b = read_frames(clip, [1, 4]), read_frames(out, [1, 4])
    for i in a:
        mse = np.mean((a[i].astype(float) - b[i].astype(float)) ** 2)
        # Whole frame, through a crop, the identity model, a paste-back and a second x264 encode.
        assert 10 * np.log10(255 ** 2 / mse) >= 35


def test_missing_zoo_model_offline_names_file_and_folder(setup, tmp_path: Path) -> None:
    models, clip, src = setup
    cfg = load_config(overrides=["swapper=simswap_256", "neural.download=false",
                                 f"models_dir={models}"])
    with pytest.raises(USER_ERRORS) as e:
        RunJob(cfg, device="cpu")
    assert "simswap_256.onnx" in str(e.value) and str(models) in str(e.value)
