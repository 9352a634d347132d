"""Regenerate the corpus of real exporters' graphs: `python tests/zoo/make_zoo.py [OUT_DIR]`.

Small architectures written in plain torch.nn (torchvision does not import beside the CPU torch wheel),
seeded weights at realistic scales (torch's default init; BatchNorm statistics and BatchNorm / LayerNorm
affine parameters random, so folding them is not a no-op), batch 1 and small spatial sizes (224x224 for
MobileNetV2 and the ResNet stem: their cross-layer pairs want ImageNet-sized maps). Each is exported by
`torch.onnx.export` as users do: the TorchScript exporter (`dynamo=False`) with a dynamic batch axis
(so the graph keeps the exporter's Shape/Gather/Concat arithmetic), and for some the dynamo exporter.
One entry re-encodes its weights as `Constant` nodes and routes a shape through `Identity`, as
paddle2onnx and tf2onnx write them.

`python tests/zoo/make_zoo.py --full DIR` writes the cross-layer models at their published widths instead
(`corpus.FULL_SIZE`, for benchmarks/cpu_speed.py; not checked in).

Writes `<name>.onnx` for every checked-in entry of the corpus (`corpus.CHECKED_IN`; the wheels' pretrained
models are fetched, not made; the quantized ones, `corpus.QUANTIZED`, are made from these by make_qdq.py); the files are checked in (see test_zoo.py's
reproducibility test, which runs this script when torch is installed).
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import onnx
import torch
from onnx import helper
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import CHECKED_IN, ENTRIES, FULL_SIZE, QUANTIZED  # noqa: E402

# ----------------------------------------------------------------------------------- building blocks


def _bn(c, kind=nn.BatchNorm2d):
    bn = kind(c)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0, 0.1)
        bn.running_mean.normal_(0, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
    return bn


def _randomize_norms(module: nn.Module) -> nn.Module:
    """LayerNorm affine parameters away from torch's 1 / 0 (which exporters and simplifiers drop)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return module


def conv_bn_act(cin, cout, k=1, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), _bn(cout)]
    return nn.Sequential(*layers, act) if act is not None else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """GlobalAveragePool -> Conv -> ReLU/SiLU -> Conv -> HardSigmoid/Sigmoid -> Mul."""

    def __init__(self, c, squeeze, act, gate):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.act, self.fc2, self.gate = nn.Conv2d(c, squeeze, 1), act, nn.Conv2d(squeeze, c, 1), gate

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class InvertedResidual(nn.Module):
    """MobileNetV3 / EfficientNet MBConv: expand 1x1 -> depthwise kxk -> SE -> project 1x1 (+ residual)."""

    def __init__(self, cin, cexp, cout, k, stride, act, se_act, se_gate, squeeze=None):
        super().__init__()
        self.expand = conv_bn_act(cin, cexp, 1, act=act) if cexp != cin else nn.Identity()
        self.dw = conv_bn_act(cexp, cexp, k, stride, groups=cexp, act=act)
        squeeze = max(8, cexp // 4) if squeeze is None else squeeze
        self.se = SqueezeExcite(cexp, squeeze, se_act, se_gate) if se_gate else nn.Identity()
        self.project = conv_bn_act(cexp, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        hs, relu = nn.Hardswish(), nn.ReLU()
        self.stem = conv_bn_act(3, 16, 3, 2, act=nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 2, relu, nn.ReLU(), nn.Hardsigmoid()),
            InvertedResidual(16, 72, 24, 3, 2, relu, nn.ReLU(), None),
            InvertedResidual(24, 88, 24, 3, 1, relu, nn.ReLU(), None),
            InvertedResidual(24, 96, 40, 5, 2, hs, nn.ReLU(), nn.Hardsigmoid()),
            InvertedResidual(40, 120, 40, 5, 1, hs, nn.ReLU(), nn.Hardsigmoid()),
        )
        self.head = conv_bn_act(40, 120, 1, act=nn.Hardswish())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Linear(120, 64), nn.Hardswish(), nn.Linear(64, classes))

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.head(self.blocks(self.stem(x)))), 1))


class EfficientNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = conv_bn_act(3, 16, 3, 2, act=nn.SiLU())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 1, nn.SiLU(), nn.SiLU(), nn.Sigmoid()),
            InvertedResidual(16, 64, 24, 3, 2, nn.SiLU(), nn.SiLU(), nn.Sigmoid()),
            InvertedResidual(24, 96, 24, 3, 1, nn.SiLU(), nn.SiLU(), nn.Sigmoid()),
            InvertedResidual(24, 96, 40, 5, 2, nn.SiLU(), nn.SiLU(), nn.Sigmoid()),
        )
        self.head = conv_bn_act(40, 128, 1, act=nn.SiLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.head(self.blocks(self.stem(x)))), 1))


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: `v` rounded to a multiple of `d`, never more than 10% below `v`."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018; torchvision's layout) at width multiplier `width`: conv 3x3/2 -> BN ->
    ReLU6, the seventeen inverted-residual blocks of the paper's table 2 (t, c, n, s; expand 1x1 -> BN -> ReLU6 ->
    depthwise 3x3 -> BN -> ReLU6 -> project 1x1 -> BN, the residual where stride 1 and widths match), conv 1x1 ->
    BN -> ReLU6, global average pool, Linear. Unlike torchvision the last conv's 1280 channels scale with
    `width` too (the file stays small)."""

    BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width=1.0, classes=10):
        super().__init__()
        relu6 = nn.ReLU6()
        cin = _divisible(32 * width)
        layers = [conv_bn_act(3, cin, 3, 2, act=relu6)]
        for t, c, n, s in self.BLOCKS:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cin * t, cout, 3, s if i == 0 else 1, relu6, None, None))
                cin = cout
        last = _divisible(1280 * width)
        self.features = nn.Sequential(*layers, conv_bn_act(cin, last, 1, act=relu6))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> BN -> ReLU -> 3x3 (the stride) -> BN -> ReLU -> 1x1 (4x wide) -> BN,
    + the input (through a 1x1 conv -> BN where the shape changes) -> ReLU."""

    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(conv_bn_act(cin, width, 1, act=nn.ReLU()),
                                  conv_bn_act(width, width, 3, stride, act=nn.ReLU()), conv_bn_act(width, cout, 1))
        self.down = conv_bn_act(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


class ResNetStem(nn.Module):
    """A ResNet-50 stem and its first stage: conv 7x7/2 (64) -> BN -> ReLU -> MaxPool 3x3/2 pad 1, then three
    bottlenecks of `width` (ResNet-50's is 64; 4x `width` out)."""

    def __init__(self, width=64):
        super().__init__()
        self.stem = nn.Sequential(conv_bn_act(3, 64, 7, 2, act=nn.ReLU()), nn.MaxPool2d(3, 2, 1))
        self.layer1 = nn.Sequential(Bottleneck(64, width), Bottleneck(4 * width, width), Bottleneck(4 * width, width))

    def forward(self, x):
        return self.layer1(self.stem(x))


class EfficientNetB0(nn.Module):
    """EfficientNet-B0 (Tan & Le 2019; torchvision's layout) at width multiplier `width`: conv 3x3/2 (32) -> BN ->
    SiLU, the sixteen MBConv blocks of the paper's table 1 (expand t, kernel k, channels c, repeats n, stride s;
    squeeze-excite to a quarter of the block's input channels, SiLU and a sigmoid gate), conv 1x1 (1280) -> BN ->
    SiLU, global average pool, Linear. Stochastic depth and dropout are training-only."""

    BLOCKS = ((1, 3, 16, 1, 1), (6, 3, 24, 2, 2), (6, 5, 40, 2, 2), (6, 3, 80, 3, 2), (6, 5, 112, 3, 1),
              (6, 5, 192, 4, 2), (6, 3, 320, 1, 1))

    def __init__(self, width=1.0, classes=10):
        super().__init__()
        cin = _divisible(32 * width)
        layers = [conv_bn_act(3, cin, 3, 2, act=nn.SiLU())]
        for t, k, c, n, s in self.BLOCKS:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cin * t, cout, k, s if i == 0 else 1, nn.SiLU(), nn.SiLU(),
                                               nn.Sigmoid(), squeeze=max(1, cin // 4)))
                cin = cout
        last = _divisible(1280 * width)
        self.features = nn.Sequential(*layers, conv_bn_act(cin, last, 1, act=nn.SiLU()))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class ConvNeXtBlock(nn.Module):
    """dwconv 7x7 -> permute NHWC -> LayerNorm -> Linear 4x -> GELU -> Linear -> gamma * -> permute -> + x."""

    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.act, self.fc2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.empty(c).uniform_(0.1, 1.0))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.fc2(self.act(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 4, 4)
        self.stem_norm = nn.LayerNorm(32, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(32), ConvNeXtBlock(32))
        self.norm = nn.LayerNorm(32, eps=1e-6)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.blocks(x)
        return self.fc(self.norm(x.mean((-2, -1))))


class EncoderLayer(nn.Module):
    """BERT/ViT post-LN encoder layer, attention written out: MatMul / sqrt(d) + mask -> Softmax -> MatMul."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff1, self.act, self.ff2 = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def split(self, x):
        b, s, d = x.size()
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, additive_mask):
        b, s, d = x.size()
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads) + additive_mask
        ctx = torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.ff2(self.act(self.ff1(x))))


class Bert(nn.Module):
    VOCAB, MAX_LEN = 100, 32

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(self.VOCAB, d), nn.Embedding(self.MAX_LEN, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(EncoderLayer(d, heads) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.size(1), dtype=torch.int64).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(positions))
        additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive)
        return x, torch.tanh(self.pool(x[:, 0]))


class Conv(nn.Module):
    """YOLOv8 Conv: conv -> BN -> SiLU, SiLU written x * sigmoid(x) as older exports have it."""

    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, k, s, k // 2, bias=False), _bn(cout)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y * torch.sigmoid(y)


class C2f(nn.Module):
    """YOLOv8 C2f: cv1 -> Split in two -> bottlenecks on the second half -> Concat all -> cv2."""

    def __init__(self, cin, cout, n=1):
        super().__init__()
        self.c = cout // 2
        self.cv1, self.cv2 = Conv(cin, 2 * self.c), Conv((2 + n) * self.c, cout)
        self.m = nn.ModuleList(nn.Sequential(Conv(self.c, self.c, 3), Conv(self.c, self.c, 3)) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).split((self.c, self.c), 1))
        for m in self.m:
            y.append(y[-1] + m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class YoloBlock(nn.Module):
    """Backbone (Conv s2, C2f) x2 -> SPPF-like pool -> Upsample (Resize) -> Concat with the skip -> C2f -> head."""

    def __init__(self):
        super().__init__()
        self.s1, self.c1 = Conv(3, 16, 3, 2), C2f(16, 16)
        self.s2, self.c2 = Conv(16, 32, 3, 2), C2f(32, 32)
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck = C2f(48, 32)
        self.head = nn.Conv2d(32, 20, 1)

    def forward(self, x):
        p1 = self.c1(self.s1(x))
        p2 = self.c2(self.s2(p1))
        p2 = p2 + self.pool(p2)
        return self.head(self.neck(torch.cat([self.up(p2), p1], 1)))



# ------------------------------------------------------------------------- audio, recurrent-free speech, ViT


def _bn1d(c):
    return _bn(c, nn.BatchNorm1d)


class Audio1d(nn.Module):
    """A raw-waveform keyword spotter (M5 stem, MatchboxNet-style block): Conv1d k=80 s=4 -> BN -> ReLU ->
    MaxPool1d, Conv1d k=3 -> BN -> ReLU -> MaxPool1d, a depthwise-separable Conv1d block (dilated depthwise k=5,
    pointwise, BN) with its residual and ReLU, global average over time -> Linear -> LogSoftmax."""

    def __init__(self, classes=12):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(1, 32, 80, 4, bias=False), _bn1d(32), nn.ReLU(), nn.MaxPool1d(4))
        self.conv = nn.Sequential(nn.Conv1d(32, 48, 3, padding=1, bias=False), _bn1d(48), nn.ReLU(), nn.MaxPool1d(4))
        self.sep = nn.Sequential(nn.Conv1d(48, 48, 5, padding=4, dilation=2, groups=48, bias=False),
                                 nn.Conv1d(48, 48, 1, bias=False), _bn1d(48))
        self.fc = nn.Linear(48, classes)

    def forward(self, audio):
        x = self.conv(self.stem(audio))
        x = torch.relu(x + self.sep(x))
        return torch.log_softmax(self.fc(x.mean(-1)), -1)


class FsmnLayer(nn.Module):
    """FSMN memory block: Linear (no bias) -> depthwise Conv1d over time (left context `lorder`, right `rorder`,
    no bias) + its input -> Linear -> ReLU."""

    def __init__(self, d, proj, lorder, rorder):
        super().__init__()
        self.lorder, self.rorder = lorder, rorder
        self.proj = nn.Linear(d, proj, bias=False)
        self.memory = nn.Conv1d(proj, proj, lorder + rorder, groups=proj, bias=False)
        self.affine = nn.Linear(proj, d)

    def forward(self, x):
        p = self.proj(x)
        m = nn.functional.pad(p.transpose(1, 2), (self.lorder - 1, self.rorder))
        p = p + self.memory(m).transpose(1, 2)
        return torch.relu(self.affine(p))


class Fsmn(nn.Module):
    """An FSMN voice-activity detector on 80-dim filterbank frames [B, T, 80]: Linear -> Linear -> ReLU, three
    memory blocks, Linear -> Linear -> Softmax over 20 classes per frame."""

    def __init__(self, feats=80, d=96, proj=48, classes=20):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(feats, 64), nn.Linear(64, d), nn.ReLU())
        self.layers = nn.Sequential(FsmnLayer(d, proj, 10, 0), FsmnLayer(d, proj, 10, 1), FsmnLayer(d, proj, 10, 2))
        self.out = nn.Sequential(nn.Linear(d, 64), nn.Linear(64, classes))

    def forward(self, feats):
        return torch.softmax(self.out(self.layers(self.inp(feats))), -1)


class VitBlock(nn.Module):
    """A timm ViT block (pre-LN): qkv in one Linear, reshape/permute into heads, (q @ k^T) * scale -> Softmax
    -> @ v, projection and residual; LayerNorm -> MLP (GELU) and residual."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.scale = heads, (d // heads) ** -0.5
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class VitSeg(nn.Module):
    """A small ViT encoder (4x4 patches, learned positions, two blocks) with a ConvTranspose decoder back to
    the input's resolution: tokens -> map -> ConvTranspose 2x2/2 -> BN -> ReLU -> ConvTranspose 2x2/2 -> ReLU
    -> Conv 1x1 (per-pixel class scores)."""

    def __init__(self, d=32, heads=2, classes=5, grid=8):
        super().__init__()
        self.grid = grid
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.pos = nn.Parameter(torch.randn(1, grid * grid, d) * 0.02)
        self.blocks = nn.Sequential(VitBlock(d, heads), VitBlock(d, heads))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.up = nn.Sequential(nn.ConvTranspose2d(d, 32, 2, 2), _bn(32), nn.ReLU(),
                                nn.ConvTranspose2d(32, 16, 2, 2), nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, pixels):
        x = self.patch(pixels).flatten(2).transpose(1, 2) + self.pos
        x = self.norm(self.blocks(x))
        b, n, d = x.shape
        return self.up(x.transpose(1, 2).reshape(b, d, self.grid, self.grid))


class BaseConv(nn.Module):
    """YOLOX BaseConv: Conv (no bias) -> BN -> SiLU."""

    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(cin, cout, k, s, (k - 1) // 2, bias=False), _bn(cout), nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class YoloxHead(nn.Module):
    """A YOLOX-style detector: Focus (space-to-depth by strided slices) -> two strided BaseConv stages -> a
    decoupled head per level (stem, cls and reg branches of two 3x3 convs, cls / reg / obj predictions),
    sigmoid on obj and cls, the levels concatenated, and the boxes decoded in the graph
    ((xy + grid) * stride, exp(wh) * stride), as YOLOX exports with decode_in_inference."""

    def __init__(self, classes=4):
        super().__init__()
        self.focus = BaseConv(12, 16, 3)
        self.dark2, self.dark3 = BaseConv(16, 24, 3, 2), BaseConv(24, 32, 3, 2)
        self.dark4 = BaseConv(32, 48, 3, 2)
        self.strides = (8, 16)
        w = 16  # the head's width
        self.stems = nn.ModuleList([BaseConv(32, w), BaseConv(48, w)])
        self.cls = nn.ModuleList(nn.Sequential(BaseConv(w, w, 3), BaseConv(w, w, 3)) for _ in self.strides)
        self.reg = nn.ModuleList(nn.Sequential(BaseConv(w, w, 3), BaseConv(w, w, 3)) for _ in self.strides)
        self.cls_pred = nn.ModuleList(nn.Conv2d(w, classes, 1) for _ in self.strides)
        self.reg_pred = nn.ModuleList(nn.Conv2d(w, 4, 1) for _ in self.strides)
        self.obj_pred = nn.ModuleList(nn.Conv2d(w, 1, 1) for _ in self.strides)

    def forward(self, images):
        x = torch.cat([images[..., ::2, ::2], images[..., 1::2, ::2], images[..., ::2, 1::2],
                       images[..., 1::2, 1::2]], 1)
        c3 = self.dark3(self.dark2(self.focus(x)))
        c4 = self.dark4(c3)
        outs, grids, strides = [], [], []
        for i, (feat, stride) in enumerate(zip((c3, c4), self.strides)):
            s = self.stems[i](feat)
            c, r = self.cls[i](s), self.reg[i](s)
            out = torch.cat([self.reg_pred[i](r), self.obj_pred[i](r).sigmoid(), self.cls_pred[i](c).sigmoid()], 1)
            h, w = out.shape[-2:]
            outs.append(out.flatten(2))
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            grids.append(torch.stack((xs, ys), 2).reshape(1, -1, 2).float())
            strides.append(torch.full((1, h * w, 1), float(stride)))
        out = torch.cat(outs, 2).permute(0, 2, 1)
        grid, stride = torch.cat(grids, 1), torch.cat(strides, 1)
        return torch.cat([(out[..., :2] + grid) * stride, torch.exp(out[..., 2:4]) * stride, out[..., 4:]], -1)



class CRNN(nn.Module):
    """CRNN text-line reader: conv -> BN -> ReLU -> pool stack over a 32-pixel-high line -> its columns as a
    sequence -> two-layer bidirectional LSTM (or GRU) -> per-column class log-probabilities (CTC)."""

    def __init__(self, rnn="lstm", classes=37, hidden=24):
        super().__init__()
        relu = nn.ReLU
        self.cnn = nn.Sequential(
            conv_bn_act(1, 8, 3, act=relu()), nn.MaxPool2d(2, 2),  # 16 x W/2
            conv_bn_act(8, 16, 3, act=relu()), nn.MaxPool2d(2, 2),  # 8 x W/4
            conv_bn_act(16, 24, 3, act=relu()), nn.MaxPool2d((2, 1), (2, 1)),  # 4 x W/4
            conv_bn_act(24, 32, 3, act=relu()), nn.MaxPool2d((4, 1), (4, 1)),  # 1 x W/4
        )
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[rnn](32, hidden, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        seq = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [W/4, N, 32]
        y, _ = self.rnn(seq)
        return self.fc(y).log_softmax(-1).transpose(0, 1)  # [N, W/4, classes]


class VoiceActivity(nn.Module):
    """Voice-activity detector: a learned filterbank (strided Conv1d) -> Conv1d -> ReLU -> LSTM over the
    frames -> per-frame speech probability."""

    def __init__(self, channels=32, hidden=32):
        super().__init__()
        self.filters = nn.Conv1d(1, channels, 64, stride=32)
        self.conv = nn.Conv1d(channels, channels, 3, padding=1)
        self.rnn = nn.LSTM(channels, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, audio):
        frames = torch.relu(self.conv(torch.log1p(self.filters(audio).abs())))  # [N, C, T]
        y, _ = self.rnn(frames.transpose(1, 2))
        return torch.sigmoid(self.fc(y)).squeeze(-1)  # [N, T]


MODELS = {"mobilenetv3": MobileNetV3, "efficientnet": EfficientNet, "mobilenetv2": MobileNetV2,
          "resnet_stem": ResNetStem, "efficientnet_b0": EfficientNetB0, "convnext": ConvNeXt, "bert": Bert,
          "yolo": YoloBlock, "audio1d": Audio1d, "fsmn": Fsmn, "vit_seg": VitSeg, "yolox": YoloxHead,
          "crnn_lstm": lambda: CRNN("lstm"), "crnn_gru": lambda: CRNN("gru"), "vad_lstm": VoiceActivity}

# ------------------------------------------------------------------------------------------- export


def _example_inputs(entry) -> tuple:
    gen = torch.Generator().manual_seed(0)
    out = []
    for spec in entry["inputs"].values():
        if spec["kind"] == "ids":
            out.append(torch.randint(spec["low"], spec["high"], spec["shape"], generator=gen))
        elif spec["kind"] == "mask":
            out.append(torch.ones(spec["shape"], dtype=torch.int64))
        else:
            out.append(torch.randn(spec["shape"], generator=gen))
    return tuple(out)


def _constant_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Initializers -> `Constant` nodes; Reshape's shape and Resize's scales through `Identity` (paddle2onnx style)."""
    g = model.graph
    consts = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t) for t in g.initializer]
    nodes = []
    for i, n in enumerate(g.node):
        slot = {"Reshape": 1, "Resize": 2}.get(n.op_type)
        if slot is not None and len(n.input) > slot and n.input[slot]:
            alias = f"{n.input[slot]}_identity_{i}"
            nodes.append(helper.make_node("Identity", [n.input[slot]], [alias], name=f"{n.name}_identity"))
            n.input[slot] = alias
        nodes.append(n)
    del g.initializer[:]
    del g.node[:]
    g.node.extend(consts + nodes)
    return model


def _strip_provenance(model: onnx.ModelProto) -> None:
    """Drop what depends on where the script runs: the dynamo exporter's per-node stack traces (absolute
    paths, line numbers) and doc strings."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        del value.metadata_props[:]
        value.doc_string = ""
    for tensor in model.graph.initializer:
        del tensor.metadata_props[:]


def export(name: str, entry: dict) -> bytes:
    torch.manual_seed(entry["seed"])
    module = _randomize_norms(MODELS[entry["arch"]](**entry.get("arch_args", {}))).eval()
    args = _example_inputs(entry)
    names = list(entry["inputs"])
    outputs = entry["outputs"]
    buf = io.BytesIO()
    with torch.no_grad():
        if entry["exporter"] == "dynamo":
            program = torch.onnx.export(module, args, input_names=names, output_names=outputs,
                                        opset_version=entry["opset"], dynamo=True,
                                        verbose=False)
            model = program.model_proto
        else:
            dynamic = {n: {0: "batch"} for n in names + outputs}
            torch.onnx.export(module, args, buf, input_names=names, output_names=outputs,
                              opset_version=entry["opset"], dynamo=False, dynamic_axes=dynamic)
            model = onnx.load_from_string(buf.getvalue())
    if entry.get("constant_weights"):
        model = _constant_weights(model)
    _strip_provenance(model)
    model.producer_version = "2.13.0"  # the '+cpu' suffix is the wheel's, not the exporter's
    model.graph.name = name
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True) if hasattr(model, "SerializeToString") else b""


def main(out_dir: Path = HERE, full: bool = False) -> None:
    """Every checked-in entry into `out_dir`; with `full`, the FULL_SIZE models instead."""
    made = {n: ENTRIES[n] for n in CHECKED_IN if n not in QUANTIZED}
    if full:
        made = {n: {**ENTRIES[base], **spec} for n, (base, spec) in FULL_SIZE.items()}
    for name, entry in made.items():
        data = export(name, entry)
        (Path(out_dir) / f"{name}.onnx").write_bytes(data)
        print(f"{name}.onnx: {len(data) / 1024:.0f} KiB")


if __name__ == "__main__":
    full = "--full" in sys.argv[1:]
    paths = [a for a in sys.argv[1:] if a != "--full"]
    main(Path(paths[0]) if paths else HERE, full)
