"""The native CodeFormer module (engines/codeformer_model.py): its weight names and configuration
against sczhou/CodeFormer's, its transformer attention against nn.MultiheadAttention, the fidelity
weight and `mixed_precision` on a small latent (the same network on 64 x 64 inputs), and the module
against ONNX Runtime on the test model of tools/make_face_models.py, which has FaceFusion's two
inputs (`input`, and the fidelity `weight` as a (1,) float64)."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from swapstream.engines.codeformer_model import (  # noqa: E402
    CODEFORMER_SIZE, _classes, build_codeformer, is_codeformer, new_codeformer)
from swapstream.engines.face_models import is_bisenet, is_gfpgan, is_xseg  # noqa: E402
from swapstream.engines.torch_models import is_inswapper, onnx_initializers  # noqa: E402

from ..zoo_models import make_face_models as fm  # noqa: E402

FP32_REL_L2 = 5e-5
"""Two fp32 computations of the whole network: torch against ONNX Runtime (CPU), or batch 2 against
batch 1. Not the 1e-5 of the other face models: the 512-px blocks group-normalise 2 channels x 512 x
512 = 524,288 values per group, whose fp32 sums the two libraries accumulate in different orders.
That costs 5e-6 relative after the first such block already (measured convolution by convolution),
and the output carries it (8.8e-6 measured, torch against ONNX Runtime). A wrong weight or a flipped
code is orders of magnitude above (a flip moved the random model's face by 0.12 or more)."""

CODEFORMER_PARAMETERS = 94_112_707
CODEFORMER_WEIGHTS_SHA256 = "1d6ff034f3171d39794581e12d58e2485e42bf5369e9fc34dd7fd3818a676013"
"""`CodeFormer(dim_embd=512, codebook_size=1024, n_head=8, n_layers=9, connect_list=['32', '64',
'128', '256'])` of sczhou/CodeFormer (basicsr/archs/codeformer_arch.py at b33cc7d, as
inference_codeformer.py builds it): its parameter count, and the SHA-256 of its state dict's sorted
`name:(shape)` lines (515 lines; it has no buffers)."""

SMALL = 64
"""Input size of the small-latent module: `latent_size=4` (a 2 x 2 latent, 4 tokens) is the same
network with the same weights' shapes but the position embedding, about 1/64 of the arithmetic."""


def rel_err(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    """The test model (about 377 MB; built once)."""
    return fm.codeformer(seed=0)


@pytest.fixture(scope="module")
def small() -> torch.nn.Module:
    torch.manual_seed(0)
    m = _classes()["CodeFormer"](latent_size=(SMALL // 32) ** 2).eval()
    fm._randomise(m, 0)
    return m


def test_weight_names_and_shapes_are_the_originals() -> None:
    m = new_codeformer()
    lines = sorted(f"{k}:{tuple(v.shape)}" for k, v in m.state_dict().items())
    assert len(lines) == 515
    assert sum(p.numel() for p in m.parameters()) == CODEFORMER_PARAMETERS
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == CODEFORMER_WEIGHTS_SHA256


def test_self_attention_equals_multihead_attention() -> None:
    """The transformer's attention, batch-first through scaled_dot_product_attention, against
    nn.MultiheadAttention (sequence-first, as the original calls it) with the same parameters: the
    position embedding goes into the queries and keys, not the values."""
    torch.manual_seed(0)
    dim, heads, tokens, batch = 64, 8, 10, 3
    mine = _classes()["SelfAttention"](dim, heads).eval()
    with torch.no_grad():
        mine.in_proj_bias.normal_()
        mine.out_proj.bias.normal_()
    ref = torch.nn.MultiheadAttention(dim, heads).eval()
    ref.load_state_dict(mine.state_dict())  # the same names: in_proj_weight, in_proj_bias, out_proj.*
    h, pos = torch.randn(batch, tokens, dim), torch.randn(tokens, dim)
    with torch.no_grad():
        got = mine(h + pos, h)
        qk, v = (h + pos).transpose(0, 1), h.transpose(0, 1)
        want = ref(qk, qk, value=v)[0].transpose(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_weight_zero_is_the_original_without_fuse_blocks(small: torch.nn.Module) -> None:
    """The original skips the fuse blocks at w == 0; this module runs them and adds w * (...) = 0."""
    x = torch.rand(2, 3, SMALL, SMALL) * 2 - 1
    skipping = copy.deepcopy(small)
    skipping._gen_taps = {}  # the generator without its fuse blocks
    with torch.inference_mode():
        at_zero = small(x, torch.tensor([0.0]))
        assert torch.equal(at_zero, skipping(x, torch.tensor([0.0])))
        assert rel_err(small(x, torch.tensor([0.5])), at_zero) > 0.1  # and w does reach them


def test_weight_may_be_one_per_face(small: torch.nn.Module) -> None:
    x = torch.rand(1, 3, SMALL, SMALL) * 2 - 1
    with torch.inference_mode():
        both = small(x.expand(2, -1, -1, -1), torch.tensor([0.5, 1.0]))
        for i, w in enumerate((0.5, 1.0)):
            assert rel_err(both[i], small(x, torch.tensor([w]))[0]) <= FP32_REL_L2


def test_mixed_precision_splits_the_module_at_the_codes(small: torch.nn.Module) -> None:
    """float64 stands in for fp16 (which the CPU runs far too slowly): the generator side changes
    dtype, everything that picks the codes stays fp32, and the codes are fp32's to the bit."""
    mixed = copy.deepcopy(small).mixed_precision(torch.float64)
    for name, p in mixed.named_parameters():
        want = torch.float64 if name.startswith(("generator.", "fuse_convs_dict.")) else torch.float32
        assert p.dtype == want, name
    x = torch.rand(2, 3, SMALL, SMALL) * 2 - 1
    w = torch.tensor([0.5])
    with torch.inference_mode():
        assert torch.equal(mixed.codes(x), small.codes(x))
        got, want = mixed(x, w), small(x, w)
    assert got.dtype == torch.float32 and got.shape == (2, 3, SMALL, SMALL)
    assert rel_err(got, want) <= FP32_REL_L2  # fp32 against a float64 generator


def test_onnx_contract(model: onnx.ModelProto) -> None:
    """FaceFusion's codeformer.onnx: `input` float32 and `weight` (1,) float64 in; it reads output 0."""
    g = model.graph
    dims = lambda vs: [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in vs]  # noqa: E731
    assert [i.name for i in g.input] == ["input", "weight"]
    assert dims(g.input) == [["batch", 3, CODEFORMER_SIZE, CODEFORMER_SIZE], [1]]
    assert [i.type.tensor_type.elem_type for i in g.input] == [onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE]
    assert [o.name for o in g.output] == ["output"]
    assert dims(g.output) == [["batch", 3, CODEFORMER_SIZE, CODEFORMER_SIZE]]


def test_is_codeformer_recognises_only_codeformer(model: onnx.ModelProto) -> None:
    inits = onnx_initializers(model)
    assert is_codeformer(inits)
    # The runner asks the other architectures first: none of them may claim this file.
    assert not (is_gfpgan(inits) or is_xseg(inits) or is_bisenet(inits) or is_inswapper(inits))
    z = np.zeros(1, np.float32)
    assert not is_codeformer({"conv_body_first.weight": z, "final_linear.weight": z, "encoder.blocks.0.weight": z,
                              "quantize.embedding.weight": z, "generator.blocks.0.weight": z})


def test_module_matches_onnxruntime(model: onnx.ModelProto) -> None:
    """fp32 on the CPU, two faces in one batch. The weight goes to ONNX Runtime as FaceFusion feeds it
    (float64) and to the module as the torch runner does (float32, a tensor)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    module = build_codeformer(onnx_initializers(model))
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, CODEFORMER_SIZE, CODEFORMER_SIZE)).astype(np.float32)
    want = sess.run(None, {"input": x[:1], "weight": np.array([0.5])})[0]
    with torch.inference_mode():
        got = module(torch.from_numpy(x), torch.tensor([0.5])).numpy()
    assert got.shape == (2, 3, CODEFORMER_SIZE, CODEFORMER_SIZE) and got.dtype == np.float32
    assert np.isfinite(got).all()
    err = rel_err(got[:1], want)
    assert err <= FP32_REL_L2, f"relative L2 {err:.2e} > {FP32_REL_L2}"
    # The random weights keep the output near [-1, 1] (std about 1, extremes about 10): nothing
    # near fp16's 65504, not a constant, and another face gives another output.
    assert np.abs(got).max() < 1e3 and got[0].std() > 0.1
    assert rel_err(got[1], got[0]) > 0.1


def test_the_runner_takes_the_native_module(model: onnx.ModelProto) -> None:
    """`neural.runner=auto` gives the file to PyTorch only if engines/native.py recognises it; the
    runner sees both inputs, so the face stack feeds the fidelity."""
    from swapstream.engines.native import native_for
    from swapstream.engines.torch_runner import TorchRunner

    assert native_for(onnx_initializers(model)).architecture == "codeformer"  # type: ignore[union-attr]
    with TorchRunner(model, device="cpu", precision="fp32") as tr:
        assert tr.architecture == "codeformer" and [s.name for s in tr.inputs] == ["input", "weight"]
