"""Build ONNX test models of the face stack's masks and enhancers, in their real architectures.

    python tools/make_face_models.py OUT_DIR

The architectures are the native modules of `engines/face_models.py` (XSeg as in DeepFaceLab,
BiSeNet-ResNet18 as in yakhyo/face-parsing, GFPGAN v1.4) and `engines/gpen_model.py`,
`codeformer_model.py` and `restoreformer_model.py`, exported with PyTorch's ONNX exporter with the
real files' input and output names, layouts and sizes (docs/neural.md, "Occluders and parsers",
"Enhancers"):

- `xseg(seed)`: random weights; (N, 256, 256, 3) in, (N, 256, 256, 1) sigmoid out.
- `xseg_green_occluder()`: the same architecture with crafted weights that make a known mask: a
  pixel is "face" (1) unless it is green (G well above R and B), so that a test can paint an
  occluder and check that the pipeline keeps the target there through real inference.
- `bisenet(seed)`: random weights; (N, 3, 512, 512) in, three (N, 19, 512, 512) logits out.
- `gfpgan_1_4(seed)`: GFPGAN v1.4's architecture (GFPGANv1Clean as TencentARC configures v1.4) with
  random weights; (N, 3, 512, 512) RGB in [-1, 1] in and out.
- `gpen_bfr_512(seed)`: GPEN-BFR-512's architecture (yangxy/GPEN's FullGenerator as GPEN-BFR-512
  configures it, `engines/gpen_model.py`) with random weights; (N, 3, 512, 512) RGB in [-1, 1] in
  and out.
- `codeformer(seed)`: CodeFormer's architecture (sczhou/CodeFormer, `engines/codeformer_model.py`)
  with random weights; `input` (N, 3, 512, 512) in [-1, 1] and `weight` ((1,) float64, the
  fidelity) in, (N, 3, 512, 512) out.
- `restoreformer_plus_plus(seed)`: RestoreFormer++'s architecture (wzhouxiff's
  VQVAEGANMultiHeadTransformer, `engines/restoreformer_model.py`) with random weights;
  (N, 3, 512, 512) RGB in [-1, 1] in and out.
- `bisenet_all_skin()`: the same with a crafted last layer that parses (practically) every pixel as
  skin, so that an end-to-end run has a known region mask.

Unlike tools/make_test_models.py this needs torch (it exports modules rather than writing graphs by
hand), and imports `swapstream.engines.face_models` so that the exported graph and the torch runner's
module are the same code. The real weights are not downloadable here; these fix the contracts and
the cost.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx

OPSET = 17
IR_VERSION = 8
"""As tools/make_test_models.py: ONNX Runtime 1.31 rejects onnx 1.23's default IR version."""


def _export(module: object, example: object, output_names: list[str],
            extra: Sequence[tuple[str, object]] = ()) -> onnx.ModelProto:
    """Export `module` with its first input named `input` (dynamic batch) and, after it, the
    `extra` inputs (name, example tensor) with fixed shapes, such as CodeFormer's `weight`."""
    import torch

    buf = io.BytesIO()
    dynamic = {n: {0: "batch"} for n in ["input", *output_names]}
    # The TorchScript exporter (dynamo=False) keeps parameter names as initializer names, which the
    # torch runner's loaders read; constant folding off so that batch norm is not folded away.
    torch.onnx.export(module, (example, *(t for _, t in extra)), buf,
                      input_names=["input", *(n for n, _ in extra)], output_names=output_names,
                      dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=False,
                      dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _randomise(module: object, seed: int) -> None:
    """Random values for the parameters and statistics that PyTorch initialises to constants (norm
    scales and shifts, FRN/TLU, batch-norm running statistics), so that no layer is an identity."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.state_dict().items():  # type: ignore[attr-defined]
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("eps"):
                p.copy_(1e-6 * (1.0 + torch.rand(p.shape, generator=g)))
            elif p.dim() == 1:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = max(1, int(np.prod(p.shape[1:])))
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / fan_in) ** 0.5)
            if name.endswith("tau"):
                # TLU threshold just below zero, as trained FRN nets end up.
                p.copy_(-0.1 + 0.01 * torch.randn(p.shape, generator=g))


def xseg(seed: int = 0) -> onnx.ModelProto:
    """XSeg with random weights."""
    import torch

    from swapstream.engines.face_models import XSEG_SIZE, new_xseg

    torch.manual_seed(seed)
    m = new_xseg()
    _randomise(m, seed)
    return _export(m, torch.rand(1, XSEG_SIZE, XSEG_SIZE, 3), ["output"])


def xseg_green_occluder(gain: float = 10.0, bias: float = 8.0) -> onnx.ModelProto:
    """XSeg whose weights make a known mask: face probability = sigmoid(gain * c * ((R + B)/2 - G) + bias)
    for a positive c (1 / the filter response norm's RMS of that channel over the image), so saturated
    green pixels read as occluders and grey, skin or hair as face (sigmoid(8) = 0.9997).

    Channel 0 carries `(R + B)/2 - G` (the input is BGR) through conv01, conv02, the full-resolution
    skip into uconv02, uconv01 and out_conv, each a centre-tap 3x3; every other weight is zero, so the
    rest of the U-Net adds nothing. FRN divides by a positive per-image RMS (sign kept); TLU thresholds
    at -1e4 (an identity here)."""
    import torch

    from swapstream.engines.face_models import XSEG_SIZE, new_xseg

    m = new_xseg()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.state_dict().items():
            # "Zero" is 1e-7 noise and the constants carry a 1e-4 relative jitter: the exporter merges
            # initializers with equal values under one name, and the loaders read them by name.
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("frn.weight"):
                p.copy_(1.0 + 1e-4 * noise)
            elif name.endswith("frn.eps"):
                p.copy_(1e-6 * (1.0 + 1e-2 * torch.rand(p.shape, generator=g)))
            elif name.endswith("tlu.tau"):
                p.copy_(-1e4 * (1.0 + 1e-4 * noise))
            else:
                p.copy_(1e-7 * noise)
        m.conv01.conv.weight[0, :, 1, 1] = torch.tensor([0.5, -1.0, 0.5])  # B, G, R
        for blk in (m.conv02, m.uconv02, m.uconv01):
            # uconv02's input is cat([up0(x), x0]): x0's channel 0 sits after up0's channels.
            src = m.up0.conv.out_channels if blk is m.uconv02 else 0
            blk.conv.weight[0, src, 1, 1] = 1.0
        m.out_conv.weight[0, 0, 1, 1] = gain
        m.out_conv.bias[0] = bias
    return _export(m.eval(), torch.rand(1, XSEG_SIZE, XSEG_SIZE, 3), ["output"])


def bisenet(seed: int = 0, backbone: str = "resnet18") -> onnx.ModelProto:
    """BiSeNet with random weights (three outputs, as the released file)."""
    import torch

    from swapstream.engines.face_models import BISENET_SIZE, new_bisenet

    torch.manual_seed(seed)
    m = new_bisenet(backbone)
    _randomise(m, seed)
    model = _export(m, torch.rand(1, 3, BISENET_SIZE, BISENET_SIZE), ["output", "output16", "output32"])
    _fix_output_dims(model)
    return model


def bisenet_all_skin(seed: int = 0) -> onnx.ModelProto:
    """BiSeNet whose weights make a known parse: class 1 (skin) wherever the fused head's features
    are not all zero, i.e. practically everywhere. The backbone is random; the fused head's last
    convolution reads every (post-ReLU, so non-negative) feature into the skin logit only."""
    import torch

    from swapstream.engines.face_models import BISENET_SIZE, new_bisenet

    torch.manual_seed(seed)
    m = new_bisenet("resnet18")
    _randomise(m, seed)
    with torch.no_grad():
        w = m.conv_out.conv.weight
        # Other classes: 1e-7 noise, not zeros (see xseg_green_occluder on the exporter's merging).
        w.copy_(1e-7 * torch.randn(w.shape))
        w[1] = 1.0 + 1e-3 * torch.rand(w.shape[1:])
    model = _export(m, torch.rand(1, 3, BISENET_SIZE, BISENET_SIZE), ["output", "output16", "output32"])
    _fix_output_dims(model)
    return model


def _fix_output_dims(model: onnx.ModelProto) -> None:
    from swapstream.engines.face_models import BISENET_CLASSES, BISENET_SIZE

    # The traced upsampling takes its size from the input's shape, so the exporter leaves the output
    # sizes symbolic; the contract fixes them (the input is 512 x 512).
    for out in model.graph.output:
        for dim, value in zip(out.type.tensor_type.shape.dim[1:], (BISENET_CLASSES, BISENET_SIZE, BISENET_SIZE)):
            dim.Clear()
            dim.dim_value = value
    onnx.checker.check_model(model)


def gfpgan_1_4(seed: int = 0) -> onnx.ModelProto:
    """GFPGAN in v1.4's configuration (GFPGANv1Clean, 512, channel multiplier 2, 86.4 M parameters,
    about 346 MB) with random weights; (N, 3, 512, 512) in [-1, 1] in, the same out. Never commit one."""
    import torch

    from swapstream.engines.face_models import GFPGAN_SIZE, new_gfpgan

    torch.manual_seed(seed)
    m = new_gfpgan()
    _randomise(m, seed)
    return _export(m, torch.rand(1, 3, GFPGAN_SIZE, GFPGAN_SIZE) * 2 - 1, ["output"])


def _fix_image_output(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """The enhancers' contract fixes their output at (batch, 3, size, size) where the exporter's shape
    inference left sizes symbolic or wrong; `model`, checked again."""
    for dim, value in zip(model.graph.output[0].type.tensor_type.shape.dim[1:], (3, size, size)):
        dim.Clear()
        dim.dim_value = value
    onnx.checker.check_model(model)
    return model


def codeformer(seed: int = 0) -> onnx.ModelProto:
    """CodeFormer as inference_codeformer.py configures it (94.1 M parameters, about 377 MB) with
    random weights; `input` (N, 3, 512, 512) in [-1, 1] and `weight` ((1,) float64, the fidelity w)
    in, as FaceFusion's file, and (N, 3, 512, 512) out. Never commit one."""
    import torch

    from swapstream.engines.codeformer_model import CODEFORMER_SIZE, new_codeformer

    torch.manual_seed(seed)
    m = new_codeformer()
    _randomise(m, seed)
    model = _export(m, torch.rand(1, 3, CODEFORMER_SIZE, CODEFORMER_SIZE) * 2 - 1, ["output"],
                    extra=[("weight", torch.tensor([0.5], dtype=torch.float64))])
    # The exporter's shape inference loses the spatial sizes at the downsampling's zero padding (it
    # labelled the output (batch, 3, batch, ?)).
    return _fix_image_output(model, CODEFORMER_SIZE)


def gpen_bfr_512(seed: int = 0) -> onnx.ModelProto:
    """GPEN-BFR-512's architecture (yangxy/GPEN's FullGenerator, 71.0 M parameters, about 285 MB)
    with random weights drawn for its equalised learning rate (`new_gpen`); input `input`,
    (N, 3, 512, 512) RGB in [-1, 1], output `output`, the same. Never commit one."""
    import torch

    from swapstream.engines.gpen_model import GPEN_SIZE, new_gpen

    m = new_gpen(seed=seed)
    example = torch.rand(1, 3, GPEN_SIZE, GPEN_SIZE, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    model = _export(m, example, ["output"])
    # The exporter's shape inference leaves the output's height and width symbolic.
    return _fix_image_output(model, GPEN_SIZE)


def restoreformer_plus_plus(seed: int = 0) -> onnx.ModelProto:
    """RestoreFormer++ (wzhouxiff's VQVAEGANMultiHeadTransformer, head_size 4, ex_multi_scale_num 1;
    `engines/restoreformer_model.py`; 73.5 M parameters, about 294 MB) with random weights; input
    `input`, (N, 3, 512, 512) RGB in [-1, 1], output `output`, the same. Never commit one.

    The codebook gets `_randomise`'s N(0, 1/256) entries like any matrix (PyTorch's U(+-1/1024) would
    crowd them at the origin): a face then uses about a hundred of the 1024 codes, and each position's
    two nearest entries are nearly equidistant, which makes fp16's code flips frequent here
    (engines/restoreformer_model.py)."""
    import torch

    from swapstream.engines.restoreformer_model import RESTOREFORMER_SIZE, new_restoreformer

    torch.manual_seed(seed)
    m = new_restoreformer()
    _randomise(m, seed)
    model = _export(m, torch.rand(1, 3, RESTOREFORMER_SIZE, RESTOREFORMER_SIZE) * 2 - 1, ["output"])
    # The exporter's shape inference loses the output's sizes (it names one after the batch axis).
    return _fix_image_output(model, RESTOREFORMER_SIZE)


BUILDERS: Mapping[str, Callable[[], onnx.ModelProto]] = MappingProxyType({
    "xseg_1.onnx": xseg, "bisenet_resnet_18.onnx": bisenet, "gfpgan_1.4.onnx": gfpgan_1_4,
    "codeformer.onnx": codeformer, "gpen_bfr_512.onnx": gpen_bfr_512,
    "restoreformer_plus_plus.onnx": restoreformer_plus_plus})
"""Every model the script writes, by file name (zoo names, so a folder of them serves `run`). Built
one at a time: the enhancers are 285-377 MB each."""


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, build in BUILDERS.items():
        path = args.out_dir / name
        onnx.save(build(), path)
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
