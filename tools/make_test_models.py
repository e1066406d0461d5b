"""Build ONNX stand-ins for the FaceFusion zoo's models, for tests and for the runners' benchmarks.

    python tools/make_test_models.py OUT_DIR [--full-inswapper]

Every builder returns an `onnx.ModelProto` (opset 17, IR version 8, so that ONNX Runtime, TensorRT's
parser and onnx2torch all read it) and is deterministic given its arguments. Nothing here imports
`swapstream`, so the script runs from a bare checkout with only numpy and onnx installed.

What each stand-in copies from the real file, and what is a guess, is said in its docstring; the short
version:
- `inswapper` has the real architecture and the real initializer names (from three public loaders of
  inswapper_128.onnx), so the native `torch` runner's loader can be tested on it. The full size
  (width 128, 6 blocks) is ~550 MB: never commit one.
- `identity_swapper` gives back its target, so that a whole neural path (warp, normalise, model,
  de-normalise, paste back) must reproduce the original frame.
- `simswap_256` and `hyperswap_1a_256` have the real input names, shapes and normalisation, and a small
  random network.
- `arcface_stub` has FaceFusion's recogniser contract with a small network.
- `scrfd_synthetic` and `yoloface_synthetic` ignore the image and emit outputs planted by the test,
  with the real models' output layout, so that decoding can be checked exactly.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
"""IR 8 is what opset 17 shipped with; ONNX Runtime 1.31 rejects onnx 1.23's default (IR 14)."""

BATCH = "batch"
"""Name of the symbolic batch dimension of every swapper and recogniser input and output."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

LEAKY_SLOPE = 0.2
INSTANCE_NORM_EPS = 1e-8
"""The inswapper's instance norm eps (below fp16's range, so statistics stay in fp32; docs/neural.md,
"The inswapper_128 architecture")."""
INSWAPPER_EPS_NAME = "onnx::Add_164"
"""Initializer that holds the norm eps in the real inswapper_128.onnx; one public port reads it by this
name. Its presence there is known; its value (1e-8 per docs/neural.md) is not verified against the file."""

SCRFD_STRIDES = (8, 16, 32)
SCRFD_ANCHORS_PER_CELL = 2
SCRFD_OUTPUT_NAMES = tuple(f"{kind}_{s}" for kind in ("score", "bbox", "kps") for s in SCRFD_STRIDES)
"""Our names. The real scrfd_2.5g.onnx has numeric export names; FaceFusion only uses their order."""
YOLOFACE_STRIDES = (8, 16, 32)
YOLOFACE_ROW = 20
"""cx, cy, w, h, score, then 5 x (x, y, confidence)."""

_FLOAT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


class GraphBuilder:
    """Collects nodes and initializers in order and names intermediate values uniquely."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer (once per name) and return its name."""
        if name not in self._names:
            self._names.add(name)
            self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, outputs: int = 1,
           **attrs: object) -> str | list[str]:
        """Append one node; returns its output name (a list when `outputs` > 1)."""
        base = hint or f"/{op_type.lower()}"
        outs = [self.fresh(base + "_out") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(base), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="swapstream-make_test_models",
                                  doc_string=doc)
        # The checker serialises the whole model (4 s for the full inswapper); large models come from
        # the same builders as the small ones the tests check, so only those are checked here.
        if sum(len(t.raw_data) for t in self.initializers) < 64 << 20:
            onnx.checker.check_model(model)
        return model


def _value(name: str, dtype: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)
    return a


def _zero_from(b: GraphBuilder, tensor: str, keep_axis0: bool) -> str:
    """0 * ReduceSum(tensor): consumes an input that the model ignores, so that ONNX Runtime keeps it.

    With `keep_axis0` the result is (N, 1, 1, 1)-broadcastable per sample; else a scalar.
    """
    if keep_axis0:
        axes = b.init("/const/axis1", np.array([1], dtype=np.int64))
        s = b.op("ReduceSum", [tensor, axes], "/ignored/sum", keepdims=1)            # (N, 1)
        s = b.op("Unsqueeze", [s, b.init("/const/axes23", np.array([2, 3], np.int64))],
                 "/ignored/unsqueeze")                                               # (N, 1, 1, 1)
    else:
        s = b.op("ReduceSum", [tensor], "/ignored/sum", keepdims=0)                  # scalar
    return b.op("Mul", [s, b.init("/const/zero", np.array(0.0, np.float32))], "/ignored/times0")


# -- inswapper -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvSpec:
    """One convolution of the inswapper architecture."""

    weight: str
    bias: str
    cin: int
    cout: int
    k: int
    stride: int
    out_hw: int
    """Output height = width for a 128x128 input."""


def inswapper_convs(width: int = 128, blocks: int = 6) -> list[ConvSpec]:
    """The convolutions of inswapper_128 in graph order, named as in the real inswapper_128.onnx."""
    w = width
    convs = [ConvSpec("onnx::Conv_833", "onnx::Conv_834", 3, w, 7, 1, 128),
             ConvSpec("onnx::Conv_836", "onnx::Conv_837", w, 2 * w, 3, 1, 128),
             ConvSpec("onnx::Conv_839", "onnx::Conv_840", 2 * w, 4 * w, 3, 2, 64),
             ConvSpec("onnx::Conv_842", "onnx::Conv_843", 4 * w, 8 * w, 3, 2, 32)]
    for i in range(blocks):
        for j in (1, 2):
            convs.append(ConvSpec(f"styles.{i}.conv{j}.1.weight", f"styles.{i}.conv{j}.1.bias",
                                  8 * w, 8 * w, 3, 1, 32))
    convs += [ConvSpec("onnx::Conv_845", "onnx::Conv_846", 8 * w, 4 * w, 3, 1, 64),
              ConvSpec("onnx::Conv_848", "onnx::Conv_849", 4 * w, 2 * w, 3, 1, 128),
              ConvSpec("onnx::Conv_851", "onnx::Conv_852", 2 * w, w, 3, 1, 128),
              ConvSpec("up0.1.weight", "up0.1.bias", w, 3, 7, 1, 128)]
    return convs


def inswapper_linears(width: int = 128, blocks: int = 6) -> list[tuple[str, str, int, int]]:
    """(weight, bias, in, out) of the AdaIN style layers. Weights are stored (out, in) for Gemm transB=1."""
    return [(f"styles.{i}.style{j}.linear.weight", f"styles.{i}.style{j}.linear.bias", 512, 16 * width)
            for i in range(blocks) for j in (1, 2)]


def inswapper_param_count(width: int = 128, blocks: int = 6) -> int:
    """Learned parameters (conv and linear weights and biases), without `emap` and the eps scalar."""
    n = sum(c.cout * c.cin * c.k * c.k + c.cout for c in inswapper_convs(width, blocks))
    return n + sum(o * i + o for _, _, i, o in inswapper_linears(width, blocks))


def inswapper_macs(width: int = 128, blocks: int = 6) -> int:
    """Multiply-accumulates per face of the convolutions and style layers (norms and resizes excluded)."""
    n = sum(c.out_hw ** 2 * c.cout * c.cin * c.k * c.k for c in inswapper_convs(width, blocks))
    return n + sum(o * i for _, _, i, o in inswapper_linears(width, blocks))


def model_param_count(model: onnx.ModelProto, exclude: Iterable[str] = ("emap", INSWAPPER_EPS_NAME),
                      float_only: bool = True) -> int:
    """Elements of the model's floating-point initializers: learned weights only, skipping `exclude`,
    graph plumbing (`/const/...`: pads, axes, scales) and detectors' planted outputs (`planted/...`)."""
    skip = set(exclude)
    total = 0
    for t in model.graph.initializer:
        if t.name in skip or t.name.startswith(("/const/", "planted/")):
            continue
        if float_only and t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
            continue
        total += math.prod(t.dims)
    return total


def inswapper(width: int = 128, blocks: int = 6, seed: int = 0, dtype: str = "float32") -> onnx.ModelProto:
    """The inswapper_128 architecture with random weights (docs/neural.md, "The inswapper_128
    architecture"), loadable by name like the real file.

    Inputs `target` (batch, 3, 128, 128) float32 RGB in [0, 1] (mean 0, std 1) and `source` (batch, 512)
    float32 (the emap latent); output `output` (batch, 3, 128, 128) float32 in (0, 1).

    Layout, as in the real file where known:
    - Initializer names are the real ones (see `inswapper_convs`, `inswapper_linears`): known from three
      public loaders of inswapper_128.onnx. The last initializer is `emap` (512, 512) float32, used by no
      node: known (FaceFusion and insightface read `graph.initializer[-1]`).
    - Style layers are `Gemm(source, W, b, transB=1)` with W stored (out, in) = (2*8w, 512): known from
      ports that compute `source @ W.T + b`. The first 8w outputs are gamma (scale), the last 8w beta
      (shift): known from the same ports. No `+1` is added to gamma.
    - The instance norm is built from ReduceMean/Sub/Mul/Sqrt/Div with the eps in the initializer
      `onnx::Add_164`, as a torch export of SimSwap's InstanceNorm gives; the real file's op pattern is
      assumed, not read.
    - Resize is bilinear, `half_pixel` (= torch's align_corners=False at x2); the real attribute spelling
      (`half_pixel` or `pytorch_half_pixel`) is assumed. Input/output names `target`/`source` are known
      (FaceFusion feeds by name); `output` is assumed (FaceFusion takes output 0).
    - The batch dimension is symbolic here; the real file's may be fixed at 1 (not verified).

    `dtype="float16"` stores the weights in fp16 and computes in fp16, keeping float32 inputs/outputs
    (assumed to match inswapper_128_fp16, which FaceFusion feeds float32) and computing the norm
    statistics in fp32, since eps 1e-8 underflows in fp16.

    Weights: He-normal for the LeakyReLU convs, 1/sqrt(fan_in) where an instance norm follows, style
    weights N(0, 0.5) with gamma bias 1 and beta bias 0 (so a unit-norm source gives gamma ~ 1 +- 0.5),
    small random biases elsewhere (a loader that drops or swaps biases changes the output).
    width=128, blocks=6 is the full model: `inswapper_param_count()` = 138,292,739 and `inswapper_macs()`
    = 174.6 G per face.
    """
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
    if width < 1 or blocks < 0:
        raise ValueError(f"width must be >= 1 and blocks >= 0, got width={width}, blocks={blocks}")
    wdt = np.dtype(dtype)
    half = wdt == np.float16
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"inswapper_128_w{width}_b{blocks}_{dtype}")
    convs = iter(inswapper_convs(width, blocks))
    linears = iter(inswapper_linears(width, blocks))
    c8 = 8 * width
    leaky_gain = math.sqrt(2.0 / (1.0 + LEAKY_SLOPE ** 2))

    b.init(INSWAPPER_EPS_NAME, np.array(INSTANCE_NORM_EPS, dtype=np.float32))
    pad1 = b.init("/const/pads_reflect1", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    pad3 = b.init("/const/pads_reflect3", np.array([0, 0, 3, 3, 0, 0, 3, 3], np.int64))
    axes23 = b.init("/const/axes23", np.array([2, 3], np.int64))
    split = b.init("/const/split_gamma_beta", np.array([c8, c8], np.int64))
    scales = b.init("/const/resize_x2", np.array([1, 1, 2, 2], np.float32))

    def weight(name: str, shape: tuple[int, ...], std: float) -> str:
        return b.init(name, _normal(rng, shape, std).astype(wdt))

    def conv(x: str, gain: float, zero_pad: bool, hint: str) -> str:
        c = next(convs)
        w_ = weight(c.weight, (c.cout, c.cin, c.k, c.k), gain / math.sqrt(c.cin * c.k * c.k))
        b_ = weight(c.bias, (c.cout,), 0.05)
        p = c.k // 2 if zero_pad else 0
        return b.op("Conv", [x, w_, b_], hint, kernel_shape=[c.k, c.k], strides=[c.stride] * 2,
                    pads=[p] * 4)

    def leaky(x: str) -> str:
        return b.op("LeakyRelu", [x], alpha=LEAKY_SLOPE)

    def reflect(x: str, pads: str) -> str:
        return b.op("Pad", [x, pads], mode="reflect")

    def instance_norm(x: str, hint: str) -> str:
        if half:
            x = b.op("Cast", [x], hint + "/to_fp32", to=TensorProto.FLOAT)
        mean = b.op("ReduceMean", [x], hint + "/mean", axes=[2, 3], keepdims=1)
        d = b.op("Sub", [x, mean], hint + "/sub")
        var = b.op("ReduceMean", [b.op("Mul", [d, d], hint + "/sq")], hint + "/var", axes=[2, 3],
                   keepdims=1)
        std = b.op("Sqrt", [b.op("Add", [var, INSWAPPER_EPS_NAME], hint + "/add_eps")], hint + "/sqrt")
        y = b.op("Div", [d, std], hint + "/div")
        if half:
            y = b.op("Cast", [y], hint + "/to_fp16", to=TensorProto.FLOAT16)
        return y

    def adain(x: str, src: str, hint: str) -> str:
        w_name, b_name, n_in, n_out = next(linears)
        w_ = weight(w_name, (n_out, n_in), 0.5)
        bias = np.concatenate([np.ones(n_out // 2, np.float32), np.zeros(n_out // 2, np.float32)])
        bias += _normal(rng, (n_out,), 0.05)
        b_ = b.init(b_name, bias.astype(wdt))
        style = b.op("Gemm", [src, w_, b_], hint + "/style", transB=1)             # (N, 2*8w)
        gamma, beta = b.op("Split", [style, split], hint + "/split", outputs=2, axis=1)
        gamma = b.op("Unsqueeze", [gamma, axes23], hint + "/gamma")                 # (N, 8w, 1, 1)
        beta = b.op("Unsqueeze", [beta, axes23], hint + "/beta")
        return b.op("Add", [b.op("Mul", [instance_norm(x, hint + "/norm"), gamma], hint + "/scale"),
                            beta], hint + "/shift")

    x, src = "target", "source"
    if half:
        x = b.op("Cast", [x], "/input/target_fp16", to=TensorProto.FLOAT16)
        src = b.op("Cast", [src], "/input/source_fp16", to=TensorProto.FLOAT16)
    x = leaky(conv(reflect(x, pad3), leaky_gain, False, "/encoder/conv0"))
    x = leaky(conv(x, leaky_gain, True, "/encoder/conv1"))
    x = leaky(conv(x, leaky_gain, True, "/encoder/conv2"))
    x = leaky(conv(x, leaky_gain, True, "/encoder/conv3"))
    for i in range(blocks):
        h = f"/styles.{i}"
        y = conv(reflect(x, pad1), 1.0, False, h + "/conv1")
        y = b.op("Relu", [adain(y, src, h + "/adain1")])
        y = conv(reflect(y, pad1), 1.0, False, h + "/conv2")
        y = adain(y, src, h + "/adain2")
        x = b.op("Add", [x, y], h + "/residual")
    for i in range(2):
        x = b.op("Resize", [x, "", scales], f"/decoder/up{i}", mode="linear",
                 coordinate_transformation_mode="half_pixel")
        x = leaky(conv(x, leaky_gain, True, f"/decoder/conv{i}"))
    x = leaky(conv(x, leaky_gain, True, "/decoder/conv2"))
    x = conv(reflect(x, pad3), 0.5, False, "/decoder/conv3")
    x = b.op("Tanh", [x])
    if half:
        x = b.op("Cast", [x], "/output/to_fp32", to=TensorProto.FLOAT)
    x = b.op("Add", [x, b.init("/const/one", np.array(1.0, np.float32))], "/output/plus1")
    b.nodes.append(helper.make_node("Mul", [x, b.init("/const/half", np.array(0.5, np.float32))],
                                    ["output"], name="/output/half"))
    b.init("emap", _normal(rng, (512, 512), 1.0 / math.sqrt(512.0)))
    assert b.initializers[-1].name == "emap"
    return b.model([_value("target", TensorProto.FLOAT, [BATCH, 3, 128, 128]),
                    _value("source", TensorProto.FLOAT, [BATCH, 512])],
                   [_value("output", TensorProto.FLOAT, [BATCH, 3, 128, 128])],
                   f"inswapper_128 architecture stand-in, width {width}, {blocks} blocks, random weights "
                   f"(seed {seed}); style Gemm weights (out, in) with transB=1; gamma = first half.")


# -- swapper contracts ------------------------------------------------------------------------------

def identity_swapper(size: int = 128, mean: Sequence[float] = (0.0, 0.0, 0.0),
                     std: Sequence[float] = (1.0, 1.0, 1.0),
                     name_in: tuple[str, str] = ("target", "source"), out: str = "output", *,
                     output_space: str = "rgb") -> onnx.ModelProto:
    """A swapper that gives back its target: `output = target * std + mean`, the crop in RGB [0, 1].

    The source (batch, 512) is consumed through `0 * ReduceSum(source)` so that it stays a real input.
    With `output_space="normalised"` the output is the target itself, for contracts whose output the
    caller maps by `* std + mean` (hyperswap, ghost, hififace, uniface).
    """
    if output_space not in ("rgb", "normalised"):
        raise ValueError(f"output_space must be 'rgb' or 'normalised', got {output_space!r}")
    t_name, s_name = name_in
    b = GraphBuilder(f"identity_swapper_{size}")
    x = t_name
    if output_space == "rgb":
        x = b.op("Mul", [x, b.init("/const/std", np.asarray(std, np.float32).reshape(1, 3, 1, 1))])
        x = b.op("Add", [x, b.init("/const/mean", np.asarray(mean, np.float32).reshape(1, 3, 1, 1))])
    b.nodes.append(helper.make_node("Add", [x, _zero_from(b, s_name, keep_axis0=True)], [out],
                                    name="/output"))
    return b.model([_value(t_name, TensorProto.FLOAT, [BATCH, 3, size, size]),
                    _value(s_name, TensorProto.FLOAT, [BATCH, 512])],
                   [_value(out, TensorProto.FLOAT, [BATCH, 3, size, size])],
                   f"identity swapper ({output_space} output), mean {tuple(mean)}, std {tuple(std)}")


def _small_swapper(name: str, size: int, mean: Sequence[float], std: Sequence[float], seed: int,
                   output_space: str, perturbation: float, channels: int = 8) -> onnx.ModelProto:
    """Identity plus a source-dependent perturbation: out = recon + p * tanh(net(target, source))."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(name)
    c = channels
    axes23 = b.init("/const/axes23", np.array([2, 3], np.int64))
    y = b.op("Conv", ["target", b.init("net.conv0.weight", _normal(rng, (c, 3, 3, 3), 1 / math.sqrt(27))),
                      b.init("net.conv0.bias", _normal(rng, (c,), 0.05))], "/net/conv0",
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = b.op("LeakyRelu", [y], alpha=LEAKY_SLOPE)
    style = b.op("Gemm", ["source", b.init("net.style.weight", _normal(rng, (2 * c, 512), 1.0)),
                          b.init("net.style.bias", np.concatenate([np.ones(c), np.zeros(c)])
                                 .astype(np.float32))], "/net/style", transB=1)
    gamma, beta = b.op("Split", [style, b.init("/const/split", np.array([c, c], np.int64))],
                       "/net/split", outputs=2, axis=1)
    y = b.op("Add", [b.op("Mul", [y, b.op("Unsqueeze", [gamma, axes23])]),
                     b.op("Unsqueeze", [beta, axes23])], "/net/modulate")
    y = b.op("Conv", [y, b.init("net.conv1.weight", _normal(rng, (3, c, 3, 3), 1 / math.sqrt(9 * c))),
                      b.init("net.conv1.bias", _normal(rng, (3,), 0.05))], "/net/conv1",
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = b.op("Mul", [b.op("Tanh", [y]), b.init("/const/perturbation", np.array(perturbation, np.float32))])
    x = "target"
    if output_space == "rgb":
        x = b.op("Mul", [x, b.init("/const/std", np.asarray(std, np.float32).reshape(1, 3, 1, 1))])
        x = b.op("Add", [x, b.init("/const/mean", np.asarray(mean, np.float32).reshape(1, 3, 1, 1))])
        b.nodes.append(helper.make_node("Add", [x, y], ["output"], name="/output"))
    else:
        x = b.op("Add", [x, y], "/recon")
        b.nodes.append(helper.make_node("Clip", [x, b.init("/const/minus1", np.array(-1, np.float32)),
                                                 b.init("/const/plus1", np.array(1, np.float32))],
                                        ["output"], name="/output"))
    return b.model([_value("target", TensorProto.FLOAT, [BATCH, 3, size, size]),
                    _value("source", TensorProto.FLOAT, [BATCH, 512])],
                   [_value("output", TensorProto.FLOAT, [BATCH, 3, size, size])],
                   f"{name} contract stand-in (seed {seed}): identity + {perturbation} * tanh(small net)")


def simswap_256(seed: int = 0, perturbation: float = 0.1) -> onnx.ModelProto:
    """simswap_256's contract: `target` (batch, 3, 256, 256) = (RGB/255 - ImageNet mean) / ImageNet std,
    `source` (batch, 512) (the converted, L2-normalised embedding); `output` RGB around [0, 1] that the
    caller clips. This stand-in returns the de-normalised target plus a source-dependent perturbation of
    at most `perturbation`, so its output can leave [0, 1] slightly: the caller's clip is exercised.
    Input names are known (FaceFusion feeds by name); `output` is assumed (FaceFusion takes output 0).
    """
    return _small_swapper("simswap_256_standin", 256, IMAGENET_MEAN, IMAGENET_STD, seed, "rgb",
                          perturbation)


def hyperswap_1a_256(seed: int = 0, perturbation: float = 0.1) -> onnx.ModelProto:
    """hyperswap_1a_256's contract: `target` (batch, 3, 256, 256) = (RGB/255 - 0.5) / 0.5, `source`
    (batch, 512) the L2-normalised embedding; `output` in [-1, 1], mapped by the caller with
    `* 0.5 + 0.5`. This stand-in returns clip(target + perturbation * tanh(net), -1, 1).
    The real file may have further outputs (FaceFusion uses output 0 only); the output name is assumed.
    """
    return _small_swapper("hyperswap_1a_256_standin", 256, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), seed,
                          "normalised", perturbation)


def arcface_stub(seed: int = 0, *, input_name: str = "input", output_name: str = "output",
                 channels: int = 16) -> onnx.ModelProto:
    """arcface_w600k_r50's contract: (batch, 3, 112, 112) RGB x/127.5 - 1 in, (batch, 512) raw embedding out.

    The input name `input` is what FaceFusion feeds its arcface_w600k_r50.onnx (known from its
    face_recognizer.py, which runs by name). insightface's own buffalo_l w600k_r50.onnx names them
    `input.1` and `683` (from memory, not verified here): pass those names to imitate that file. The
    output name `output` is assumed (FaceFusion takes output 0). Network: two stride-2 convs, global
    average pool, Gemm to 512.
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder("arcface_stub")
    c = channels
    x = b.op("Conv", [input_name, b.init("stub.conv0.weight", _normal(rng, (c, 3, 3, 3), math.sqrt(2 / 27))),
                      b.init("stub.conv0.bias", _normal(rng, (c,), 0.05))], "/conv0",
             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = b.op("Relu", [x])
    x = b.op("Conv", [x, b.init("stub.conv1.weight", _normal(rng, (2 * c, c, 3, 3), math.sqrt(2 / (9 * c)))),
                      b.init("stub.conv1.bias", _normal(rng, (2 * c,), 0.05))], "/conv1",
             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Relu", [x])])], axis=1)   # (N, 2c)
    b.nodes.append(helper.make_node(
        "Gemm", [x, b.init("stub.fc.weight", _normal(rng, (512, 2 * c), 1 / math.sqrt(2 * c))),
                 b.init("stub.fc.bias", _normal(rng, (512,), 0.05))], [output_name], name="/fc",
        transB=1))
    return b.model([_value(input_name, TensorProto.FLOAT, [BATCH, 3, 112, 112])],
                   [_value(output_name, TensorProto.FLOAT, [BATCH, 512])],
                   f"arcface_w600k_r50 contract stand-in (seed {seed})")


# -- detectors --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlantedFace:
    """A face to plant in a synthetic detector's output, in detector-input pixels.

    It is emitted by the anchor of cell (`row`, `col`) of the `stride` level (and `anchor` 0 or 1 of
    that cell for SCRFD; yoloface has one anchor per cell).
    """

    stride: int
    row: int
    col: int
    score: float
    box: tuple[float, float, float, float]
    """x1, y1, x2, y2."""
    kps: tuple[tuple[float, float], ...]
    """Five (x, y)."""
    anchor: int = 0


def scrfd_anchor_count(size: int, stride: int) -> int:
    """Anchors of one SCRFD level: (size // stride)^2 cells, 2 anchors each."""
    return (size // stride) ** 2 * SCRFD_ANCHORS_PER_CELL


def plant_scrfd(size: int, faces: Iterable[PlantedFace]) -> list[np.ndarray]:
    """The 9 SCRFD outputs [score x3, bbox x3, kps x3] (strides 8/16/32) that decode to `faces`.

    Shapes are (N, 1), (N, 4), (N, 10) with N = `scrfd_anchor_count`, without a batch axis, as
    FaceFusion's `detect_with_scrfd` indexes them. Anchor k of a level sits at cell k // 2 in row-major
    order, at (col, row) * stride; bbox = (l, t, r, b) / stride from the anchor; kps = (p - anchor) /
    stride. Every other anchor scores 0.
    """
    outs = ([np.zeros((scrfd_anchor_count(size, s), 1), np.float32) for s in SCRFD_STRIDES]
            + [np.zeros((scrfd_anchor_count(size, s), 4), np.float32) for s in SCRFD_STRIDES]
            + [np.zeros((scrfd_anchor_count(size, s), 10), np.float32) for s in SCRFD_STRIDES])
    for f in faces:
        level = SCRFD_STRIDES.index(f.stride)
        fm = size // f.stride
        if not (0 <= f.row < fm and 0 <= f.col < fm and 0 <= f.anchor < SCRFD_ANCHORS_PER_CELL):
            raise ValueError(f"planted face {f} is outside the {fm}x{fm} grid of stride {f.stride}")
        k = (f.row * fm + f.col) * SCRFD_ANCHORS_PER_CELL + f.anchor
        ax, ay = f.col * f.stride, f.row * f.stride
        x1, y1, x2, y2 = f.box
        outs[level][k, 0] = f.score
        outs[3 + level][k] = np.array([ax - x1, ay - y1, x2 - ax, y2 - ay]) / f.stride
        outs[6 + level][k] = (np.asarray(f.kps, np.float64) - [ax, ay]).reshape(10) / f.stride
    return outs


def _constant_detector(name: str, size: int, outputs: Sequence[tuple[str, np.ndarray]],
                       doc: str) -> onnx.ModelProto:
    b = GraphBuilder(name)
    zero = _zero_from(b, "input", keep_axis0=False)
    for out_name, value in outputs:
        c = b.init(f"planted/{out_name}", np.asarray(value, np.float32))
        b.nodes.append(helper.make_node("Add", [c, zero], [out_name], name=f"/{out_name}"))
    return b.model([_value("input", TensorProto.FLOAT, [1, 3, size, size])],
                   [_value(n, TensorProto.FLOAT, list(v.shape)) for n, v in outputs], doc)


def scrfd_synthetic(size: int = 640, outputs: Sequence[np.ndarray] | None = None) -> onnx.ModelProto:
    """A detector with scrfd_2.5g's interface whose outputs are the given constants (see `plant_scrfd`).

    Input `input` (1, 3, size, size) float32 (known: FaceFusion feeds `input`); the image values are
    ignored. The 9 outputs are in the real order [score_8, score_16, score_32, bbox_8, ..., kps_32] (known
    from FaceFusion's and insightface's decoders, which index them by position) with the shapes above
    (known: FaceFusion uses them unbatched). Their names are ours; the real names are numeric. The real
    file accepts sizes 160-640; this one has its size fixed. `outputs=None` plants no face.
    """
    if size % 32:
        raise ValueError(f"size must be a multiple of 32, got {size}")
    planted = list(outputs) if outputs is not None else plant_scrfd(size, [])
    for i, (got, want) in enumerate(zip(planted, plant_scrfd(size, []))):
        if np.shape(got) != want.shape:
            raise ValueError(f"output {SCRFD_OUTPUT_NAMES[i]} must have shape {want.shape}, "
                             f"got {np.shape(got)}")
    if len(planted) != 9:
        raise ValueError(f"SCRFD has 9 outputs, got {len(planted)}")
    return _constant_detector(f"scrfd_synthetic_{size}", size, list(zip(SCRFD_OUTPUT_NAMES, planted)),
                              "SCRFD-shaped detector with planted outputs")


def yoloface_anchor_count(size: int) -> int:
    """Rows of yoloface's output: one per cell of the stride 8, 16 and 32 grids (8400 at 640)."""
    return sum((size // s) ** 2 for s in YOLOFACE_STRIDES)


def plant_yoloface(size: int, faces: Iterable[PlantedFace]) -> np.ndarray:
    """yoloface_8n's output (1, 20, N) that decodes to `faces`; every other row scores 0.

    Row index = the cell's index in the concatenated stride 8, 16, 32 grids (row-major). Each row is
    [cx, cy, w, h, score, 5 x (x, y, confidence 1)] in detector pixels.
    """
    rows = np.zeros((yoloface_anchor_count(size), YOLOFACE_ROW), np.float32)
    offsets = np.cumsum([0] + [(size // s) ** 2 for s in YOLOFACE_STRIDES])
    for f in faces:
        level = YOLOFACE_STRIDES.index(f.stride)
        fm = size // f.stride
        if not (0 <= f.row < fm and 0 <= f.col < fm) or f.anchor != 0:
            raise ValueError(f"planted face {f} is outside the {fm}x{fm} grid of stride {f.stride}")
        x1, y1, x2, y2 = f.box
        kps = np.concatenate([np.asarray(f.kps, np.float64), np.ones((5, 1))], axis=1).reshape(15)
        rows[offsets[level] + f.row * fm + f.col] = np.concatenate(
            [[(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, f.score], kps])
    return np.ascontiguousarray(rows.T[None])


def yoloface_synthetic(size: int = 640, output: np.ndarray | None = None) -> onnx.ModelProto:
    """A detector with yoloface_8n's interface whose output is the given constant (see `plant_yoloface`).

    Input `input` (1, 3, size, size) float32 (known: FaceFusion feeds `input`), ignored. Output (1, 20,
    8400) at 640 (known layout: FaceFusion takes `squeeze().T` and splits [4, 5]); the name `output0`
    (ultralytics' default) is assumed. `output=None` plants no face.
    """
    if size % 32:
        raise ValueError(f"size must be a multiple of 32, got {size}")
    planted = output if output is not None else plant_yoloface(size, [])
    want = (1, YOLOFACE_ROW, yoloface_anchor_count(size))
    if np.shape(planted) != want:
        raise ValueError(f"output must have shape {want}, got {np.shape(planted)}")
    return _constant_detector(f"yoloface_synthetic_{size}", size, [("output0", planted)],
                              "yoloface-shaped detector with a planted output")


# -- script -----------------------------------------------------------------------------------------

def _example_faces(size: int) -> list[PlantedFace]:
    """One face near the top left, so that the written detectors find something."""
    kps = ((100.0, 110.0), (140.0, 110.0), (120.0, 130.0), (104.0, 150.0), (136.0, 150.0))
    return [PlantedFace(stride=16, row=8, col=7, score=0.9, box=(80.0, 72.0, 160.0, 176.0), kps=kps)]


def build_all(full_inswapper: bool = False) -> dict[str, onnx.ModelProto]:
    """Every model the script writes, by file name."""
    models = {
        "inswapper_128_w16_b2.onnx": inswapper(width=16, blocks=2),
        "inswapper_128_w16_b2_fp16.onnx": inswapper(width=16, blocks=2, dtype="float16"),
        "identity_inswapper_128.onnx": identity_swapper(128),
        "identity_simswap_256.onnx": identity_swapper(256, IMAGENET_MEAN, IMAGENET_STD),
        "identity_hyperswap_256.onnx": identity_swapper(256, (0.5,) * 3, (0.5,) * 3,
                                                        output_space="normalised"),
        "simswap_256_standin.onnx": simswap_256(),
        "hyperswap_1a_256_standin.onnx": hyperswap_1a_256(),
        "arcface_stub.onnx": arcface_stub(),
        "scrfd_synthetic_640.onnx": scrfd_synthetic(640, plant_scrfd(640, _example_faces(640))),
        "yoloface_synthetic_640.onnx": yoloface_synthetic(640, plant_yoloface(640, _example_faces(640))),
    }
    if full_inswapper:
        models["inswapper_128_synthetic.onnx"] = inswapper()
    return models


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--full-inswapper", action="store_true",
                    help="also write the full-size inswapper (about 550 MB; never commit it)")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"full inswapper_128: {inswapper_param_count():,} parameters (+ emap 262,144), "
          f"{inswapper_macs() / 1e9:.1f} GMAC per face")
    for name, model in build_all(args.full_inswapper).items():
        path = args.out_dir / name
        onnx.save(model, path)
        print(f"{path}: {model_param_count(model):,} parameters, {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
