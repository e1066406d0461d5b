"""The native GPEN-BFR-512 module (engines/gpen_model.py): its upfirdn2d and modulated convolution
against references written from their definitions, its weight names and configuration against
yangxy/GPEN's FullGenerator, and the module against ONNX Runtime on exported test models (a small
configuration, and GPEN-BFR-512's own from tools/make_face_models.py). `pytest -m gpu` adds fp16
with channels_last and a CUDA graph, as the torch runner runs it."""

from __future__ import annotations

import hashlib
import time
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import torch  # noqa: E402

from swapstream.engines.face_models import is_bisenet, is_gfpgan, is_xseg, new_gfpgan  # noqa: E402
from swapstream.engines.gpen_model import (  # noqa: E402
    GPEN_SIZE, _classes, build_gpen, gpen_channels, is_gpen, new_gpen, upfirdn2d)
from swapstream.engines.ort_runner import OnnxRuntimeRunner  # noqa: E402
from swapstream.engines.torch_models import onnx_initializers  # noqa: E402

from ..zoo_models import make_face_models as fm  # noqa: E402

FP32_REL_L2 = 1e-5
"""fp32 against fp32 (ONNX Runtime, or float64 references): the same arithmetic up to summation
order; measured 1e-6 and below."""

GPEN_BFR_512_PARAMETERS = 71_005_223
GPEN_BFR_512_WEIGHTS_SHA256 = "c74f8505b761630302ac66b03140ee67306fbcacf5e9f7c8aa7f69c44b121dfb"
"""`FullGenerator(512, 512, 8, 2, narrow=1)` of yangxy/GPEN (face_model/gpen_model.py, as
face_model/face_gan.py builds it for GPEN-BFR-512): its parameter count, and the SHA-256 of its
state dict's sorted `name:(shape)` lines without the 21 blur-kernel buffers (142 lines)."""

BLUR = np.outer([1.0, 3.0, 3.0, 1.0], [1.0, 3.0, 3.0, 1.0]) / 64.0


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def upfirdn2d_reference(x: np.ndarray, kernel: np.ndarray, up: int, pad: tuple[int, int]) -> np.ndarray:
    """upfirdn2d by its definition, in float64: each channel upsampled by inserting `up - 1` zeros
    after every sample, zero-padded by `pad` (before, after) on both axes, then correlated with the
    flipped 2-D `kernel` (C, kh, kw) (a true convolution)."""
    n, c, h, w = x.shape
    u = np.zeros((n, c, h * up, w * up))
    u[:, :, ::up, ::up] = x
    u = np.pad(u, ((0, 0), (0, 0), pad, pad))
    kh, kw = kernel.shape[1:]
    oh, ow = u.shape[2] - kh + 1, u.shape[3] - kw + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += kernel[None, :, kh - 1 - i, kw - 1 - j, None, None] * u[:, :, i:i + oh, j:j + ow]
    return out


@pytest.mark.parametrize("up,pad", [
    (1, (2, 2)),  # the encoder's blur before each stride-2 convolution
    (1, (1, 1)),  # the blur after a modulated convolution's stride-2 transposed convolution
    (2, (2, 1)),  # ToRGB's upsampling of the skip image
    (2, (1, 1)),  # an upsampling whose transposed convolution needs an output padding
])
def test_upfirdn2d_matches_its_definition(up: int, pad: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 9))
    # An asymmetric kernel per channel: a flip or a transposition would show (GPEN's is symmetric).
    k = rng.random((3, 4, 4))
    want = upfirdn2d_reference(x, k, up, pad)
    got = upfirdn2d(torch.from_numpy(x), torch.from_numpy(k)[:, None], up, pad).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_upfirdn2d_refuses_what_one_transposed_convolution_cannot_do() -> None:
    with pytest.raises(ValueError, match="transposed convolution"):
        upfirdn2d(torch.zeros(1, 1, 4, 4), torch.ones(1, 1, 4, 4), up=2, pad=(0, 2))


def modulated_conv_reference(m: torch.nn.Module, x: torch.Tensor, style: torch.Tensor) -> np.ndarray:
    """GPEN's ModulatedConv2d as its forward writes it, in float64: a weight per sample (the
    equalised-lr scale, the style, the demodulation folded in), a plain or stride-2 transposed
    convolution, then for upsampling the blur (gain 4) on padding (1, 1)."""
    sd = {k: v.double() for k, v in m.state_dict().items()}
    x, style = x.double(), style.double()
    w_mod = sd["modulation.weight"]
    s = style @ (w_mod / np.sqrt(w_mod.shape[1])).t() + sd["modulation.bias"]     # (N, Cin)
    _, cout, cin, k, _ = sd["weight"].shape
    outs = []
    for b in range(x.shape[0]):
        w = sd["weight"][0] / np.sqrt(cin * k * k) * s[b][None, :, None, None]
        if m.demodulate:
            w = w * torch.rsqrt(w.square().sum(dim=(1, 2, 3)) + 1e-8)[:, None, None, None]
        if m.upsample:
            y = torch.nn.functional.conv_transpose2d(x[b:b + 1], w.transpose(0, 1), stride=2).numpy()
            y = upfirdn2d_reference(y, np.repeat(4 * BLUR[None], cout, 0), 1, (1, 1))
        else:
            y = torch.nn.functional.conv2d(x[b:b + 1], w, padding=k // 2).numpy()
        outs.append(y)
    return np.concatenate(outs)


@pytest.mark.parametrize("k,demodulate,upsample", [(3, True, False), (3, True, True), (1, False, False)],
                         ids=["styled", "styled-upsample", "to-rgb"])
def test_modulated_conv_equals_the_per_sample_weight_form(k: int, demodulate: bool, upsample: bool) -> None:
    """The module's non-fused form (input scaled by the style, shared weight, output scaled by the
    demodulation) against GPEN's form, which folds all three into one weight per sample."""
    torch.manual_seed(0)
    m = _classes()["ModulatedConv2d"](6, 5, k, 16, demodulate=demodulate, upsample=upsample).eval()
    with torch.no_grad():
        m.modulation.bias.add_(0.3 * torch.randn(6))  # biases start at 1: make the styles differ
        x, style = torch.randn(3, 6, 8, 8), torch.randn(3, 16)
        got = m(x, style).numpy()
    want = modulated_conv_reference(m, x, style)
    assert got.shape == want.shape == (3, 5, 16 if upsample else 8, 16 if upsample else 8)
    assert rel_err(got, want) <= FP32_REL_L2


def test_weights_are_gpen_bfr_512s() -> None:
    """The names and shapes that GPEN's FullGenerator saves for GPEN-BFR-512, so that its state dict
    (or a file exported from it keeping parameter names) loads as it is."""
    m = new_gpen()
    sd = m.state_dict()
    lines = sorted(f"{k}:{tuple(v.shape)}".replace(" ", "") for k, v in sd.items())
    assert sum(p.numel() for p in m.parameters()) == GPEN_BFR_512_PARAMETERS
    assert len(lines) == 142
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == GPEN_BFR_512_WEIGHTS_SHA256
    # A few of them spelled out: isconcat doubles each layer's width after the concatenated map.
    for name, shape in [("ecd0.0.0.weight", (64, 3, 1, 1)), ("ecd1.0.1.weight", (128, 64, 3, 3)),
                        ("ecd7.0.2.bias", (512,)), ("final_linear.0.weight", (512, 8192)),
                        ("generator.style.8.weight", (512, 512)), ("generator.input.input", (1, 512, 4, 4)),
                        ("generator.conv1.activate.bias", (1024,)),
                        ("generator.to_rgb1.conv.weight", (1, 3, 1024, 1, 1)),
                        ("generator.convs.12.conv.weight", (1, 64, 256, 3, 3)),
                        ("generator.convs.13.noise.weight", (1,)),
                        ("generator.to_rgbs.6.bias", (1, 3, 1, 1))]:
        assert tuple(sd[name].shape) == shape, name
    assert is_gpen({k: v.numpy() for k, v in sd.items()})


def test_markers_tell_gpen_from_the_other_face_models() -> None:
    gpen = {k: np.zeros(1) for k in new_gpen(size=32, narrow=1 / 16).state_dict()}
    assert not (is_gfpgan(gpen) or is_xseg(gpen) or is_bisenet(gpen))
    gfpgan = {k: np.zeros(1) for k in new_gfpgan().state_dict()}
    assert is_gfpgan(gfpgan) and not is_gpen(gfpgan)


@pytest.fixture(scope="module")
def small() -> object:
    """GPEN at 64 px and 1/16 of the width (32 channels up to 32 px, 16 at 64), exported as the
    test models are: the whole architecture in a second."""
    m = new_gpen(size=64, channel_multiplier=2, narrow=1 / 16, seed=3)
    return fm._export(m, torch.rand(1, 3, 64, 64), ["output"])


def test_build_reads_the_configuration_from_the_weights(small: object) -> None:
    inits = onnx_initializers(small)
    assert is_gpen(inits)
    m = build_gpen(inits)
    assert m.log_size == 6 and len(m.generator.convs) == 8 and len(m.generator.style) == 9
    want = {r: c for r, c in gpen_channels(2, 1 / 16).items() if r <= 64}
    # Each resolution's first convolution reads the previous one's output and map, concatenated.
    widths_in = [int(c.conv.weight.shape[2]) for c in m.generator.convs]
    assert widths_in[::2] == [2 * want[r] for r in (4, 8, 16, 32)]
    assert widths_in[1::2] == [2 * want[r] for r in (8, 16, 32, 64)]
    with pytest.raises(ValueError, match="not a model of this architecture"):
        build_gpen({k: v for k, v in inits.items() if not k.startswith("generator.convs.3.")})


def test_small_configuration_matches_onnxruntime(small: object) -> None:
    m = build_gpen(onnx_initializers(small))
    x = np.random.default_rng(1).random((3, 3, 64, 64), dtype=np.float32) * 2 - 1
    ort = OnnxRuntimeRunner(small.SerializeToString(), providers="cpu")  # type: ignore[attr-defined]
    ort.activate()
    want = ort.infer({"input": x})["output"]
    with torch.no_grad():
        got = m(torch.from_numpy(x)).numpy()
    assert got.shape == want.shape == (3, 3, 64, 64) and got.dtype == np.float32
    assert rel_err(got, want) <= FP32_REL_L2
    # Each sample is its own: the batch is not mixed (GPEN's grouped convolution per sample).
    with torch.no_grad():
        one = m(torch.from_numpy(x[1:2])).numpy()
    assert rel_err(one, want[1:2]) <= FP32_REL_L2


@pytest.fixture(scope="module")
def gpen_512() -> object:
    """tools/make_face_models.py's gpen_bfr_512: about 285 MB, 50 s to export on 2 cores."""
    return fm.gpen_bfr_512(seed=0)


@pytest.mark.slow
def test_gpen_bfr_512_contract_and_onnxruntime(gpen_512: object) -> None:
    """FaceFusion's contract (face_enhancer/core.py, gpen_bfr_512: ffhq_512 at 512, input `input`,
    output [0]) with GPEN's weight names, and the module on the CPU against ONNX Runtime."""
    g = gpen_512.graph  # type: ignore[attr-defined]
    dims = lambda vs: [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in vs]  # noqa: E731
    assert [i.name for i in g.input] == ["input"] and dims(g.input) == [["batch", 3, GPEN_SIZE, GPEN_SIZE]]
    assert [o.name for o in g.output] == ["output"] and dims(g.output) == [["batch", 3, GPEN_SIZE, GPEN_SIZE]]
    inits = onnx_initializers(gpen_512)
    assert is_gpen(inits) and not is_gfpgan(inits)
    m = build_gpen(inits)
    assert set(m.state_dict()) <= set(inits)
    assert sum(p.numel() for p in m.parameters()) == GPEN_BFR_512_PARAMETERS
    x = np.random.default_rng(2).random((1, 3, GPEN_SIZE, GPEN_SIZE), dtype=np.float32) * 2 - 1
    ort = OnnxRuntimeRunner(gpen_512.SerializeToString(), providers="cpu")  # type: ignore[attr-defined]
    ort.activate()
    want = ort.infer({"input": x})["output"]
    with torch.no_grad():
        got = m(torch.from_numpy(x)).numpy()
    assert got.shape == want.shape and rel_err(got, want) <= FP32_REL_L2
    # The random weights keep unit-variance layers: an image-sized output, not a constant or a blow-up.
    assert 0.3 < float(want.std()) < 10.0


@pytest.mark.gpu
def test_gpen_bfr_512_fp16_channels_last_in_a_cuda_graph(cp: ModuleType, gpen_512: object) -> None:
    """As the torch runner runs it: fp16 weights, channels_last, one CUDA graph per batch size,
    against ONNX Runtime in fp32 on the host; fp16 keeps ~3 decimal digits, the runners' 1e-2."""
    import copy

    m32 = build_gpen(onnx_initializers(gpen_512))
    m = copy.deepcopy(m32).to("cuda", torch.float16)
    for t in list(m.parameters()) + list(m.buffers()):
        if t.dim() == 4:
            t.data = t.data.contiguous(memory_format=torch.channels_last)
    ort = OnnxRuntimeRunner(gpen_512.SerializeToString(), providers="cpu")  # type: ignore[attr-defined]
    ort.activate()
    rng = np.random.default_rng(3)
    for batch in (1, 4):
        static = torch.zeros(batch, 3, GPEN_SIZE, GPEN_SIZE, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(2):  # warm-up (cuDNN's choices) before capture
                m(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            out = m(static)
        for rep in range(2):  # fresh inputs each replay: a stale output would fail
            x = (rng.random((batch, 3, GPEN_SIZE, GPEN_SIZE), dtype=np.float32) * 2 - 1)
            static.copy_(torch.from_numpy(x))
            graph.replay()
            got = out.cpu().numpy()
            want = ort.infer({"input": x})["output"]
            err = rel_err(got, want)
            print(f"gpen_bfr_512 fp16 graph, batch {batch} replay {rep}: relative L2 error {err:.2e}")
            assert np.isfinite(got).all() and err <= 1e-2
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 20 * 1e3
        print(f"gpen_bfr_512 fp16 graph, batch {batch}: {ms:.2f} ms a call")


def test_the_runner_takes_the_native_module(gpen_512: object) -> None:
    """`neural.runner=auto` gives the file to PyTorch only if engines/native.py recognises it."""
    from swapstream.engines.native import native_for
    from swapstream.engines.torch_runner import TorchRunner

    assert native_for(onnx_initializers(gpen_512)).architecture == "gpen"  # type: ignore[arg-type, union-attr]
    with TorchRunner(gpen_512, device="cpu", precision="fp32") as tr:  # type: ignore[arg-type]
        assert tr.architecture == "gpen" and [s.name for s in tr.inputs] == ["input"]
