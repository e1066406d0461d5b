"""Native PyTorch modules of the face stack's mask models: the XSeg occluder and the BiSeNet parser.

Their contracts are in docs/neural.md ("Occluders and parsers"); the architectures are transcribed
from the projects that trained the released weights:

- XSeg (`xseg_1`/`_2`/`_3`, DeepFaceLab's `core/leras/models/XSeg.py`, `XSeg(3, 32, 1)` at 256 px): a
  U-Net of conv + filter response norm (FRN) + thresholded linear unit (TLU) blocks, anti-aliased
  blur-pool downsampling, a 4x4 dense bottleneck, transposed-conv upsampling with skip connections,
  and a sigmoid. The released ONNX files take NHWC input, because DeepFaceLab is TensorFlow; so
  does this module.
- BiSeNet (`bisenet_resnet_18`/`_34`, yakhyo/face-parsing's `models/bisenet.py`): a ResNet context
  path with attention refinement at 1/16 and 1/32, a feature fusion module at 1/8, and three
  19-class heads upsampled to the input size; FaceFusion reads the first.

`tools/make_face_models.py` exports these modules with random weights as the test models, keeping
PyTorch's parameter names as the ONNX initializer names; the loaders here read those names. The
released files were exported by other tools (tf2onnx for XSeg; torch.onnx with constant folding,
which folds batch norm into the convolutions, for BiSeNet), so their initializer names are not
these: `is_xseg`/`is_bisenet` then say no and `engines/select.py` gives the file to ONNX Runtime.
Torch is imported lazily so that importing this module never requires it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

XSEG_SIZE = 256
XSEG_BASE_CH = 32
BISENET_SIZE = 512
BISENET_CLASSES = 19
GFPGAN_SIZE = 512
BISENET_LAYERS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}

# Names that only these architectures have, used to recognise a file (see the module docstring).
_XSEG_MARKERS = ("conv01.conv.weight", "conv01.frn.eps", "dense1.weight", "out_conv.weight")
_GFPGAN_MARKERS = ("conv_body_first.weight", "final_linear.weight",
                   "stylegan_decoder.style_conv1.modulated_conv.weight", "condition_scale.0.0.weight")
_BISENET_MARKERS = ("fpn.backbone.conv1.weight", "fpn.arm16.conv_block.conv.weight",
                    "ffm.conv_block.conv.weight", "conv_out.conv.weight")


def is_xseg(inits: dict[str, np.ndarray]) -> bool:
    return all(k in inits for k in _XSEG_MARKERS)


def is_bisenet(inits: dict[str, np.ndarray]) -> bool:
    return all(k in inits for k in _BISENET_MARKERS)


def load_initializers(module: Any, inits: dict[str, np.ndarray], unused: tuple[str, ...] = ()) -> Any:
    """`module` with its state loaded from the ONNX initializers of the same names (fp32, eval mode);
    a ValueError if the file lacks any of them (then it is not this architecture)."""
    import torch

    # Batch norm's step counter only matters in training, and `unused` prefixes name weights the
    # forward pass never reads: exporters drop both.
    sd = {k: v for k, v in module.state_dict().items()
          if not k.endswith("num_batches_tracked") and not k.startswith(unused)}
    missing = [k for k in sd if k not in inits]
    if missing:
        raise ValueError(f"the ONNX file lacks {len(missing)} weights of this architecture, e.g. "
                         f"'{missing[0]}'; it is not a model of this architecture")
    module.load_state_dict({k: torch.from_numpy(np.array(inits[k], dtype=np.float32)).reshape(sd[k].shape)
                            for k in sd}, strict=False)
    return module.eval()


def is_gfpgan(inits: dict[str, np.ndarray]) -> bool:
    return all(k in inits for k in _GFPGAN_MARKERS)


def build_gfpgan(inits: dict[str, np.ndarray]) -> Any:
    """A GFPGAN (v1.4 configuration) module with the given initializers loaded."""
    # toRGB's intermediate images are a training loss; the style MLP is skipped (input_is_latent).
    return load_initializers(_classes()["GFPGAN"](), inits, unused=("toRGB.", "stylegan_decoder.style_mlp."))


def new_gfpgan() -> Any:
    """A GFPGAN v1.4-configured module with random weights (for test models)."""
    return _classes()["GFPGAN"]().eval()


def build_xseg(inits: dict[str, np.ndarray]) -> Any:
    """An XSeg module with the given initializers loaded (fp32, on the CPU)."""
    base = int(inits["conv01.conv.weight"].shape[0])
    return load_initializers(_classes()["XSeg"](base), inits)


def build_bisenet(inits: dict[str, np.ndarray]) -> Any:
    """A BiSeNet module with the given initializers loaded; the backbone depth is read from the names."""
    backbone = "resnet34" if "fpn.backbone.layer3.5.conv1.weight" in inits else "resnet18"
    classes = int(inits["conv_out.conv.weight"].shape[0])
    return load_initializers(_classes()["BiSeNet"](classes, backbone), inits)


def new_xseg(base_ch: int = XSEG_BASE_CH) -> Any:
    """An XSeg module with PyTorch's default random initialisation (for test models)."""
    return _classes()["XSeg"](base_ch).eval()


def new_bisenet(backbone: str = "resnet18", classes: int = BISENET_CLASSES) -> Any:
    """A BiSeNet module with random weights (for test models)."""
    return _classes()["BiSeNet"](classes, backbone).eval()


def _classes() -> dict[str, type]:
    """The module classes, defined lazily so that importing this file never requires torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    # ---- XSeg --------------------------------------------------------------------------------

    class FRN(nn.Module):
        """Filter response normalisation: x / sqrt(mean_hw(x^2) + |eps|) * w + b."""

        def __init__(self, ch: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ch))
            self.bias = nn.Parameter(torch.zeros(ch))
            self.eps = nn.Parameter(torch.full((1,), 1e-6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            nu2 = x.square().mean(dim=(2, 3), keepdim=True)
            x = x * torch.rsqrt(nu2 + self.eps.abs())
            return x * self.weight[None, :, None, None] + self.bias[None, :, None, None]

    class TLU(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.tau = nn.Parameter(torch.zeros(ch))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.maximum(x, self.tau[None, :, None, None])

    class ConvBlock(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)
            self.frn = FRN(cout)
            self.tlu = TLU(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.tlu(self.frn(self.conv(x)))

    class UpConvBlock(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = nn.ConvTranspose2d(cin, cout, 3, stride=2)
            self.frn = FRN(cout)
            self.tlu = TLU(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, w = x.shape[2], x.shape[3]
            # TensorFlow's SAME transposed convolution (k 3, stride 2) is the unpadded one with its
            # last row and column cut, not torch's padding=1/output_padding=1 (a one-pixel shift).
            y = self.conv(x)[:, :, :2 * h, :2 * w]
            return self.tlu(self.frn(y))

    class BlurPool(nn.Module):
        """Anti-aliased stride-2 downsampling: a binomial depthwise filter on a [lo, hi] padding."""

        def __init__(self, ch: int, filt: int) -> None:
            super().__init__()
            a = {2: [1.0, 1.0], 3: [1.0, 2.0, 1.0], 4: [1.0, 3.0, 3.0, 1.0]}[filt]
            k = np.outer(a, a)
            k = (k / k.sum()).astype(np.float32)
            # Not a weight: fixed by the filter size, so it is kept out of the state dict.
            self.register_buffer("k", torch.from_numpy(k)[None, None].repeat(ch, 1, 1, 1),
                                 persistent=False)
            self.pad = ((filt - 1) // 2, int(np.ceil((filt - 1) / 2)))
            self.ch = ch

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lo, hi = self.pad
            return F.conv2d(F.pad(x, (lo, hi, lo, hi)), self.k.to(x.dtype), stride=2, groups=self.ch)

    class XSeg(nn.Module):
        """DeepFaceLab's XSeg: NHWC (N, 256, 256, 3) BGR in [0, 1] -> NHWC (N, 256, 256, 1) face
        probability (1: face, 0: occluder or background)."""

        def __init__(self, base: int = XSEG_BASE_CH) -> None:
            super().__init__()
            b = base
            self.base = b
            self.conv01, self.conv02 = ConvBlock(3, b), ConvBlock(b, b)
            self.bp0 = BlurPool(b, 4)
            self.conv11, self.conv12 = ConvBlock(b, 2 * b), ConvBlock(2 * b, 2 * b)
            self.bp1 = BlurPool(2 * b, 3)
            self.conv21, self.conv22 = ConvBlock(2 * b, 4 * b), ConvBlock(4 * b, 4 * b)
            self.bp2 = BlurPool(4 * b, 2)
            self.conv31, self.conv32, self.conv33 = (ConvBlock(4 * b, 8 * b), ConvBlock(8 * b, 8 * b),
                                                     ConvBlock(8 * b, 8 * b))
            self.bp3 = BlurPool(8 * b, 2)
            self.conv41, self.conv42, self.conv43 = (ConvBlock(8 * b, 8 * b) for _ in range(3))
            self.bp4 = BlurPool(8 * b, 2)
            self.conv51, self.conv52, self.conv53 = (ConvBlock(8 * b, 8 * b) for _ in range(3))
            self.bp5 = BlurPool(8 * b, 2)
            self.dense1 = nn.Linear(4 * 4 * 8 * b, 512)
            self.dense2 = nn.Linear(512, 4 * 4 * 8 * b)
            self.up5 = UpConvBlock(8 * b, 4 * b)
            self.uconv53, self.uconv52, self.uconv51 = (ConvBlock(12 * b, 8 * b), ConvBlock(8 * b, 8 * b),
                                                        ConvBlock(8 * b, 8 * b))
            self.up4 = UpConvBlock(8 * b, 4 * b)
            self.uconv43, self.uconv42, self.uconv41 = (ConvBlock(12 * b, 8 * b), ConvBlock(8 * b, 8 * b),
                                                        ConvBlock(8 * b, 8 * b))
            self.up3 = UpConvBlock(8 * b, 4 * b)
            self.uconv33, self.uconv32, self.uconv31 = (ConvBlock(12 * b, 8 * b), ConvBlock(8 * b, 8 * b),
                                                        ConvBlock(8 * b, 8 * b))
            self.up2 = UpConvBlock(8 * b, 4 * b)
            self.uconv22, self.uconv21 = ConvBlock(8 * b, 4 * b), ConvBlock(4 * b, 4 * b)
            self.up1 = UpConvBlock(4 * b, 2 * b)
            self.uconv12, self.uconv11 = ConvBlock(4 * b, 2 * b), ConvBlock(2 * b, 2 * b)
            self.up0 = UpConvBlock(2 * b, b)
            self.uconv02, self.uconv01 = ConvBlock(2 * b, b), ConvBlock(b, b)
            self.out_conv = nn.Conv2d(b, 1, 3, padding=1)

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            dt = self.out_conv.weight.dtype
            x = inp.to(dt).permute(0, 3, 1, 2)
            x = x0 = self.conv02(self.conv01(x))
            x = self.bp0(x)
            x = x1 = self.conv12(self.conv11(x))
            x = self.bp1(x)
            x = x2 = self.conv22(self.conv21(x))
            x = self.bp2(x)
            x = x3 = self.conv33(self.conv32(self.conv31(x)))
            x = self.bp3(x)
            x = x4 = self.conv43(self.conv42(self.conv41(x)))
            x = self.bp4(x)
            x = x5 = self.conv53(self.conv52(self.conv51(x)))
            x = self.bp5(x)
            n = x.shape[0]
            # DeepFaceLab flattens and reshapes in NHWC order; the dense weights are laid out so.
            x = self.dense2(self.dense1(x.permute(0, 2, 3, 1).reshape(n, -1)))
            x = x.reshape(n, 4, 4, 8 * self.base).permute(0, 3, 1, 2)
            x = self.uconv51(self.uconv52(self.uconv53(torch.cat([self.up5(x), x5], 1))))
            x = self.uconv41(self.uconv42(self.uconv43(torch.cat([self.up4(x), x4], 1))))
            x = self.uconv31(self.uconv32(self.uconv33(torch.cat([self.up3(x), x3], 1))))
            x = self.uconv21(self.uconv22(torch.cat([self.up2(x), x2], 1)))
            x = self.uconv11(self.uconv12(torch.cat([self.up1(x), x1], 1)))
            x = self.uconv01(self.uconv02(torch.cat([self.up0(x), x0], 1)))
            return torch.sigmoid(self.out_conv(x)).permute(0, 2, 3, 1).float()

    # ---- BiSeNet -----------------------------------------------------------------------------

    class ConvBNReLU(nn.Module):
        def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
            self.norm = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.norm(self.conv(x)))

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet(nn.Module):
        def __init__(self, layers: tuple[int, int, int, int]) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            cin = 64
            for i, (ch, n) in enumerate(zip((64, 128, 256, 512), layers)):
                blocks = [BasicBlock(cin, ch, 1 if i == 0 else 2)] + [BasicBlock(ch, ch) for _ in range(n - 1)]
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
                cin = ch

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            feat8 = self.layer2(self.layer1(x))
            feat16 = self.layer3(feat8)
            return feat8, feat16, self.layer4(feat16)

    def global_pool(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)

    class ARM(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv_block = ConvBNReLU(cin, cout)
            self.attention = nn.Sequential(nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            feat = self.conv_block(x)
            return feat * torch.sigmoid(self.attention(global_pool(feat)))

    class ContextPath(nn.Module):
        def __init__(self, backbone: str) -> None:
            super().__init__()
            self.backbone = ResNet(BISENET_LAYERS[backbone])
            self.arm16, self.arm32 = ARM(256, 128), ARM(512, 128)
            self.conv_head32, self.conv_head16 = ConvBNReLU(128, 128), ConvBNReLU(128, 128)
            self.conv_avg = ConvBNReLU(512, 128, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            feat8, feat16, feat32 = self.backbone(x)
            avg = self.conv_avg(global_pool(feat32))  # broadcast = nearest upsampling of a 1x1 map
            up32 = F.interpolate(self.arm32(feat32) + avg, size=feat16.shape[2:], mode="nearest")
            up32 = self.conv_head32(up32)
            up16 = F.interpolate(self.arm16(feat16) + up32, size=feat8.shape[2:], mode="nearest")
            return feat8, self.conv_head16(up16), up32

    class FFM(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv_block = ConvBNReLU(cin, cout, 1)
            self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
            self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

        def forward(self, fsp: torch.Tensor, fcp: torch.Tensor) -> torch.Tensor:
            feat = self.conv_block(torch.cat([fsp, fcp], 1))
            att = torch.sigmoid(self.conv2(F.relu(self.conv1(global_pool(feat)))))
            return feat * att + feat

    class Head(nn.Module):
        def __init__(self, cin: int, mid: int, classes: int) -> None:
            super().__init__()
            self.conv_block = ConvBNReLU(cin, mid)
            self.conv = nn.Conv2d(mid, classes, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(self.conv_block(x))

    class BiSeNet(nn.Module):
        """yakhyo/face-parsing's BiSeNet: NCHW (N, 3, 512, 512) RGB, ImageNet-normalised -> three
        (N, 19, 512, 512) class logits (fused head, then the 1/8 and 1/16 context heads)."""

        def __init__(self, classes: int = BISENET_CLASSES, backbone: str = "resnet18") -> None:
            super().__init__()
            self.fpn = ContextPath(backbone)
            self.ffm = FFM(256, 256)
            self.conv_out = Head(256, 256, classes)
            self.conv_out16 = Head(128, 64, classes)
            self.conv_out32 = Head(128, 64, classes)
            self.first_only = False
            """Return the fused head only (what the runner reads), not the tuple of three."""

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            dt = self.conv_out.conv.weight.dtype
            x = x.to(dt)
            h, w = x.shape[2], x.shape[3]
            feat8, cp8, cp16 = self.fpn(x)
            outs = (self.conv_out(self.ffm(feat8, cp8)), self.conv_out16(cp8), self.conv_out32(cp16))
            if self.first_only:
                return F.interpolate(outs[0], size=(h, w), mode="bilinear",  # type: ignore[return-value]
                                     align_corners=True).float()
            return tuple(F.interpolate(o, size=(h, w), mode="bilinear", align_corners=True).float()
                         for o in outs)  # type: ignore[return-value]

    # ---- GFPGAN v1.4 (GFPGANv1Clean) ----------------------------------------------------------

    class ModulatedConv2d(nn.Module):
        """StyleGAN2's modulated convolution. Computed in the non-fused form (scale the input
        channels by the style, convolve with the shared weight, scale the outputs by the
        demodulation), which equals the grouped per-sample-weight form of GFPGAN's code and batches
        without a per-sample weight tensor; the parameters are the same."""

        def __init__(self, cin: int, cout: int, k: int, style_dim: int, demodulate: bool = True,
                     upsample: bool = False) -> None:
            super().__init__()
            self.modulation = nn.Linear(style_dim, cin)
            self.weight = nn.Parameter(torch.randn(1, cout, cin, k, k) / math.sqrt(cin * k * k))
            self.demodulate, self.upsample, self.padding = demodulate, upsample, k // 2

        def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
            s = self.modulation(style)                                           # (N, Cin)
            w = self.weight[0]                                                   # (Cout, Cin, k, k)
            if self.upsample:
                x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
            out = F.conv2d(x * s[:, :, None, None], w, padding=self.padding)
            if self.demodulate:
                # sum over (Cin, k, k) of (w * s)^2 = (w^2 summed over k, k) @ s^2
                demod = torch.rsqrt(s.square() @ w.square().sum(dim=(2, 3)).t() + 1e-8)  # (N, Cout)
                out = out * demod[:, :, None, None]
            return out

    class StyleConv(nn.Module):
        def __init__(self, cin: int, cout: int, style_dim: int, upsample: bool = False) -> None:
            super().__init__()
            self.modulated_conv = ModulatedConv2d(cin, cout, 3, style_dim, upsample=upsample)
            self.weight = nn.Parameter(torch.zeros(1))  # noise strength
            self.bias = nn.Parameter(torch.zeros(1, cout, 1, 1))

        def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            out = self.modulated_conv(x, style) * 2 ** 0.5
            return F.leaky_relu(out + self.weight * noise + self.bias, 0.2)

    class ToRGB(nn.Module):
        def __init__(self, cin: int, style_dim: int, upsample: bool = True) -> None:
            super().__init__()
            self.upsample = upsample
            self.modulated_conv = ModulatedConv2d(cin, 3, 1, style_dim, demodulate=False)
            self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

        def forward(self, x: torch.Tensor, style: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
            out = self.modulated_conv(x, style) + self.bias
            if skip is not None:
                if self.upsample:
                    skip = F.interpolate(skip, scale_factor=2.0, mode="bilinear", align_corners=False)
                out = out + skip
            return out

    class ConstantInput(nn.Module):
        def __init__(self, ch: int, size: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(1, ch, size, size))

    class StyleGAN2GeneratorCSFT(nn.Module):
        def __init__(self, out_size: int, style_dim: int, num_mlp: int, channel_multiplier: int,
                     narrow: float, sft_half: bool) -> None:
            super().__init__()
            # The style MLP is in the weights but unused: GFPGAN v1.4 feeds latents (input_is_latent).
            self.style_mlp = nn.Sequential(*[m for _ in range(num_mlp)
                                             for m in (nn.Linear(style_dim, style_dim), nn.LeakyReLU(0.2))])
            ch = _gfpgan_channels(channel_multiplier, narrow)
            self.constant_input = ConstantInput(ch[4], 4)
            self.style_conv1 = StyleConv(ch[4], ch[4], style_dim)
            self.to_rgb1 = ToRGB(ch[4], style_dim, upsample=False)
            self.log_size = int(math.log2(out_size))
            self.num_layers = (self.log_size - 2) * 2 + 1
            self.style_convs = nn.ModuleList()
            self.to_rgbs = nn.ModuleList()
            self.noises = nn.Module()
            # GFPGAN's forward draws fresh noise unless told to use these stored maps; a file has to
            # fix one or the other, and the stored maps make the output deterministic.
            for i in range(self.num_layers):
                r = 2 ** ((i + 5) // 2)
                self.noises.register_buffer(f"noise{i}", torch.randn(1, 1, r, r))
            cin = ch[4]
            for i in range(3, self.log_size + 1):
                cout = ch[2 ** i]
                self.style_convs.append(StyleConv(cin, cout, style_dim, upsample=True))
                self.style_convs.append(StyleConv(cout, cout, style_dim))
                self.to_rgbs.append(ToRGB(cout, style_dim))
                cin = cout
            self.sft_half = sft_half

        def forward(self, latent: torch.Tensor, conditions: list[torch.Tensor]) -> torch.Tensor:
            noise = [getattr(self.noises, f"noise{i}") for i in range(self.num_layers)]
            out = self.constant_input.weight.expand(latent.shape[0], -1, -1, -1)
            out = self.style_conv1(out, latent[:, 0], noise[0])
            skip = self.to_rgb1(out, latent[:, 1])
            i = 1
            for conv1, conv2, n1, n2, to_rgb in zip(self.style_convs[::2], self.style_convs[1::2],
                                                    noise[1::2], noise[2::2], self.to_rgbs):
                out = conv1(out, latent[:, i], n1)
                if i < len(conditions):
                    if self.sft_half:
                        same, sft = torch.split(out, out.shape[1] // 2, dim=1)
                        out = torch.cat([same, sft * conditions[i - 1] + conditions[i]], dim=1)
                    else:
                        out = out * conditions[i - 1] + conditions[i]
                out = conv2(out, latent[:, i + 1], n2)
                skip = to_rgb(out, latent[:, i + 2], skip)
                i += 2
            return skip

    class ResBlock(nn.Module):
        def __init__(self, cin: int, cout: int, scale: float) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cin, 3, 1, 1)
            self.conv2 = nn.Conv2d(cin, cout, 3, 1, 1)
            self.skip = nn.Conv2d(cin, cout, 1, bias=False)
            self.scale = scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = F.leaky_relu(self.conv1(x), 0.2)
            out = F.interpolate(out, scale_factor=self.scale, mode="bilinear", align_corners=False)
            out = F.leaky_relu(self.conv2(out), 0.2)
            x = F.interpolate(x, scale_factor=self.scale, mode="bilinear", align_corners=False)
            return out + self.skip(x)

    class GFPGAN(nn.Module):
        """TencentARC's GFPGANv1Clean as v1.4 configures it (out_size 512, channel_multiplier 2,
        different_w, input_is_latent, sft_half): (N, 3, 512, 512) RGB in [-1, 1] -> the same."""

        def __init__(self, out_size: int = 512, style_dim: int = 512, channel_multiplier: int = 2,
                     narrow: float = 1.0, num_mlp: int = 8, sft_half: bool = True) -> None:
            super().__init__()
            ch = _gfpgan_channels(channel_multiplier, narrow * 0.5)  # the U-Net is half as wide
            self.log_size = int(math.log2(out_size))
            self.style_dim = style_dim
            self.conv_body_first = nn.Conv2d(3, ch[out_size], 1)
            cin = ch[out_size]
            self.conv_body_down = nn.ModuleList()
            for i in range(self.log_size, 2, -1):
                self.conv_body_down.append(ResBlock(cin, ch[2 ** (i - 1)], 0.5))
                cin = ch[2 ** (i - 1)]
            self.final_conv = nn.Conv2d(cin, ch[4], 3, 1, 1)
            cin = ch[4]
            self.conv_body_up = nn.ModuleList()
            for i in range(3, self.log_size + 1):
                self.conv_body_up.append(ResBlock(cin, ch[2 ** i], 2.0))
                cin = ch[2 ** i]
            self.toRGB = nn.ModuleList([nn.Conv2d(ch[2 ** i], 3, 1) for i in range(3, self.log_size + 1)])
            self.final_linear = nn.Linear(ch[4] * 16, (self.log_size * 2 - 2) * style_dim)
            self.stylegan_decoder = StyleGAN2GeneratorCSFT(out_size, style_dim, num_mlp, channel_multiplier,
                                                           narrow, sft_half)
            self.condition_scale = nn.ModuleList()
            self.condition_shift = nn.ModuleList()
            for i in range(3, self.log_size + 1):
                c = ch[2 ** i]
                sft = c if sft_half else 2 * c
                for lst in (self.condition_scale, self.condition_shift):
                    lst.append(nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(0.2),
                                             nn.Conv2d(c, sft, 3, 1, 1)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dt = self.conv_body_first.weight.dtype
            feat = F.leaky_relu(self.conv_body_first(x.to(dt)), 0.2)
            skips = []
            for down in self.conv_body_down:
                feat = down(feat)
                skips.insert(0, feat)
            feat = F.leaky_relu(self.final_conv(feat), 0.2)
            latent = self.final_linear(feat.flatten(1)).view(feat.shape[0], -1, self.style_dim)
            conditions: list[torch.Tensor] = []
            for i, up in enumerate(self.conv_body_up):
                feat = up(feat + skips[i])
                conditions += [self.condition_scale[i](feat), self.condition_shift[i](feat)]
            # toRGB's intermediate images are a training loss only; the released model returns the image.
            return self.stylegan_decoder(latent, conditions).float()

    return {"XSeg": XSeg, "BiSeNet": BiSeNet, "GFPGAN": GFPGAN}


def _gfpgan_channels(channel_multiplier: int, narrow: float) -> dict[int, int]:
    """StyleGAN2's channels per resolution (GFPGAN's `channels` table)."""
    cm = channel_multiplier
    return {4: int(512 * narrow), 8: int(512 * narrow), 16: int(512 * narrow), 32: int(512 * narrow),
            64: int(256 * cm * narrow), 128: int(128 * cm * narrow), 256: int(64 * cm * narrow),
            512: int(32 * cm * narrow), 1024: int(16 * cm * narrow)}
