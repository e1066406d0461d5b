"""The neural backend as the runtime drives it, on the CPU, with synthetic zoo models placed by hand
(ONNX Runtime): one call swaps faces of frames from several streams, each with its own identity."""

from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, render_target_frame  # noqa: E402
from swapstream.runtime.swappers import NeuralBackend, SwapItem  # noqa: E402

from ..zoo_models import make_test_models as tm  # noqa: E402
from ..zoo_models import copy_builtin, place  # noqa: E402


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    models = tmp_path_factory.mktemp("models")
    copy_builtin(models)
    place(models, "arcface_w600k_r50", tm.arcface_stub(seed=0))
    place(models, "inswapper_128", tm.inswapper(width=8, blocks=1, seed=2))
    cfg = load_config("multi_stream", ["neural.download=false", "neural.runner=onnxruntime",
                                       f"models_dir={models}"])
    e = NeuralBackend("inswapper_128", cfg)
    yield e
    e.close()


def frames_with_faces(backend: NeuralBackend) -> list[tuple[np.ndarray, list]]:
    """Two frames as two streams would send them: the moving portrait at two moments."""
    portrait = grace_hopper()
    out = []
    for t in (0.0, 0.7):
        img = render_target_frame(portrait, t, (320, 240))
        faces = backend._analyser.analyse_image(img)
        assert len(faces) == 1
        out.append((img, faces))
    return out


def swapped(backend: NeuralBackend, items: list[tuple[np.ndarray, list, object, float]]
            ) -> tuple[list[int], list[np.ndarray]]:
    batch = [SwapItem(img.copy(), faces, ident, scale) for img, faces, ident, scale in items]
    counts = backend.swap(batch)
    return counts, [it.frame for it in batch]


def test_one_call_swaps_faces_of_two_streams_each_with_its_own_identity(backend: NeuralBackend) -> None:
    (a, fa), (b, fb) = frames_with_faces(backend)
    id_a, id_b = backend.identity(astronaut()), backend.identity(grace_hopper())
    counts, (out_a, out_b) = swapped(backend, [(a, fa, id_a, 1.0), (b, fb, id_b, 1.0)])
    assert counts == [1, 1]
    # The random-weight model repaints each face.
    for src, out in ((a, out_a), (b, out_b)):
        assert (np.abs(src.astype(int) - out.astype(int)).max(axis=2) > 40).sum() > 300
    # Each frame got its own stream's identity: the same as swapping it alone with that identity,
    # and not what the other stream's identity gives.
    _, (alone_a,) = swapped(backend, [(a, fa, id_a, 1.0)])
    _, (alone_b,) = swapped(backend, [(b, fb, id_b, 1.0)])
    _, (b_as_a,) = swapped(backend, [(b, fb, id_a, 1.0)])
    # ONNX Runtime's batched and single convolutions may round differently: a level or two.
    assert np.abs(out_a.astype(int) - alone_a).max() <= 2
    assert np.abs(out_b.astype(int) - alone_b).max() <= 2
    assert np.abs(out_b.astype(int) - b_as_a).max() > 20


def test_a_batch_mixing_full_and_low_res_items(backend: NeuralBackend) -> None:
    (a, fa), (b, fb) = frames_with_faces(backend)
    id_a, id_b = backend.identity(astronaut()), backend.identity(grace_hopper())
    counts, (out_a, out_b) = swapped(backend, [(a, fa, id_a, 1.0), (b, fb, id_b, 0.5)])
    assert counts == [1, 1]
    _, (alone_a,) = swapped(backend, [(a, fa, id_a, 1.0)])
    assert np.abs(out_a.astype(int) - alone_a).max() <= 2
    # The low-res item is swapped too, and differs from its full-resolution swap.
    _, (full_b,) = swapped(backend, [(b, fb, id_b, 1.0)])
    assert (np.abs(b.astype(int) - out_b).max(axis=2) > 40).sum() > 300
    assert np.abs(out_b.astype(int) - full_b).max() > 0
