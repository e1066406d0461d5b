"""Native PyTorch module of the GPEN-BFR-512 face enhancer (`gpen_bfr_512`).

Transcribed from yangxy/GPEN's `face_model/gpen_model.py`: `FullGenerator(512, 512, 8, 2, narrow=1)`,
as `face_model/face_gan.py` builds it for GPEN-BFR-512 (style_dim 512, n_mlp 8, channel_multiplier 2,
isconcat, lr_mlp 0.01, blur kernel [1, 3, 3, 1]; 71.0 M parameters). Its contract is FaceFusion's
face_enhancer one (docs/neural.md, "Enhancers"): input `input`, (N, 3, 512, 512) RGB in [-1, 1], on
the ffhq_512 template; output 0, the same.

The network is a StyleGAN2 generator driven by an encoder:

- The encoder is a 1x1 convolution at 512 px and seven blur + 3x3 stride-2 convolutions down to
  4x4 (`ecd0` ... `ecd7`); a linear layer maps the 4x4 map to a 512-d code.
- The generator runs the code through its own style MLP (pixel norm and eight equalised linear
  layers: GPEN calls it without `input_is_latent`), and every one of its 16 layers gets that same
  style (one code, no mixing, truncation 1).
- GPEN's "noise" inputs are the encoder's feature maps: the 4x4 map for the first layer, then each
  resolution's map for both of that resolution's convolutions. With `isconcat` the scaled map is
  concatenated to the convolution's output (not added), which doubles every layer's width after it.

StyleGAN2's custom CUDA ops are written with plain torch ops that equal the repository's own CPU
fallbacks (`face_model/op/`): `fused_leaky_relu` is sqrt(2) * leaky_relu(x + bias, 0.2), and
`upfirdn2d` (zero-insert upsampling, padding, FIR filter with the flipped kernel, subsampling) is a
padded depthwise convolution, or a depthwise transposed convolution when it upsamples (`upfirdn2d`
below). The modulated convolutions are computed in the non-fused form (see ModulatedConv2d).

Parameter names are GPEN's state-dict names, which a TorchScript ONNX export without constant
folding keeps as initializer names; the loader reads them. The blur kernels are not read: they are
fixed by the architecture, and an exporter may merge the 21 identical ones into one initializer.
A file exported with constant folding (the scale factors folded into the weights) has other names:
`is_gpen` then says no and `engines/select.py` gives it to ONNX Runtime. Torch is imported lazily.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .face_models import load_initializers

GPEN_SIZE = 512
GPEN_STYLE_DIM = 512
GPEN_N_MLP = 8
GPEN_LR_MLP = 0.01
"""The style MLP's learning-rate multiplier: its weights are stored divided by it (equalised lr)."""
BLUR_KERNEL = (1.0, 3.0, 3.0, 1.0)

# Names that only this architecture has (GFPGAN's linear layer is `final_linear.weight`, unindexed).
_GPEN_MARKERS = ("ecd0.0.0.weight", "final_linear.0.weight", "generator.style.1.weight",
                 "generator.input.input", "generator.conv1.noise.weight", "generator.to_rgb1.conv.weight")


def gpen_channels(channel_multiplier: int = 2, narrow: float = 1.0) -> dict[int, int]:
    """GPEN's channels per resolution (its `channels` table)."""
    cm, n = channel_multiplier, narrow
    return {4: int(512 * n), 8: int(512 * n), 16: int(512 * n), 32: int(512 * n), 64: int(256 * cm * n),
            128: int(128 * cm * n), 256: int(64 * cm * n), 512: int(32 * cm * n), 1024: int(16 * cm * n),
            2048: int(8 * cm * n)}


def is_gpen(inits: dict[str, np.ndarray]) -> bool:
    return all(k in inits for k in _GPEN_MARKERS)


def build_gpen(inits: dict[str, np.ndarray]) -> Any:
    """A GPEN FullGenerator with the given initializers loaded (fp32, on the CPU).

    The configuration is read from the weights: the size from the number of encoder stages, the
    channels from their widths, the style width and MLP depth from the style layers. GPEN-BFR-512
    gives (512, channel_multiplier 2, narrow 1, 512, 8); GPEN's other sizes and widths read the
    same way (the tests build 64 and 512)."""
    def encoder_weight(i: int) -> str:  # ecd0 has no blur in front of its convolution
        return f"ecd{i}.0.{0 if i == 0 else 1}.weight"

    stages = 0
    while encoder_weight(stages) in inits:
        stages += 1
    if stages < 2:
        raise ValueError("the ONNX file has no GPEN encoder weights ('ecd0.0.0.weight', ...); it is "
                         "not a model of this architecture")
    size = 2 ** (stages + 1)
    channels = {size >> i: int(inits[encoder_weight(i)].shape[0]) for i in range(stages)}
    n_mlp = 0
    while f"generator.style.{n_mlp + 1}.weight" in inits:
        n_mlp += 1
    style_dim = int(inits["final_linear.0.weight"].shape[0])
    return load_initializers(_classes()["FullGenerator"](size, channels, style_dim, n_mlp), inits)


def new_gpen(size: int = GPEN_SIZE, channel_multiplier: int = 2, narrow: float = 1.0,
             seed: int | None = None) -> Any:
    """A GPEN FullGenerator with random weights (for test models); the defaults are GPEN-BFR-512.

    With no seed it is initialised as GPEN initialises it: equalised-lr weights from N(0, 1) (the
    style MLP's divided by its lr multiplier), modulation biases 1, every other bias and the noise
    strengths 0. A seed draws all of them: the weights as GPEN does (not `tools/make_face_models.py`'s
    1/sqrt(fan_in), which the run-time scale would apply a second time, shrinking every layer), the
    biases around their starting values and the noise strengths in [0.5, 1.5], so that the encoder's
    maps reach the generator and no two tensors are equal (an exporter merges equal initializers
    under one name, and the loader reads them by name)."""
    import torch

    ch = {r: c for r, c in gpen_channels(channel_multiplier, narrow).items() if r <= size}
    m = _classes()["FullGenerator"](size, ch).eval()
    if seed is None:
        return m
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.state_dict().items():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("noise.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("modulation.bias"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.startswith("generator.style."):
                p.copy_(noise / GPEN_LR_MLP)
            else:
                p.copy_(noise)
    return m


def upfirdn2d(x: Any, kernel: Any, up: int = 1, pad: tuple[int, int] = (0, 0)) -> Any:
    """StyleGAN2's upfirdn2d (down = 1, the same padding on both axes) with plain torch ops, per
    channel: insert `up - 1` zeros after every sample, pad by `pad` (before, after), and correlate
    with the flipped `kernel`, a (C, 1, kh, kw) tensor of the per-channel 2-D filter (unflipped).

    Without upsampling that is a padded depthwise convolution. With it, the zero insertion and
    padding are a depthwise transposed convolution with the unflipped kernel, stride `up`, padding
    kh - 1 - pad[0] and output padding up - 1 + pad[1] - pad[0], which computes no inserted zero."""
    import torch

    weight = torch.flip(kernel, (2, 3)) if up == 1 else kernel
    return _upfirdn2d(x, weight, up, pad, _upfirdn2d_padding(int(kernel.shape[-1]), up, pad))


def _upfirdn2d_padding(taps: int, up: int, pad: tuple[int, int]) -> tuple[int, int]:
    """upfirdn2d's (padding, output padding) as a transposed convolution (see upfirdn2d); ints
    worked out once, outside a traced forward."""
    if up == 1:
        return 0, 0
    tpad, opad = taps - 1 - pad[0], up - 1 + pad[1] - pad[0]
    if tpad < 0 or not 0 <= opad < up:
        raise ValueError(f"upfirdn2d: padding {pad} with a {taps}-tap kernel and up={up} is not one "
                         f"transposed convolution")
    return tpad, opad


def _upfirdn2d(x: Any, weight: Any, up: int, pad: tuple[int, int], transposed: tuple[int, int]) -> Any:
    """upfirdn2d with `weight` as its convolution reads it: the kernel flipped for up 1 (conv2d
    correlates), as it is for a transposed convolution, whose (padding, output padding) is
    `transposed`."""
    import torch.nn.functional as F

    if up == 1:
        p0, p1 = pad
        return F.conv2d(F.pad(x, (p0, p1, p0, p1)), weight, groups=x.shape[1])
    return F.conv_transpose2d(x, weight, stride=up, padding=transposed[0], output_padding=transposed[1],
                              groups=x.shape[1])


def _classes() -> dict[str, type]:
    """The module classes, defined lazily so that importing this file never requires torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def make_kernel(channels: int, gain: float, flip: bool) -> torch.Tensor:
        k = np.outer(BLUR_KERNEL, BLUR_KERNEL)
        k = (k / k.sum() * gain).astype(np.float32)
        if flip:
            k = np.ascontiguousarray(k[::-1, ::-1])
        return torch.from_numpy(k)[None, None].repeat(channels, 1, 1, 1)

    class Blur(nn.Module):
        """upfirdn2d with the blur kernel: a depthwise filter, or (up 2) upsampling with it."""

        def __init__(self, channels: int, pad: tuple[int, int], up: int = 1, gain: float = 1.0) -> None:
            super().__init__()
            # Not a weight (see the module docstring): kept out of the state dict.
            # Flipped here, not in every forward, where the filter correlates (see _upfirdn2d).
            self.register_buffer("kernel", make_kernel(channels, gain, flip=up == 1), persistent=False)
            self.pad, self.up = pad, up
            self.transposed = _upfirdn2d_padding(len(BLUR_KERNEL), up, pad)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _upfirdn2d(x, self.kernel.to(x.dtype), self.up, self.pad, self.transposed)

    class FusedLeakyReLU(nn.Module):
        """GPEN's fused_leaky_relu (its CPU fallback): sqrt(2) * leaky_relu(x + bias, 0.2)."""

        def __init__(self, channels: int) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(channels))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b = self.bias.view(1, -1, *([1] * (x.dim() - 2)))
            return F.leaky_relu(x + b, 0.2) * math.sqrt(2.0)

    class EqualLinear(nn.Module):
        """Linear layer with equalised learning rate: the stored weight is scaled at run time."""

        def __init__(self, cin: int, cout: int, bias_init: float = 0.0, lr_mul: float = 1.0,
                     activation: bool = False) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(cout, cin) / lr_mul)
            self.bias = nn.Parameter(torch.full((cout,), float(bias_init)))
            self.scale, self.lr_mul, self.activation = lr_mul / math.sqrt(cin), lr_mul, activation

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.activation:
                out = F.linear(x, self.weight * self.scale)
                return F.leaky_relu(out + self.bias * self.lr_mul, 0.2) * math.sqrt(2.0)
            return F.linear(x, self.weight * self.scale, self.bias * self.lr_mul)

    class EqualConv2d(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0) -> None:
            super().__init__()
            # Only bias-free uses here: GPEN's ConvLayer puts the bias in its activation.
            self.weight = nn.Parameter(torch.randn(cout, cin, k, k))
            self.scale, self.stride, self.padding = 1 / math.sqrt(cin * k * k), stride, padding

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, self.weight * self.scale, stride=self.stride, padding=self.padding)

    def conv_layer(cin: int, cout: int, k: int, downsample: bool = False) -> nn.Sequential:
        """GPEN's ConvLayer (bias and activation on): [Blur,] EqualConv2d, FusedLeakyReLU, with its
        indices, which are in the weights' names."""
        if downsample:
            p = len(BLUR_KERNEL) - 2 + k - 1
            return nn.Sequential(Blur(cin, ((p + 1) // 2, p // 2)), EqualConv2d(cin, cout, k, stride=2),
                                 FusedLeakyReLU(cout))
        return nn.Sequential(EqualConv2d(cin, cout, k, padding=k // 2), FusedLeakyReLU(cout))

    class PixelNorm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.square().mean(dim=1, keepdim=True) + 1e-8)

    class ModulatedConv2d(nn.Module):
        """StyleGAN2's modulated convolution in the non-fused form: scale the input channels by the
        style, convolve with the shared weight, scale the outputs by the demodulation. GPEN folds
        all three into one weight per sample and runs a grouped convolution; the two are equal (the
        style and the demodulation are per-channel factors on the convolution's two sides), and
        this one batches without a per-sample weight tensor. The equalised-lr scale goes into the
        style vector rather than the weight (cheaper, and it keeps the demodulation's sum of squares
        near 1, well inside fp16's range). Upsampling is GPEN's: a stride-2 transposed convolution
        of the weight, then the blur (gain 4) on padding (1, 1)."""

        def __init__(self, cin: int, cout: int, k: int, style_dim: int, demodulate: bool = True,
                     upsample: bool = False) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(1, cout, cin, k, k))
            self.modulation = EqualLinear(style_dim, cin, bias_init=1.0)
            self.scale = 1 / math.sqrt(cin * k * k)
            self.demodulate, self.upsample, self.padding = demodulate, upsample, k // 2
            if upsample:
                p = (len(BLUR_KERNEL) - 2) - (k - 1)
                self.blur = Blur(cout, ((p + 1) // 2 + 1, p // 2 + 1), gain=4.0)

        def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
            s = self.modulation(style) * self.scale                             # (N, Cin)
            w = self.weight[0]                                                  # (Cout, Cin, k, k)
            x = x * s[:, :, None, None]
            if self.upsample:
                # conv_transpose2d's weight is (Cin, Cout, k, k): GPEN's transpose, unflipped.
                out = F.conv_transpose2d(x, w.transpose(0, 1), stride=2)
            else:
                out = F.conv2d(x, w, padding=self.padding)
            if self.demodulate:
                # sum over (Cin, k, k) of (scale * w * s)^2 = s^2 @ (w^2 summed over k, k)^T
                demod = torch.rsqrt(s.square() @ w.square().sum(dim=(2, 3)).t() + 1e-8)  # (N, Cout)
                out = out * demod[:, :, None, None]
            return self.blur(out) if self.upsample else out

    class NoiseInjection(nn.Module):
        """With isconcat: the strength-scaled noise (here an encoder feature map) concatenated."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1))

        def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, self.weight * noise], dim=1)

    class StyledConv(nn.Module):
        def __init__(self, cin: int, cout: int, style_dim: int, upsample: bool = False) -> None:
            super().__init__()
            self.conv = ModulatedConv2d(cin, cout, 3, style_dim, upsample=upsample)
            self.noise = NoiseInjection()
            self.activate = FusedLeakyReLU(2 * cout)

        def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            return self.activate(self.noise(self.conv(x, style), noise))

    class ToRGB(nn.Module):
        def __init__(self, cin: int, style_dim: int, upsample: bool = True) -> None:
            super().__init__()
            if upsample:
                p = len(BLUR_KERNEL) - 2
                self.upsample = Blur(3, ((p + 1) // 2 + 1, p // 2), up=2, gain=4.0)
            self.conv = ModulatedConv2d(cin, 3, 1, style_dim, demodulate=False)
            self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

        def forward(self, x: torch.Tensor, style: torch.Tensor,
                    skip: torch.Tensor | None = None) -> torch.Tensor:
            out = self.conv(x, style) + self.bias
            return out if skip is None else out + self.upsample(skip)

    class ConstantInput(nn.Module):
        def __init__(self, ch: int, size: int = 4) -> None:
            super().__init__()
            self.input = nn.Parameter(torch.randn(1, ch, size, size))

    class Generator(nn.Module):
        """GPEN's Generator with isconcat, called with one style and the encoder maps as noise."""

        def __init__(self, size: int, channels: dict[int, int], style_dim: int, n_mlp: int) -> None:
            super().__init__()
            self.style = nn.Sequential(PixelNorm(), *[EqualLinear(style_dim, style_dim, lr_mul=GPEN_LR_MLP,
                                                                  activation=True) for _ in range(n_mlp)])
            self.input = ConstantInput(channels[4])
            self.conv1 = StyledConv(channels[4], channels[4], style_dim)
            self.to_rgb1 = ToRGB(2 * channels[4], style_dim, upsample=False)
            self.convs = nn.ModuleList()
            self.to_rgbs = nn.ModuleList()
            cin = channels[4]
            for i in range(3, int(math.log2(size)) + 1):
                cout = channels[2 ** i]
                self.convs.append(StyledConv(2 * cin, cout, style_dim, upsample=True))
                self.convs.append(StyledConv(2 * cout, cout, style_dim))
                self.to_rgbs.append(ToRGB(2 * cout, style_dim))
                cin = cout

        def forward(self, code: torch.Tensor, maps: list[torch.Tensor]) -> torch.Tensor:
            """`maps`: the encoder's feature maps from 4x4 up; each resolution's map is the noise of
            both of its convolutions (GPEN's `noise[1:]` of the doubled, reversed list)."""
            style = self.style(code)
            out = self.input.input.expand(code.shape[0], -1, -1, -1)
            out = self.conv1(out, style, maps[0])
            skip = self.to_rgb1(out, style)
            for conv1, conv2, to_rgb, noise in zip(self.convs[::2], self.convs[1::2], self.to_rgbs, maps[1:]):
                out = conv2(conv1(out, style, noise), style, noise)
                skip = to_rgb(out, style, skip)
            return skip

    class FullGenerator(nn.Module):
        """GPEN's FullGenerator (isconcat): (N, 3, size, size) RGB in [-1, 1] -> the same. Returns
        the image alone (GPEN's second output, the latents, is None unless asked for)."""

        def __init__(self, size: int, channels: dict[int, int], style_dim: int = GPEN_STYLE_DIM,
                     n_mlp: int = GPEN_N_MLP) -> None:
            super().__init__()
            self.log_size = int(math.log2(size))
            self.generator = Generator(size, channels, style_dim, n_mlp)
            self.ecd0 = nn.Sequential(conv_layer(3, channels[size], 1))
            cin = channels[size]
            for i in range(self.log_size, 2, -1):
                cout = channels[2 ** (i - 1)]
                setattr(self, f"ecd{self.log_size - i + 1}",
                        nn.Sequential(conv_layer(cin, cout, 3, downsample=True)))
                cin = cout
            self.final_linear = nn.Sequential(EqualLinear(channels[4] * 16, style_dim, activation=True))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dt = self.final_linear[0].weight.dtype
            h = x.to(dt)
            maps = []
            for i in range(self.log_size - 1):
                h = getattr(self, f"ecd{i}")(h)
                maps.append(h)
            # reshape, not view: under channels_last the 4x4 map is not NCHW-contiguous.
            code = self.final_linear(h.reshape(h.shape[0], -1))
            return self.generator(code, maps[::-1]).float()

    return {"FullGenerator": FullGenerator, "ModulatedConv2d": ModulatedConv2d}
