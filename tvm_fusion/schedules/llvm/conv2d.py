"""CPU (llvm) conv2d: `conv2d(x, W) + epilogue  ==>  padded register-tiled kernel`, vector width and register
budget from the target (16 fp32 lanes / 32 zmm with AVX-512, 8 / 16 ymm with AVX2, 4 / 32 with NEON:
`hardware.cpu_facts`). The llvm compute pads the output to the tile (`ConvPadding`: output channels per
group, rows, columns; zero weights and zero input rows feed the padding), and the epilogue reads back the
real outputs only, so every shape gets a full tile and no shape takes an untiled schedule.

Dense and grouped convs (`tiled`): output channels in vectors of L lanes, a register tile of output pixels x
output channels, the epilogue applied to each tile while it is in registers. W is packed at compile time
(`pack_conv`, the schedule's pack hook) into Wp[oc block, rc, rh, rw, OC]: each block's panel is contiguous,
oc innermost (a W left unpacked, e.g. by a caller of the compute alone, is copied into that panel per task).

    parallel for (n, oc block of OC = L * v channels, inside one group):
        panel[rc, rh, rw, OC] = Wp[oc block]                     # packed once (0 for padded channels)
        for (row tile, column tile):                             # rows * cols output pixels
            acc[rows, cols, OC] = 0                              # rows * cols * v vector registers
            for rh, rw, rc:
                acc[i, j, :] += x[group's rc, y + i + rh, x + j + rw] * panel[rc, rh, rw, :]  # broadcast * vector
            out[n, real channels of the block, real pixels of the tile] = epilogue(acc)

Depthwise convs (one input channel per output channel, `depthwise`): output columns in vectors.

    parallel for (n, channel):
        for (row tile, column tile of L * k columns):
            acc[rows, k * L] = 0
            for rh, rw: acc[i, :] += x[c, y + i + rh, x + rw : + k * L] * W[c, 0, rh, rw]   # vector * broadcast
            out[n, c, real pixels] = epilogue(acc)

A strided (or at most `channel_depthwise_columns` wide) depthwise conv whose channels are whole vectors, on an
ISA whose step cost says `channel_depthwise` (AVX2, AVX-512): `depthwise_channels`, the tiled loop nest over
one vector of channels, each channel block's padded input copied channels-last inside the parallel loop (every
tap a contiguous vector load, no column gathers).

On an ISA whose step cost says `flat_taps_chains` (AVX2), a dense conv with a larger kernel (stride 1, or
strided with a channels-last input copy) tiles its output pixels as one row (`flat_taps`, `ConvPlan.flat`):
pixel p reads the padded input at (p // wout * sh + rh, p % wout * sw + rw), so a tile may end on the next
output row and only the last tile is padded (28 x 28 outputs: 784 -> 786 pixels, not 28 -> 30 columns, with
2 x 6 tiles: 7% fewer FMAs).

Flat 1x1 convs whose H * W is whole pixel tiles, on an ISA whose step cost says `pixel_vectors` (AVX2; AVX-512
for `pixel_vector_pointwise`'s convs): `pointwise`, pixels vectorized and the NCHW output stored as whole
vectors (`conv2d_pointwise.py`). A strided
1x1 unpadded conv there copies only the pixels it reads, x[n, c, h * sh, w * sw], and is planned as a flat
1x1 conv over them (`subsampled_pixels`).

Padding is materialised by its own parallel loop nest first (inlining it into the reduction is ~10x
slower on 3x3), channels-last where the ISA packs W taps first, NCHW for shallow strided convs
(`channels_last_input`).

Not this module's kernels: bfloat16 convs on AMX tiles or AVX512-BF16 (`conv2d_amx.py`, `conv2d_dpbf16.py`)
and, on AVX-512, float32 3x3 stride-1 convs (Winograd F(2x2, 3x3): `conv2d_winograd.py`), each where its
`why_not` is None; `pack_conv` packs W for them and the compute and schedule follow the packed W.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tvm_fusion._tvm import te, tirx
from tvm_fusion.errors import FusionError
from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import (CONV_FAMILY, ConvOperands, ConvPadding, conv2d_out_size, conv2d_padded,
                                         pack_channel_blocks, packed_taps)
from tvm_fusion.schedules.llvm import conv2d_amx as amx
from tvm_fusion.schedules.llvm import conv2d_dpbf16 as dpbf16
from tvm_fusion.schedules.llvm import conv2d_pointwise as pointwise
from tvm_fusion.schedules.llvm import conv2d_winograd as winograd
from tvm_fusion.schedules.llvm.blocks import ceil_to, loop_extent, optional_block, vectorize_own_inner_loop
from tvm_fusion.schedules.llvm.conv2d_pointwise import (PixelTile, VectorRows, padded_channels, padded_pixels,
                                                        pixel_tiles, schedule_pointwise)

__all__ = ["ConvTile", "RowTile", "ConvPlan", "choose_tile", "choose_row_tile", "choose_channel_tile",
           "channel_depthwise", "conv_plan", "flat_pixels",
           "subsampled_pixels", "one_row_pixels", "pixel_vector_pointwise",
           "max_accumulators", "shared_tap_accumulators",
           "tiled_accumulators", "packs_taps_first", "channels_last_input", "reduction_chunk",
           "conv2d_llvm", "pack_conv", "schedule_conv2d_llvm"]

FLOAT_BYTES = 4
# vector registers a tile leaves to the panel vectors and the broadcast temporary (28 of 32 zmm accumulate)
RESERVED_REGISTERS = 4
OC_VECTOR_CHOICES = (4, 2, 1)  # output-channel vectors per tile
# The panel (reduction size x tile channels) is re-read by every pixel tile of its oc block. Kept
# inside ~1/6 of the 1 MiB per-core L2 of Zen 4, next to the input rows: measured on ResNet-50,
# 1x1 1024->2048 ran 1.45 ms with a 256 KiB panel and 1.25 ms with 128 KiB.
PANEL_BYTES = 160 * 1024
# An AVX-512 tile's panel may be this large (TILED_STEP_COSTS): measured on a core with 2 MiB of L2, half of
# it (the ISA's bound, not the target's L2: not re-measured on a core with another L2)
AVX512_PANEL_BYTES = 1024 * 1024
# Tile cost per reduction step, in FMA slots: max(accumulators, loads / LOADS_PER_FMA, MIN_CHAINS). Fewer
# than MIN_CHAINS independent accumulators leave the FMA pipes waiting on latency; loads issue two per FMA.
# Measured on Zen 4 (one thread, CPU time): 13x13 outputs ran 12% faster with 13 columns (1 vector of
# channels, 1000 padded to 1008) than with 2 x 7 padded columns, and 7x7 3x3 convs 10% faster with 1 x 7
# pixels than with 4 x 7 (rows padded to 8): real outputs per slot decide, not the accumulator count.
MIN_CHAINS = 6
# depthwise rows may use half (quarter) vectors down to this many fp32 lanes: measured on Zen 4, a 7x7
# depthwise conv ran 1.12x slower padded to 16 columns than TVM's generic 7-lane schedule
MIN_DEPTHWISE_LANES = 4
LOADS_PER_FMA = 2
# `_pixels_tail`: the pointwise kernel on pixels no vector divides only for shallow, non-narrowing convs
TAIL_MAX_REDUCTION = 128
TAIL_MIN_PIXELS = 128
# A flat 1x1 conv (`flat_pixels`) with fewer output channels reads x in place (NCHW: each reduction step
# broadcasts the next input plane's pixels) rather than copying it channels-last first: the copy moves every
# input element once for cout multiply-adds. Measured on Zen 2 (AVX2, one conv + ReLU, one thread, CPU time,
# copy -> in place): 128 -> 16 on 55x55 0.35 -> 0.27 ms, 256 -> 64 on 56x56 1.83 -> 1.50 ms, 576 -> 64 on
# 14x14 0.24 -> 0.18 ms, 576 -> 96 on 14x14 0.31 -> 0.25 ms; 512 -> 128 on 28x28 1.38 -> 1.42 ms,
# 64 -> 256 on 56x56 1.38 -> 1.56 ms, 2048 -> 512 on 7x7 1.30 -> 1.84 ms.
FLAT_COPY_CHANNELS = 128
# A flat 1x1 conv's channels-last input copy (`_schedule_pad`) writes each pixel's channels in blocks of this
# many, one vector each: a pixel's whole channel row read in one go touches a cache line of every input plane,
# more planes than L1 holds at 1024 channels, and every line comes back for the next pixel. Measured on Zen 2
# (AVX2, one thread, CPU time, whole channel rows -> blocks of 32; the copy alone): ResNet-50's 1024 on 14x14
# 0.135 -> 0.045 ms, 2048 on 7x7 0.067 -> 0.022 ms, the 1x1/2 1024 on 14x14 0.038 -> 0.018 ms and 512 on
# 28x28 0.049 -> 0.033 ms, 256 on 14x14 0.011 -> 0.010 ms (blocks of 16: the same, 64: the same); the
# kernels (conv + ReLU, interleaved, bit-identical): 1x1 1024 -> 256 on 14x14 1.564 -> 1.448 ms, 2048 -> 512
# on 7x7 1.700 -> 1.605 ms. The padded copies of larger kernels keep whole rows: their copies alone ran
# faster in blocks (3x3/2 128 on 56x56 0.156 -> 0.110 ms) but the kernels did not (3.266 -> 3.345 ms; 3x3 64
# on 56x56 2.845 -> 2.803 ms; noise).
COPY_CHANNELS = 32
# A strided conv with at most STRIDED_NCHW_CHANNELS input channels (per group) and at most STRIDED_NCHW_MACS
# multiply-adds per input element, cout * KH * KW / (stride_h * stride_w), writes its padded input NCHW even
# where the ISA's step cost says `taps_first` (channels-last): the transposing copy then costs more than the
# plane jumps of its reduction steps. Measured on Zen 2 (AVX2, one conv + ReLU, one thread, CPU time,
# channels-last -> NCHW; the sums unchanged, bit-identical): YOLOv8n's 3x3/2 3 -> 16 on 320x320 0.50 -> 0.47
# ms (36 per element), 16 -> 32 on 160x160 1.08 -> 0.77 ms (72), 32 -> 64 on 80x80 0.70 -> 0.66 ms (144),
# ShuffleNet's 3x3/2 stem 3 -> 24 0.36 -> 0.34 ms (54), 1x1/2 64 -> 32 on 56x56 0.117 -> 0.078 ms (8); more
# multiply-adds or channels lose: 3x3/2 64 -> 128 on 40x40 0.65 -> 0.68 ms and 128 -> 128 on 56x56 2.72 ->
# 3.15 ms (288), ResNet-50's 1x1/2 256 -> 512 on 56x56 3.28 -> 3.92 ms (128, 256 planes); its 7x7/2 stem
# (784) ties.
STRIDED_NCHW_MACS = 144
STRIDED_NCHW_CHANNELS = 64
# a partial last vector of pixels may pad at most this fraction of a 1x1 conv's pixels (`pixel_tail`)
PIXEL_TAIL_WASTE = 0.05
# A stride-1 depthwise tile (`RowTile.shared_taps`) takes at most this many accumulators (StepCost's
# default): its unrolled taps keep input vectors live beside them, and FMA chains of 9 or 25 taps each hide
# the FMA latency with few of them. Measured on Zen 4 (one 3x3 or 5x5 conv + ReLU, one thread, CPU time,
# interleaved, bit-identical). AVX-512, 28-accumulator tiles with rolled taps -> 4 rows x 1 vector unrolled:
# 32 on 112x112 0.231 -> 0.139 ms, 144 on 56x56 0.268 -> 0.164, 5x5 240 on 28x28 0.235 -> 0.168, 5x5 672 on
# 14x14 0.190 -> 0.166 (onnxruntime: 0.183 and 0.213 on the first two); 8 accumulators (8 x 1, 4 x 2) 0.19-0.28
# ms on 56x56 and 28x28. The AVX2 target (8 accumulators rolled -> 4 unrolled): 32 on 112x112 0.255 -> 0.211,
# 144 on 56x56 0.241 -> 0.209, 5x5 240 on 28x28 0.281 -> 0.255, 5x5 672 on 14x14 (2 x 2) 0.212 -> 0.181; 2
# accumulators lost on 5x5 (0.363, 0.233 ms).
SHARED_TAP_ACCUMULATORS = 4
# `reduction_chunk`: a chunk's weights (kernel row x chunk channels x the tile's channels) take at most
# 1 / CHUNK_L1_SHARE of the L1 data cache, and a 1x1 conv's block of accumulators at most 1 / ACC_L2_SHARE of L2
CHUNK_L1_SHARE = 6
ACC_L2_SHARE = 16


@dataclass(frozen=True)
class StepCost:
    """What one reduction step of a tile costs, in FMA slots: loads issued per FMA slot, and the independent
    accumulators the FMA pipes need to hide their latency.
    `taps_first`: W packed [oc block, KH, KW, C/G, OC] and the padded input written channels-last, so
    each reduction step (input channels innermost) reads the next weight vector and the next input channel
    of the same pixels, both in storage order (else Wp [oc block, C/G, KH, KW, OC] and NCHW input).
    `broadcast_registers`: a tile holds its accumulators, its oc vectors of weights and this many input
    broadcasts (None: every tile gets the vector registers minus RESERVED_REGISTERS)."""
    loads_per_fma: float = LOADS_PER_FMA
    min_chains: int = MIN_CHAINS
    taps_first: bool = False
    broadcast_registers: int | None = None
    panel_bytes: int = PANEL_BYTES  # the largest weight panel of a tile wider than one vector
    max_oc_vectors: int = max(OC_VECTOR_CHOICES)  # the most vectors of output channels a tile holds
    flat_pointwise: bool = False  # 1x1 stride-1 unpadded convs tile their pixels as one row (`flat_pixels`)
    pixel_vectors: bool = False  # flat convs may vectorize their pixels (`conv2d_pointwise`, `choose_pixel_tile`)
    channel_depthwise: bool = False  # strided depthwise convs may vectorize their channels (`channel_depthwise`)
    # ... and stride-1 ones with at most this many output columns (0: none)
    channel_depthwise_columns: int = 0
    # `depthwise_channels` in blocks of at most this many channels (0: one whole vector): each pixel of its
    # channels-last input copy gathers one element of each channel plane of the block
    channel_depthwise_lanes: int = 0
    # convs with a larger kernel may tile their pixels as one row (`flat_taps`), their tiles ranked wanting
    # this many independent FMA chains (0: not at all)
    flat_taps_chains: int = 0
    # on an ISA whose 1x1 convs are not `flat_pointwise`, a 1x1 stride-1 unpadded conv may still take the
    # pixel-vectorized kernel (`pixel_vector_pointwise`): one that does not narrow its channels, a narrowing
    # one with at least this many output pixels (0: none), or one whose weights fit `narrowing_l1_share` of L1
    pointwise_narrowing_pixels: int = 0
    narrowing_l1_share: int = 0  # 0: none
    # the most accumulators of a stride-1 depthwise tile (`RowTile.shared_taps`)
    shared_tap_accumulators: int = SHARED_TAP_ACCUMULATORS
    # tiled convs whose panel outgrows L1 accumulate over the reduction in chunks (`reduction_chunk`)
    chunked_reduction: bool = False
    # a tile whose columns are all real but not whole vectors runs its epilogue along its columns (one
    # vector store per channel row, `epilogue_by_columns`) where they fill at least this share of a vector
    # (0: never; else over its channel vectors, `epilogue_by_channel_vectors`)
    column_epilogue_share: float = 0.0


#: per vector ISA (`hardware.cpu_facts`), the tiled kernel's step cost; others: StepCost(). With AVX2 a core
#: issues two 256-bit FMAs and two loads a cycle, so a load costs a whole FMA slot and 2 pipes x 4 cycles of
#: latency want 8 chains (AVX-512 on Zen 4: one double-pumped zmm FMA a cycle, two loads). Measured on Zen 4
#: built for x86-64-v3, one thread, CPU time: 3x3 256 -> 256 on 14x14 3.8 -> 2.8 ms (2 x 5 pixels instead of
#: 1 x 7), 1x1 2048 -> 512 on 7x7 1.8 -> 1.3 ms (2 x 4 instead of 1 x 7).
#: AVX2 packs W taps first and writes the padded input channels-last (`taps_first`): with W [.., C/G, KH,
#: KW, OC] a step jumped a whole tap row of the panel and with NCHW a whole input plane. A tile holds its
#: accumulators, its oc vectors of weights and two broadcasts (the next loading while the FMAs read the last;
#: 16 ymm: 1 x 13 pixels, 2 x 6, 4 x 2). Measured on an AVX2-only Zen 2, one thread, CPU time, kernels alone:
#: 3x3 512 on 28x28 55.7 -> 43.6 ms (2 x 6 pixels, columns padded to 30; 1 x 7 before), 3x3 64 on 56x56
#: 3.6 -> 2.7 ms (2 x 6, 4 x 2 before), 3x3 512 on 7x7 6.4 -> 3.4 ms (2 x 4); SqueezeNet's 1x1 512 -> 1000
#: on 13x13 3.0 -> 2.3 ms (1 x 13; 4 x 2 padded to 14 before; 2 x 7, 17 registers, 4.5 ms). 5 cycles of
#: FMA latency x 2 pipes (Zen 2, Haswell) want ~10 chains: 2 x 6 beat 2 x 4 by 10-25% on 28x28 and 56x56.
#: Counted as 9, so that 7x7 outputs take 8 accumulators padded to 8 columns rather than 2 x 5 padded to 10
#: (the same time, measured: 3x3 512 3.7-3.9 ms, 1x1 1024 -> 192 0.31-0.32 ms; less work wasted).
#: A panel streamed in storage order may be twice PANEL_BYTES: 3x3 512 on 28x28 ran 40.6 ms with 2 x 6
#: (a 288 KiB panel), 47.1 ms with 1 x 10.
#: `flat_pointwise`: a 1x1 conv's pixels are one row H*W long (no halo: a tile may span image rows), so 7x7
#: outputs take 2 x 6 pixels (49 padded to 54) instead of 4 x 2 (7 padded to 8 columns: 8 FMA chains) and
#: 14x14 / 28x28 / 56x56 ones no longer pad each row to the tile (14 -> 15, 28 -> 30, 56 -> 60 columns).
#: `flat_taps_chains`: convs with a larger kernel tile their output pixels as one row too (`flat_taps`), those
#: row tiles ranked wanting 12 chains: 3x3 128 on 28x28 ran 2.36 / 2.34 ms with 2 x 6 (786 pixels), 2.50 /
#: 2.48 ms with 2 x 5 (785); on 7x7 2 x 6 (54 pixels) and 2 x 5 (50) tie. The 1x1 convs keep 9 (2 x 5 on 7x7:
#: 1.17 ms against 1.23 with 2 x 6 on 2048 -> 512).
#: AVX-512 packs W taps first and writes the padded input channels-last too (`taps_first`). Measured on an
#: Intel Xeon with AVX-512 (LLVM's CPU name `rocketlake`; 2 MiB L2 per core), one thread, CPU time, one conv
#: + ReLU, interleaved, bit-identical, [oc block, C, KH, KW, B] and NCHW -> taps first: ResNet-50's 3x3 256 on
#: 14x14 1.76 -> 1.43 ms (onnxruntime's Conv node 1.29), 3x3 512 on 7x7 2.41 -> 1.91 (1.58), 3x3/2 256 on
#: 28x28 2.25 -> 1.62 (1.39), 3x3/2 512 on 14x14 2.74 -> 1.94 (1.45), 3x3 128 on 28x28 1.47 -> 1.29 (1.27), 3x3
#: 64 on 56x56 1.50 -> 1.42 (1.33); its 1x1 convs the same (2048 -> 512 on 7x7 0.89 / 0.90, 1024 -> 256 on
#: 14x14 0.62 / 0.62); the whole of ResNet-50 72.9 -> 63.2 ms (onnxruntime 48.3).
#: Its tiles hold at most two vectors of output channels, their panel up to AVX512_PANEL_BYTES: a second
#: vector of channels halves the weight loads of a step where one vector only left pixels (1 x 7 on 7x7
#: outputs, 1 x 2 x 14 on 14x14), while four vectors x 7 pixels lost to two x 14 (its panel streamed twice as
#: often). Measured on the same host (one thread, CPU time, interleaved, bit-identical; 160 KiB panels and
#: four vectors -> these): 3x3 512 on 7x7 1.62 -> 1.39 ms (onnxruntime 1.36; 1 x 7 -> 2 x 7), 3x3/2 512 on
#: 14x14 1.64 -> 1.43, 3x3 256 on 14x14 1.18 -> 1.11 (1.10), 3x3/2 256 on 28x28 1.38 -> 1.22 (1.24), VGG19's
#: 3x3 256 on 56x56 21.3 -> 18.2 and 512 on 28x28 21.6 -> 18.1 (1 x 28 -> 2 x 14), 1x1 2048 -> 512 on 7x7
#: 0.87 -> 0.68, 256 -> 1024 on 14x14 0.68 -> 0.60 (4 x 7 -> 2 x 14), 512 -> 2048 on 7x7 0.73 -> 0.68 (4 x 7 ->
#: 2 x 7); whole models (fused, interleaved with onnxruntime): ResNet-50 58.4 -> 55.3 ms (onnxruntime 43.7),
#: VGG19 263 -> 240 (212), Inception v2 25.6 -> 24.3 (21.1), DenseNet-121 41.3 -> 40.3 (45.3).
#: AVX-512 keeps the default tile costs (MIN_CHAINS, LOADS_PER_FMA) and its rows of tiles, and takes the two kernels
#: that store whole vectors where the tiled kernel stores NCHW element by element: strided depthwise convs over channel
#: vectors (`channel_depthwise`) and 1x1 convs over pixel vectors (`pixel_vector_pointwise`: not narrowing, or narrowing
#: on 56x56 and larger). Measured on Zen 4 (AVX-512, one conv + ReLU, one thread, CPU time, tiled / depthwise -> these,
#: interleaved, bit-identical): MobileNetV2's 3x3/2 depthwise 96 on 112x112 1.00 -> 0.54 ms, 144 on 56x56 0.33 -> 0.20
#: ms; 1x1 16 -> 96 on 112x112 1.14 -> 0.49 ms, 24 -> 144 on 56x56 0.45 -> 0.23 ms, 32 -> 192 on 28x28 0.18 -> 0.11 ms,
#: 96 -> 576 on 14x14 0.31 -> 0.27 ms, 96 -> 24 on 56x56 0.23 -> 0.21 ms; ResNet-50's 64 -> 256 on 56x56 1.30 -> 1.03
#: ms, 256 -> 64 on 56x56 2.33 -> 1.46 ms, 128 -> 512 on 28x28 1.14 -> 1.01 ms. Narrowing convs on smaller maps lost:
#: 192 -> 32 on 28x28 0.134 -> 0.148 ms, 512 -> 128 on 28x28 1.02 -> 1.09 ms.
TILED_STEP_COSTS = {"avx2": StepCost(loads_per_fma=1, min_chains=9, taps_first=True, broadcast_registers=2,
                                     panel_bytes=2 * PANEL_BYTES, flat_pointwise=True,
                                     pixel_vectors=True, channel_depthwise=True, channel_depthwise_columns=7,
                                     flat_taps_chains=12),
                    "avx512": StepCost(taps_first=True, panel_bytes=AVX512_PANEL_BYTES, max_oc_vectors=2,
                                       pixel_vectors=True, channel_depthwise=True, channel_depthwise_columns=7,
                                       channel_depthwise_lanes=8, pointwise_narrowing_pixels=56 * 56,
                                       narrowing_l1_share=2, chunked_reduction=True, column_epilogue_share=0.5)}


def step_cost(facts: CpuFacts) -> StepCost:
    """The tiled kernel's step cost for a target's vector ISA (TILED_STEP_COSTS, else the default)."""
    return TILED_STEP_COSTS.get(facts.isa, StepCost())


def packs_taps_first(target) -> bool:
    """Whether `pack_conv` lays W out [O'/B, KH, KW, C/G, B] for this llvm target (else [O'/B, C/G, KH, KW, B])."""
    return step_cost(cpu_facts(target)).taps_first


def max_accumulators(facts: CpuFacts) -> int:
    """Accumulator registers of one tile: the target's vector registers minus RESERVED_REGISTERS."""
    return facts.vector_registers - RESERVED_REGISTERS


def tiled_accumulators(facts: CpuFacts, oc_vectors: int) -> int:
    """Accumulator registers of a tiled-kernel tile with `oc_vectors` vectors of channels: the registers left
    by its weights and the ISA's `broadcast_registers` (TILED_STEP_COSTS), else `max_accumulators`."""
    broadcasts = step_cost(facts).broadcast_registers
    if broadcasts is None:
        return max_accumulators(facts)
    return facts.vector_registers - oc_vectors - broadcasts


@dataclass(frozen=True)
class ConvTile:
    """Tiled kernel: `oc_vectors` vectors of output channels x `rows` x `cols` output pixels."""
    oc_vectors: int  # v: the tile holds lanes * v output channels
    rows: int  # output rows per tile
    cols: int  # output columns per tile
    lanes: int  # fp32 lanes of one vector register of the target

    @property
    def channels(self) -> int:
        return self.lanes * self.oc_vectors

    @property
    def accumulators(self) -> int:
        return self.oc_vectors * self.rows * self.cols

    @property
    def loads_per_step(self) -> int:
        """Vector loads of the panel plus input broadcasts per reduction step."""
        return self.oc_vectors + self.rows * self.cols


@dataclass(frozen=True)
class RowTile(VectorRows):
    """Depthwise kernel: `rows` output rows x `vectors` vectors of output columns of one channel;
    `shared_taps`: its taps unrolled, so that its rows share the loads of each input row (stride 1)."""
    shared_taps: bool = False


@dataclass(frozen=True)
class ConvPlan:
    # "tiled", "depthwise", "depthwise_channels" (`channel_depthwise`) or "pointwise" (`conv2d_pointwise`)
    kernel: str
    tile: ConvTile | RowTile | PixelTile
    padding: ConvPadding
    flat: bool = False  # the pixels tiled as one row (`flat_pixels`): padding.rows is 1
    # flat, x read where it is (NCHW), not copied channels-last (tiled: FLAT_COPY_CHANNELS) or into strips
    # (pointwise: `conv2d_pointwise.strips_in_place`)
    in_place: bool = False
    chunk: int = 0  # tiled: the input channels of one reduction chunk (`reduction_chunk`); 0: one pass


def _efficiency(accumulators: int, loads: int, real: tuple[int, ...], padded: tuple[int, ...],
                cost: StepCost = StepCost()) -> float:
    """Real outputs per FMA slot of a reduction step (1.0: the tile divides the output and is FMA bound)."""
    useful = accumulators
    for r, p in zip(real, padded):
        useful *= r / p
    return round(useful / max(accumulators, loads / cost.loads_per_fma, cost.min_chains), 6)


def _oc_vector_options(opg: int, groups: int, reduction: int, tasks_wanted: int, lanes: int,
                       panel_bytes: int = PANEL_BYTES, max_vectors: int = max(OC_VECTOR_CHOICES)) -> list[int]:
    """Channel widths (in vectors, at most `max_vectors`); wider than one vector only while the oc blocks (of
    the channels padded to the width, per group) still feed every thread and the panel fits `panel_bytes`."""
    options = []
    for v in (v for v in OC_VECTOR_CHOICES if v <= max_vectors):
        blocks = groups * ceil_to(opg, lanes * v) // (lanes * v)
        panel = reduction * lanes * v * FLOAT_BYTES
        if v == 1 or (blocks >= tasks_wanted and panel <= panel_bytes):
            options.append(v)
    return options


def _tile_efficiency(tile: ConvTile, opg: int, hout: int, wout: int, cost: StepCost) -> float:
    """`_efficiency` of a tiled-kernel tile on an output of opg channels (per group) x hout x wout."""
    return _efficiency(tile.accumulators, tile.loads_per_step, (opg, hout, wout),
                       (ceil_to(opg, tile.channels), ceil_to(hout, tile.rows), ceil_to(wout, tile.cols)), cost)


def choose_tile(cout: int, hout: int, wout: int, reduction: int, batch: int, threads: int,
                facts: CpuFacts, groups: int = 1, cost: StepCost | None = None) -> ConvTile:
    """The register tile with the most real outputs per FMA slot (`_efficiency` at `cost`, by default the ISA's
    TILED_STEP_COSTS; the output padded to the tile: channels per group, rows, columns), ties to more
    accumulators, then to fewer loads per step. Several rows per tile only when a tile covers whole rows (narrow
    outputs)."""
    lanes, opg = facts.float32_lanes, cout // groups
    cost = cost or step_cost(facts)
    tasks_wanted = max(1, -(-threads // batch))

    def tiles():
        for v in _oc_vector_options(opg, groups, reduction, tasks_wanted, lanes, cost.panel_bytes,
                                    cost.max_oc_vectors):
            budget = tiled_accumulators(facts, v)
            for cols in range(1, min(wout, budget // v) + 1):
                for rows in range(1, min(hout, budget // (v * cols)) + 1) if cols == wout else [1]:
                    yield ConvTile(v, rows, cols, lanes)

    return max(tiles(), key=lambda t: (_tile_efficiency(t, opg, hout, wout, cost), t.accumulators,
                                       -t.loads_per_step))


def choose_row_tile(hout: int, wout: int, facts: CpuFacts, strided: bool = False) -> RowTile:
    """Depthwise: rows x vectors of columns with the most real outputs per FMA slot (the output rows and
    columns padded to the tile, a narrower vector counted as a part-filled one; a step loads each
    accumulator's input vector and one weight), ties to more accumulators, then to fewer padded columns, then
    to wider tiles. A strided conv reads each input vector as a gather whose
    temporaries take registers: one row per tile (measured on Zen 4: stride 2, 14 x 14 outputs, one row
    ran 1.13x faster than 2 and 7 rows).
    Stride 1 (`shared_taps`): the taps unrolled, so that a tile's rows share each input row's loads (R + KH - 1
    input rows loaded per column shift, not R * KH), at most `shared_tap_accumulators` accumulators (the
    input vectors in flight take the other registers): the tile that pads the fewest outputs, ties to more
    accumulators, then to more rows (more shared loads)."""
    full = facts.float32_lanes
    budget = max_accumulators(facts) if strided else shared_tap_accumulators(facts)
    tiles = (RowTile(rows, vectors, lanes, shared_taps=not strided)
             for lanes in _vector_lanes(full)
             for vectors in range(1, min(budget, -(-wout // lanes)) + 1)
             for rows in range(1, (1 if strided else min(hout, budget // vectors)) + 1))
    if strided:
        return max(tiles, key=lambda t: (
            _efficiency(t.accumulators, t.accumulators + 1, (hout, wout, t.lanes),
                        (ceil_to(hout, t.rows), ceil_to(wout, t.cols), full)),
            t.accumulators, -ceil_to(wout, t.cols), t.vectors))
    return max(tiles, key=lambda t: (  # the real share of the padded outputs, not per slot: too few for MIN_CHAINS
        _real_share((hout, wout, t.lanes), (ceil_to(hout, t.rows), ceil_to(wout, t.cols), full)),
        t.accumulators, t.rows, -ceil_to(wout, t.cols)))


def _real_share(real: tuple[int, ...], padded: tuple[int, ...]) -> float:
    """The share of a padded output that is real (1.0: no padding), rounded as `_efficiency` rounds."""
    share = 1.0
    for r, p in zip(real, padded):
        share *= r / p
    return round(share, 6)


def shared_tap_accumulators(facts: CpuFacts) -> int:
    """The most accumulators of a stride-1 depthwise tile (`RowTile.shared_taps`): the target ISA's step cost."""
    return step_cost(facts).shared_tap_accumulators


def channel_depthwise(cout: int, groups: int, facts: CpuFacts, strided: bool, wout: int | None = None) -> bool:
    """Whether a depthwise conv (one input channel per group) takes the tiled kernel's loop nest over vectors
    of channels (`depthwise_channels`): strided, one output channel per input channel, the channels whole
    vectors, on an ISA whose step cost says `channel_depthwise`. Its input is copied channels-last, so each tap
    of a tile's pixels is one contiguous vector load and the weights one vector per tap (a row of columns
    vectorized reads every second input column: a gather). Stride 1 too where the output has at most
    `channel_depthwise_columns` columns (`wout`): a row of 7 pads its last column vector. Measured on Zen 4
    (one 3x3 conv + ReLU, one thread, CPU time, columns -> channels, bit-identical): 960 on 7x7 0.064 -> 0.043
    ms (AVX-512), 0.076 -> 0.044 ms (AVX2 target), 320 on 7x7 0.030 -> 0.022 ms; wider rows tie or lose
    (AVX-512: 64 on 4x4 and 96 on 8x8 the same, 384 on 14x14 0.088 / 0.086, 576 on 14x14 0.104 / 0.112, 192
    on 28x28 0.121 / 0.140, 32 on 112x112 0.249 / 0.369 ms)."""
    cost = step_cost(facts)
    wanted = strided or (wout is not None and wout <= cost.channel_depthwise_columns)
    return wanted and cost.channel_depthwise and cout == groups and cout % facts.float32_lanes == 0


def choose_channel_tile(hout: int, wout: int, facts: CpuFacts, lanes: int | None = None,
                        fits=lambda tile: True) -> ConvTile:
    """`depthwise_channels`: rows x columns of pixels, one vector of channels, with the most real outputs
    per FMA slot (a step loads each accumulator's input vector and one weight vector), ties to more
    accumulators; among the tiles that `fits`. A vector of `lanes` channels, by default at most
    `channel_depthwise_lanes`: measured on Zen 4 (AVX-512, one conv + ReLU, one thread, CPU time, 16 -> 8
    channels a block, interleaved, bit-identical), 3x3/2 96 on 112x112 0.434 -> 0.359 ms, 144 on 56x56 0.155
    -> 0.138 ms (the input copy gathers 8 planes per pixel)."""
    cost, budget = step_cost(facts), tiled_accumulators(facts, 1)
    lanes = lanes or min(facts.float32_lanes, cost.channel_depthwise_lanes or facts.float32_lanes)
    tiles = [tile for rows in range(1, min(hout, budget) + 1) for cols in range(1, min(wout, budget // rows) + 1)
             if fits(tile := ConvTile(1, rows, cols, lanes))]
    return max(tiles, key=lambda t: (
        _efficiency(t.accumulators, t.accumulators + 1, (hout, wout),
                    (ceil_to(hout, t.rows), ceil_to(wout, t.cols)), cost), t.accumulators))


def _vector_lanes(full: int) -> list[int]:
    """The target's vector and its halves down to MIN_DEPTHWISE_LANES: a narrow output row (7 columns)
    pads to the narrower vector, its input copy and column gathers half as long."""
    return [full >> i for i in range(full.bit_length()) if full >> i >= min(full, MIN_DEPTHWISE_LANES)]


def channels_last_input(kernel: str, cpg: int, cout: int, kh: int, kw: int, strides, facts: CpuFacts) -> bool:
    """Whether the llvm schedule writes a conv's padded input [n, h, w, c]: a tiled conv on an ISA whose step
    cost says `taps_first`, unless strided with at most STRIDED_NCHW_CHANNELS input channels per group (`cpg`)
    and STRIDED_NCHW_MACS multiply-adds per input element."""
    if kernel != "tiled" or not step_cost(facts).taps_first:
        return False
    sh, sw = (int(s) for s in strides)
    return sh * sw == 1 or cpg > STRIDED_NCHW_CHANNELS or cout * kh * kw > STRIDED_NCHW_MACS * sh * sw


def flat_pixels(kh: int, kw: int, strides, padding, groups: int, facts: CpuFacts) -> bool:
    """Whether the llvm compute tiles this conv's pixels as one row (`conv2d_padded(flat=True)`): a dense
    1x1, stride-1, unpadded conv on a target whose step cost says `flat_pointwise`."""
    return (step_cost(facts).flat_pointwise and (kh, kw) == (1, 1) and groups == 1
            and all(int(s) == 1 for s in strides) and not any(int(p) for p in padding))


def subsampled_pixels(kh: int, kw: int, strides, padding, groups: int, cpg: int, cout: int,
                      facts: CpuFacts) -> bool:
    """Whether the llvm compute plans a strided 1x1 unpadded conv as `flat_pixels`' conv over the pixels it
    reads: x[n, c, h * sh, w * sw] (the `subsample` stage, inlined into the input copy: 1 / (sh * sw) of the
    input moved), then a 1x1 stride-1 conv over hout * wout pixels as one row. On a target whose step cost
    says `flat_pointwise` or `pixel_vectors`, for convs whose input `channels_last_input` copies channels-last
    (the shallow ones read x NCHW in place). Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU,
    kernels alone, strided tile -> this plan, bit-identical): ResNet-50's 256 -> 512 on 56x56 3.40 -> 2.52 ms
    (pointwise kernel; the strided tile padded 28 columns to 30), 512 -> 1024 on 28x28 3.08 -> 2.67 ms, 1024
    -> 2048 on 14x14 4.33 -> 3.10 ms (flat tiled: 2 x 5 pixels instead of 4 x 2 on 7 columns padded to 8);
    128 -> 64 on 56x56 0.41 -> 0.25 ms, 256 -> 96 on 28x28 0.25 -> 0.18 ms (read in place). On an Intel
    AVX-512 core (the same way): 256 -> 512 on 56x56 2.20 -> 1.32 ms (the pointwise kernel over its 784
    subsampled pixels; onnxruntime's Conv node 1.51). There `conv_plan` finds no pixel tile for 196 or 49
    pixels, so 512 -> 1024 on 28x28 and 1024 -> 2048 on 14x14 keep their strided tile."""
    cost = step_cost(facts)
    return ((cost.flat_pointwise or cost.pixel_vectors) and (kh, kw) == (1, 1) and groups == 1
            and any(int(s) > 1 for s in strides) and not any(int(p) for p in padding)
            and channels_last_input("tiled", cpg, cout, kh, kw, strides, facts))


def flat_taps(kh: int, kw: int, strides, groups: int, cpg: int, cout: int, facts: CpuFacts) -> bool:
    """Whether the llvm compute may tile the output pixels of a dense conv with a kernel larger than 1x1 as
    one row (`conv2d_padded(flat=True)`: pixel p reads the padded input at (p // wout * sh + r, p % wout * sw
    + s)), on a target whose step cost says `flat_taps_chains`: a tile then ends on the next output row
    instead of padding each row to whole tiles (28 -> 30 columns with AVX2's 2 x 6 tiles: 7% of the FMAs
    wasted). Stride 1, or strided where the input is copied channels-last (`channels_last_input`; the shallow
    strided convs read theirs NCHW). Measured on Zen 2 (AVX2, one conv + ReLU, one thread, CPU time, rows of
    tiles -> one row, bit-identical): 3x3 128 on 28x28 3.04 -> 2.79 ms, 512 on 7x7 3.86 -> 2.96 ms; 3x3/2
    128 on 56x56 2.68 -> 2.52 ms, 512 on 14x14 3.80 -> 3.13 ms (docs/cpu_speed.md)."""
    return (step_cost(facts).flat_taps_chains > 0 and (kh, kw) != (1, 1) and groups == 1
            and (all(int(s) == 1 for s in strides) or channels_last_input("tiled", cpg, cout, kh, kw, strides, facts)))


def pixel_vector_pointwise(kh: int, kw: int, strides, padding, groups: int, facts: CpuFacts) -> bool:
    """Whether a dense 1x1, stride-1, unpadded conv may take the pixel-vectorized kernel (`conv2d_pointwise`)
    on a target whose step cost says `pixel_vectors` without `flat_pointwise` (AVX-512): `conv_plan` then takes
    it where `choose_pixel_tile` finds a tile and `pointwise_narrowing_pixels` allows it, else the rows of
    tiles as before (no flat tiled plan)."""
    cost = step_cost(facts)
    return (cost.pixel_vectors and not cost.flat_pointwise and (kh, kw) == (1, 1) and groups == 1
            and all(int(s) == 1 for s in strides) and not any(int(p) for p in padding))


#: the fewest output pixels a narrowing conv takes the pixel kernel at for fitting L1 (`narrowing_keeps_tiles`)
NARROWING_L1_MIN_PIXELS = 28 * 28


def narrowing_keeps_tiles(cout: int, pixels: int, cpg: int, facts: CpuFacts) -> bool:
    """Whether a `pixel_vector_pointwise` conv keeps the tiled kernel for narrowing its channels (fewer outputs
    than inputs) on fewer than `pointwise_narrowing_pixels` pixels, unless its weights fit a `narrowing_l1_share`
    of the target's L1d. Measured on Zen 4 (AVX-512, 32 KiB L1d, one conv + ReLU alone, one thread, CPU time,
    tiled -> pixel vectors): 192 -> 32 on 28x28 0.134 -> 0.148 ms, 512 -> 128 on 28x28 1.02 -> 1.09 ms. On an
    Intel Xeon with AVX-512 (48 KiB L1d, 2 MiB L2; the same, 9 interleaved rounds; then single calls after an
    8 MiB write): MobileNetV2's 192 -> 32 on 28x28 (24 KiB of weights) 0.096 -> 0.085 (0.157 -> 0.140), 144 ->
    32 (18 KiB) 0.074 -> 0.063 (0.129 -> 0.114), ResNet-50's 512 -> 128 (256 KiB) 0.724 -> 0.762 (0.790 ->
    0.813), 512 -> 256 1.479 -> 1.499. Whole MobileNetV2 1.0 (one thread, CPU time, both builds in one process
    interleaved with onnxruntime): new / old 0.978x, 1.011x, 1.005x (9 rounds), 0.997x (21): within noise.
    Maps under NARROWING_L1_MIN_PIXELS keep the tiled kernel (not measured with the pixel kernel; and there the
    depthwise -> pointwise kernel, which declines a 1x1 the conv family runs on pixel vectors, won: MobileNetV3's
    1x88x4x4 dw -> 24 + residual fused 0.004 ms against 0.010 as a depthwise and a pixel-kernel 1x1)."""
    cost = step_cost(facts)
    if not (cout < cpg and pixels < cost.pointwise_narrowing_pixels):
        return False
    fits = (cost.narrowing_l1_share and pixels >= NARROWING_L1_MIN_PIXELS
            and cout * cpg * FLOAT_BYTES <= facts.l1d_bytes // cost.narrowing_l1_share)
    return not fits


def one_row_pixels(kh: int, kw: int, strides, padding, groups: int, cpg: int, cout: int, facts: CpuFacts) -> bool:
    """`conv_plan`'s `flat`: a stride-1 (`flat_pixels`, `pixel_vector_pointwise`) or subsampled
    (`subsampled_pixels`) 1x1 conv, or a conv with a larger kernel (`flat_taps`)."""
    return (flat_pixels(kh, kw, strides, padding, groups, facts)
            or pixel_vector_pointwise(kh, kw, strides, padding, groups, facts)
            or subsampled_pixels(kh, kw, strides, padding, groups, cpg, cout, facts)
            or flat_taps(kh, kw, strides, groups, cpg, cout, facts))


def _subsample(x, strides):
    """x[n, c, h * sh, w * sw]: the pixels a 1x1 unpadded conv of these strides reads (`subsampled_pixels`)."""
    n, c, h, w = dims(x.shape)
    sh, sw = (int(s) for s in strides)
    return te.compute((n, c, (int(h) - 1) // sh + 1, (int(w) - 1) // sw + 1),
                      lambda i, ch, y, xx: x[i, ch, y * sh, xx * sw], name="subsample")


def _pixels_tail(cout: int, pixels: int, reduction: int) -> bool:
    """Whether a flat conv whose H * W no pixel vector divides takes the pointwise kernel with a last tile
    past H * W (`conv2d_pointwise.padded_pixels`, peeled by LoopPartition): at most TAIL_MAX_REDUCTION input
    channels, no fewer output channels and at least TAIL_MIN_PIXELS pixels, where the tiled kernel's scalar
    NCHW stores weigh most. Measured
    on Zen 2 (AVX2, one thread, CPU time, conv + bias + ReLU, tiled -> pointwise): 16 -> 64 on 55x55 0.114 ->
    0.091 ms, 96 -> 96 on 55x55 0.755 -> 0.606 ms, 32 -> 128 on 27x27 0.093 -> 0.068 ms, 128 -> 512 on 27x27
    1.091 -> 0.999 ms, 64 -> 256 on 13x13 0.069 -> 0.060 ms, 128 -> 128 on 14x14 0.076 -> 0.071 ms; deeper or
    narrowing convs lose (ResNet-50's 1024 -> 256 on 14x14 1.21 -> 1.50 ms, 256 -> 1024 on 14x14 1.07 -> 1.27
    ms, 2048 -> 512 on 7x7 1.22 -> 2.05 ms; 96 -> 16 on 55x55 0.124 -> 0.147 ms); 64 -> 128 on 7x7 ties
    (0.012 ms)."""
    return reduction <= TAIL_MAX_REDUCTION and cout >= reduction and pixels >= TAIL_MIN_PIXELS


def pixel_tail(cout: int, pixels: int, tile: ConvTile, facts: CpuFacts) -> bool:
    """Whether a 1x1 conv that is not `flat_pointwise` (AVX-512) may take the pointwise kernel with a last
    partial vector of pixels (`choose_pixel_tile(tail=True)`): where its tiled `tile` would pad the output
    channels and whole vectors pad the pixels by at most PIXEL_TAIL_WASTE. Measured on an Intel Xeon with
    AVX-512 (one conv + ReLU, one thread, CPU time, tiled -> pointwise, bit-identical): SqueezeNet's 512 ->
    1000 on 13x13 1.437 -> 1.212 ms (onnxruntime 1.051; 169 pixels in 11 vectors), 256 -> 1000 on 13x13 0.657
    -> 0.545 (0.550); the whole of SqueezeNet 5.62 -> 5.47 and 5.11 -> 4.97 ms in two A/B runs (its head's
    pool then a kernel of its own: conv -> pool takes whole-plane kernels only). With any padding of the
    pixels, Inception v1 and v2 (1x1 convs to 16, 24, 112, 144 ... channels on 14x14 (6% padded) and 7x7
    (31%)) ran 1.1% and 2.1% slower (one A/B run, 9 rounds)."""
    lanes = facts.float32_lanes
    return cout % tile.channels != 0 and ceil_to(pixels, lanes) - pixels <= PIXEL_TAIL_WASTE * pixels


def choose_pixel_tile(cout: int, pixels: int, reduction: int, facts: CpuFacts,
                      tail: bool = False) -> PixelTile | None:
    """The pixel-vectorized tile (`conv2d_pointwise`) of a flat conv with `pixels` = H * W on an ISA whose
    step cost says `pixel_vectors`: the most real outputs per FMA slot (`_efficiency`, the output channels
    padded to whole chunks of the tile's rows: `padded_channels`, the pixels to whole tiles), ties to more
    accumulators, then to fewer loads; None when no pixel vector divides the pixels, unless `_pixels_tail`
    or `tail` (`conv_plan`: the tiled kernel would pad the output channels)."""
    cost = step_cost(facts)
    if not cost.pixel_vectors:
        return None
    best, best_key = None, None
    tiles = pixel_tiles(pixels, facts.float32_lanes, facts.vector_registers)
    if not tiles and (tail or _pixels_tail(cout, pixels, reduction)):
        tiles = pixel_tiles(pixels, facts.float32_lanes, facts.vector_registers, tail=True)
    for tile in tiles:
        padded = padded_channels(cout, tile.rows, reduction, pixels)
        key = (_efficiency(tile.accumulators, tile.loads_per_step, (cout, pixels),
                           (padded, padded_pixels(pixels, tile)), cost), tile.accumulators, -tile.loads_per_step)
        if best_key is None or key > best_key:
            best, best_key = tile, key
    return best


def conv_plan(n: int, cout: int, hout: int, wout: int, cpg: int, kh: int, kw: int, groups: int,
              facts: CpuFacts, strided: bool = False, flat: bool = False, pixels: bool = False) -> ConvPlan:
    """The kernel, tile and padded output of a conv for a target (`facts`); a pure function of the shape,
    so the compute and the schedule agree. `flat` (`flat_pixels`): the hout x wout pixels planned as one
    row of hout * wout when its tile has more real outputs per FMA slot than the best tile of rows (a tile
    of several pixels, several image rows and input channels: the schedule's tile loops are never unit
    loops). Measured on Zen 2 (AVX2, one thread, CPU time, one conv + ReLU): 1x1 2048 -> 512 on 7x7 2.09
    -> 1.48 ms (2 x 6 pixels, 49 padded to 54, instead of 4 x 2 with 7 columns padded to 8), 1024 -> 256 on
    14x14 1.48 -> 1.30 ms, 512 -> 1000 on 13x13 3.20 -> 2.86 ms; 16 -> 64 on 55x55, which 2 x 5 columns
    divide, ran 0.12 -> 0.13 ms flat (the epilogue's pixel addresses cost more in a 16-channel reduction).
    A flat conv takes the pointwise kernel wherever `choose_pixel_tile` finds a tile (its pixels whole
    tiles of vectors, or whole tiles past H * W for `_pixels_tail`'s shallow convs and for any conv whose
    output channels the flat tiled tile would pad: that tile's epilogue then runs under a channel predicate,
    scalar. Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU, tiled -> pointwise with a tail):
    SqueezeNet's 512 -> 1000 on 13x13 2.58 -> 1.95 ms (2 x 5 tile, 1000 padded to 1008; 512 -> 1024 ran
    2.02 ms tiled), 256 -> 1000 on 13x13 1.56 -> 0.94 ms, 512 -> 1000 on 14x14 2.83 -> 2.29 ms, 576 -> 120
    on 14x14 0.344 -> 0.317 ms; 576 -> 127 on 14x14 lost 0.325 -> 0.342 ms.
    `pixels` (`conv2d_pointwise.grouped_pointwise`): a grouped 1x1 conv, planned as GEMMs over pixel vectors
    (kernel "pixels") when its pixels padded to whole vectors waste less than its channels padded to them."""
    if pixels and (pixel_tile := pointwise.choose_group_tile(cout // groups, hout * wout, facts)) is not None:
        padding = ConvPadding(ceil_to(cout, pixel_tile.channels), 1, ceil_to(hout * wout, pixel_tile.cols))
        return ConvPlan("pixels", pixel_tile, padding)
    if cpg == 1 and groups > 1 and channel_depthwise(cout, groups, facts, strided, wout=wout):
        tile = choose_channel_tile(hout, wout, facts)
        padding = ConvPadding(1, ceil_to(hout, tile.rows), ceil_to(wout, tile.cols))
        return ConvPlan("depthwise_channels", tile, padding)
    if cpg == 1 and groups > 1:  # depthwise (any channel multiplier): one input channel per output
        tile = choose_row_tile(hout, wout, facts, strided=strided)
        padding = ConvPadding(cout // groups, ceil_to(hout, tile.rows), ceil_to(wout, tile.cols))
        return ConvPlan("depthwise", tile, padding)
    tile = choose_tile(cout, hout, wout, cpg * kh * kw, n, facts.threads, facts, groups)
    cost = step_cost(facts)
    if flat and hout > 1 and cpg > 1 and not cost.flat_pointwise:  # `pixel_vector_pointwise`, else rows of tiles
        narrowing = narrowing_keeps_tiles(cout, hout * wout, cpg, facts)
        pixels = None if narrowing or kh * kw > 1 else choose_pixel_tile(
            cout, hout * wout, cpg, facts, tail=pixel_tail(cout, hout * wout, tile, facts))
        if pixels is not None:
            return _pointwise_plan(cout, hout * wout, cpg, pixels)
    elif flat and hout > 1 and cpg > 1:
        if kh * kw > 1:  # `flat_taps`: its row tiles ranked at the chains it wants
            cost = replace(cost, min_chains=cost.flat_taps_chains)
        row = choose_tile(cout, 1, hout * wout, cpg * kh * kw, n, facts.threads, facts, groups, cost)
        pixels = None if kh * kw > 1 else choose_pixel_tile(cout, hout * wout, cpg, facts,
                                                             tail=cout % row.channels != 0)
        if pixels is not None:
            return _pointwise_plan(cout, hout * wout, cpg, pixels)
        opg = cout // groups
        if row.cols > 1 and _tile_efficiency(row, opg, 1, hout * wout, cost) > _tile_efficiency(tile, opg, hout, wout,
                                                                                               cost):
            padding = ConvPadding(ceil_to(opg, row.channels), 1, ceil_to(hout * wout, row.cols), row.channels)
            return ConvPlan("tiled", row, padding, flat=True, in_place=cout < FLAT_COPY_CHANNELS and kh * kw == 1)
    padding = ConvPadding(ceil_to(cout // groups, tile.channels), ceil_to(hout, tile.rows),
                          ceil_to(wout, tile.cols), tile.channels)
    return ConvPlan("tiled", tile, padding, chunk=reduction_chunk(tile, padding, cpg, kh, kw, groups, facts))


def reduction_chunk(tile: ConvTile, padding: ConvPadding, cpg: int, kh: int, kw: int, groups: int,
                    facts: CpuFacts) -> int:
    """The input channels per reduction chunk of a tiled conv (0: the whole reduction per tile). Each tile
    of pixels runs the whole reduction over its block of output channels, so a panel (the block's weights)
    larger than L1 comes back from L2 for every tile, and its first pass, from memory in a model whose
    weights do not stay in cache, has few FMAs per byte to hide the loads behind. Chunked, the block's
    accumulators stay in memory (L1, or L2 for a 1x1 conv's up to 1 / ACC_L2_SHARE of it) and every tile
    takes one chunk (a kernel row x `chunk` channels, a 1 / CHUNK_L1_SHARE of L1) before the next chunk:
    each weight is read once per block, by every tile in turn. Where the ISA's step cost says
    `chunked_reduction`, for one group, at least two tiles and a panel over half of L1.
    Measured on an Intel Xeon with AVX-512 (48 KiB L1d, 2 MiB L2; one conv + ReLU, one thread, per-call
    medians, one pass -> chunks of 64 channels; 1x1 convs bit-identical): ResNet-50's 1x1 2048 -> 512 on 7x7
    0.656 -> 0.594 ms (onnxruntime 0.623), 1024 -> 256 on 14x14 0.562 -> 0.530 (0.576), 512 -> 128 on 28x28
    0.711 -> 0.678 (0.665), 3x3 512 on 7x7 1.414 -> 1.407 (1.480); after an 8 MiB write (weights from L3) 0.693 ->
    0.679, 0.627 -> 0.575, 0.915 -> 0.745, 1.465 -> 1.383; after a 1 GiB write (from memory) 1.225 -> 1.173,
    1.108 -> 0.915, 1.760 -> 1.168, 2.437 -> 1.994 (2.069). Inside ResNet-50 (`kernels.py --in-model`) the
    convs on 7x7 and 14x14 ran 5-13% faster. Chunks of 32 / 128 / 256 channels: within noise of 64 on 1x1
    convs, 3x3 ones lost at 128 and 256. Lost: ResNet-50's 7x7 stem (its 112x112 accumulators, 1.37 ->
    2.38 ms), 3x3 64 on 56x56 (1.27 -> 1.34) and 128 on 28x28 (1.19 -> 1.24): accumulators beyond L1."""
    if groups > 1 or not step_cost(facts).chunked_reduction:
        return 0
    tiles = (padding.rows // tile.rows) * (padding.cols // tile.cols)
    block_bytes = tile.channels * FLOAT_BYTES  # one reduction step's weights
    accumulators = padding.rows * padding.cols * block_bytes
    if tiles < 2 or cpg * kh * kw * block_bytes <= facts.l1d_bytes // 2:
        return 0
    if accumulators > facts.l1d_bytes and (kh * kw > 1 or accumulators > facts.l2_bytes // ACC_L2_SHARE):
        return 0
    chunk = _factor(cpg, max(1, facts.l1d_bytes // CHUNK_L1_SHARE // block_bytes))
    return chunk if chunk < cpg or kh > 1 else 0


def _pointwise_plan(cout: int, pixels: int, cpg: int, tile: PixelTile) -> ConvPlan:
    """The pixel-vectorized kernel's plan: output channels padded to whole chunks, pixels to whole tiles."""
    padding = ConvPadding(padded_channels(cout, tile.rows, cpg, pixels), 1, padded_pixels(pixels, tile), tile.rows)
    return ConvPlan("pointwise", tile, padding, flat=True, in_place=pointwise.strips_in_place(cout, pixels, tile))


def _llvm_facts(target) -> CpuFacts:
    if target is None or target.kind.name != "llvm":
        raise FusionError("the llvm conv2d compute pads to the target's tile: call it with `target=` an llvm "
                          f"target (got {target})")
    return cpu_facts(target)


@register_compute(CONV_FAMILY, target="llvm")
def conv2d_llvm(x, w, b, residual=None, *, strides, padding, dilation, groups, fast_math=True, target=None,
                **attrs):
    """The conv2d_affine compute over the output padded to `conv_plan`'s tile for `target`; a bfloat16 conv on
    a target with AMX tiles: `conv2d_amx`; on one with AVX512-BF16 and no AMX: `conv2d_dpbf16`; a W packed by
    `pack_winograd` (`pack_conv`, where `conv2d_winograd.why_not` is None): `conv2d_winograd`."""
    cout = int(b.shape[0])  # W may be packed (pack_conv)
    facts = _llvm_facts(target)
    kw = {4: 3, 6: 2}.get(len(w.shape))  # OIHW, or packed by pack_amx
    epilogue = dict(activation=attrs.get("activation"), activation_params=attrs.get("activation_params"),
                    residual_after_activation=attrs.get("residual_after_activation", False), target=target)
    if kw is not None and amx.why_not(w.dtype, groups, int(x.shape[1]), int(w.shape[kw]), x.shape[0],
                                      target) is None:
        return amx.conv2d_amx(x, w, b, residual, strides=strides, padding=padding, dilation=dilation, **epilogue)
    if dpbf16.is_packed(w) or (len(w.shape) == 4 and dpbf16.why_not(w.dtype, groups, x.shape[0], target) is None):
        return dpbf16.conv2d_dpbf16(x, w, b, residual, strides=strides, padding=padding, dilation=dilation,
                                    **epilogue)
    if winograd.is_packed(w, x):
        return winograd.conv2d_winograd(x, w, b, residual, fast_math=fast_math, **epilogue)
    taps_first = step_cost(facts).taps_first
    taps = packed_taps(w.shape, taps_first)
    plan = plan_of(dims(x.shape), cout, taps, strides, padding, dilation, groups, facts)
    if plan.flat and tuple(taps[1:]) == (1, 1) and any(int(s) > 1 for s in strides):  # subsampled_pixels
        x, strides = _subsample(x, strides), (1, 1)
    if plan.kernel == "pixels":
        return pointwise.conv2d_grouped_pointwise(
            x, w, b, residual, groups=groups, out_padding=plan.padding, activation=attrs.get("activation"),
            activation_params=attrs.get("activation_params"),
            residual_after_activation=attrs.get("residual_after_activation", False), fast_math=fast_math,
            target=target)
    return conv2d_padded(x, w, b, residual, strides=strides, padding=padding, dilation=dilation, groups=groups,
                         activation=attrs.get("activation"), activation_params=attrs.get("activation_params"),
                         residual_after_activation=attrs.get("residual_after_activation", False),
                         fast_math=fast_math, target=target, out_padding=plan.padding, taps_first=taps_first,
                         flat=plan.flat, in_place=plan.in_place)


def plan_of(x_shape, cout: int, w_taps, strides, padding, dilation, groups: int, facts: CpuFacts) -> ConvPlan:
    """conv_plan of a conv with input `x_shape` (NCHW, the batch planned for as 1 when symbolic) and W
    [cout, *w_taps]."""
    n, _, hin, win = x_shape
    cpg, kh, kw = w_taps
    hout = conv2d_out_size(int(hin), kh, strides[0], padding[0], padding[2], dilation[0])
    wout = conv2d_out_size(int(win), kw, strides[1], padding[1], padding[3], dilation[1])
    return conv_plan(planned_batch(n), cout, hout, wout, cpg, kh, kw, groups, facts, strided=strides[1] > 1,
                     flat=one_row_pixels(kh, kw, strides, padding, groups, cpg, cout, facts),
                     pixels=pointwise.grouped_pointwise(kh, kw, strides, padding, groups, cpg))


def pack_conv(constants, attrs, shapes, target):
    """W [O, C/G, KH, KW]  ==>  Wp [O' / B, C/G, KH, KW, B] (`pack_channel_blocks`; B: the tile's output
    channels, O': the channels padded per group to the tile; [O' / B, KH, KW, C/G, B] where
    `packs_taps_first`), packed once at compile time so the kernel reads each reduction step's weights as one
    vector per `lanes` channels; None for the depthwise and grouped "pixels" kernels, which read W as it is.
    Bfloat16 convs on AMX / AVX512-BF16 and Winograd convs take their kernels' packings (`pack_amx`,
    `pack_dpbf16`, `pack_winograd`)."""
    w, b = constants
    x_shape = ConvOperands.of(shapes).x
    cin, kw = int(x_shape[1]), int(w.shape[3])
    if amx.why_not(w.dtype, attrs.get("groups", 1), cin, kw, x_shape[0], target) is None:
        return None if amx.folds(cin, kw) else [amx.pack_amx(w), b]  # a folded W is folded per call
    if dpbf16.why_not(w.dtype, attrs.get("groups", 1), x_shape[0], target) is None:
        return [dpbf16.pack_dpbf16(w), b]
    if winograd.why_not(x_shape, w.shape, w.dtype, attrs["strides"], attrs["padding"], attrs["dilation"],
                        attrs.get("groups", 1), target) is None:
        return [winograd.pack_winograd(w), b]
    plan = plan_of(x_shape, int(w.shape[0]), w.shape[1:], attrs["strides"], attrs["padding"],
                   attrs["dilation"], attrs.get("groups", 1), cpu_facts(target))
    if plan.kernel not in ("tiled", "pointwise"):  # depthwise broadcasts W per tap; "pixels" reads OIHW
        return None
    return [pack_channel_blocks(w, attrs.get("groups", 1), plan.padding.group_channels, plan.tile.channels,
                                taps_first=packs_taps_first(target)), b]


def scheduled_plan(sch, attrs, facts: CpuFacts) -> ConvPlan:
    """The plan `conv2d_llvm` computed the scheduled PrimFunc with: `plan_of` of its operands' shapes
    (x, [residual], W, b, out: `ConvOperands`), as the compute and `pack_conv` make it."""
    ops = ConvOperands.of(param.shape for param in sch.mod[sch.func_working_on].params[:-1])
    return plan_of(dims(ops.x), int(ops.b[0]), packed_taps(ops.w, step_cost(facts).taps_first), attrs["strides"],
                   attrs["padding"], attrs["dilation"], attrs.get("groups", 1), facts)


def planned_batch(n) -> int:
    """The batch a tile is chosen for: a symbolic batch as 1, so the tile must feed every thread then."""
    return int(n) if isinstance(n, (int, tirx.IntImm)) else 1


def _factor(extent: int, want: int) -> int:
    """The largest divisor of extent that is at most want."""
    return max(d for d in range(1, min(extent, want) + 1) if extent % d == 0)


def epilogue_by_channel_vectors(sch, epi, conv):
    """The epilogue of a tile whose last columns are padding, or whose columns are not whole vectors:
    pixels unrolled (the predicate on padded columns stays scalar), channels vectorized, so the accumulators
    stay in registers. A vectorized column loop under the predicate is scalarized with a variable index,
    which moves the whole tile to the stack (measured on Zen 4, one thread: a 3 -> 64 channel 3x3 stride-2
    conv with 111 output columns ran 1.66 ms with 14 padded columns that way, 0.68 ms this way; with
    3 exact columns 0.84 ms vectorized along the columns, 0.60 ms this way). Columns that are not a multiple
    of the vector width run a partial vector per channel (10 columns on AVX2: 8 + 2 lanes, 16 vectors of
    activation per 80 outputs, each gathered from the pixel-major accumulators), where the tile's channels
    are whole vectors (10 per 80): YOLOv8n's 3x3/2 3 -> 16 conv + SiLU on 320x320 (Zen 2, AVX2, one thread,
    CPU time) 1.47 -> 1.03 ms, the conv without activation 0.49 ms either way; the sums bit-identical."""
    shared = [sch.get(loop) for loop in sch.get_loops(conv)]
    own = [loop for loop in sch.get_loops(epi) if not any(sch.get(loop).same_as(s) for s in shared)]
    if not own:  # a unit region (one channel, one pixel): nothing to vectorize
        return
    channels, *pixels = own  # the epilogue's loops are (channel, row, column), unit ones gone
    if pixels:
        sch.reorder(*pixels, channels)
    for loop in pixels:
        sch.unroll(loop)
    sch.vectorize(channels)


def column_epilogue(tile: ConvTile, cost: StepCost) -> bool:
    """Whether a tile whose columns are all real runs its epilogue along them (`epilogue_by_columns`): whole
    vectors of columns, or (`StepCost.column_epilogue_share`) columns that fill enough of a vector."""
    return tile.cols % tile.lanes == 0 or 0 < cost.column_epilogue_share * tile.lanes <= tile.cols


def epilogue_by_columns(sch, epi, conv):
    """The epilogue of a tile whose columns are all real: channels unrolled (the accumulators read at
    constant places, so they stay in registers), columns vectorized (a partial vector where they are not
    whole vectors): each channel's row of the tile is one vector store, where the channel vectors' epilogue
    (`epilogue_by_channel_vectors`) stores each output element apart, to as many planes as the tile has
    channels. Planes a multiple of 4 KiB apart (224 x 224 or 160 x 160 floats) fall in one set of L1, so
    those element stores miss it. Measured on Zen 4 (AVX-512, one conv + ReLU, one thread, CPU time,
    channel vectors -> columns, interleaved, bit-identical; the input copy in blocks of channels both ways):
    VGG19's 3x3 3 -> 64 on 224x224 8.53 -> 2.71 ms (2 x 14 pixels; onnxruntime 1.9-2.7), 64 -> 64 43.1 ->
    38.0, YOLOv8n's 3x3/2 3 -> 16 on 320x320 0.535 -> 0.339 (20 columns: a vector and a quarter), ShuffleNet's
    3x3/2 stem 0.367 -> 0.290, MobileNetV2's 0.341 -> 0.307, ResNet-50's 7x7/2 stem 2.43 -> 2.29; with SiLU
    (activation on partial vectors too) YOLOv8n's stem 1.00 -> 0.52, VGG19's 9.16 -> 3.76; 3x3 convs of 64 or
    more input channels (14 or 10 columns) within 1% either way. Lost: 3 columns (a 3x3/2 3 -> 64 conv with
    111 output columns, 0.575 -> 0.640: `StepCost.column_epilogue_share`) and, built for AVX2 (`x86-64-v3`,
    8 lanes), YOLOv8n's stem with SiLU, 10 columns (0.655 -> 0.761; with ReLU 0.691 -> 0.623)."""
    shared = [sch.get(loop) for loop in sch.get_loops(conv)]
    own = [loop for loop in sch.get_loops(epi) if not any(sch.get(loop).same_as(s) for s in shared)]
    if not own:
        return
    *outer, columns = own  # (channel, row, column), unit ones gone
    for loop in outer:
        sch.unroll(loop)
    sch.vectorize(columns)


def _schedule_subsample(sch, subsample, inline: bool):
    """The strided pixels of a `subsampled_pixels` conv: read by the channels-last input copy of the tiled
    kernel (`inline`), else written NCHW first (1 / (sh * sw) of x, contiguous rows) for the pointwise
    kernel's strips or a tiled conv reading x in place. Measured on Zen 2 (AVX2, one thread, CPU time):
    ResNet-50's 1x1/2 256 -> 512 on 56x56 (pointwise) 3.56 -> 2.95 ms written first than read strided by
    the strips."""
    if inline:
        sch.compute_inline(subsample)
        return
    n, c, _, w = sch.get_loops(subsample)
    sch.parallel(sch.fuse(n, c))
    sch.vectorize(w)


def _schedule_pad(sch, pad, lanes: int, channels_last: bool = False, flat: bool = False):
    """`channels_last`: the padded input written [n, h, w, c] (for a reduction with channels innermost), one
    image row at a time, each row in blocks of `lanes` channels (the target's float32 vector; `_factor`: the
    largest divisor of the channels up to it), block by block along the row, one vector per pixel; `flat`:
    the input of a 1x1 conv (`flat_pixels`, `subsampled_pixels`), each pixel's channels written in blocks of
    COPY_CHANNELS, one vector each, parallel over rows x channel blocks.
    A pixel's whole channel row read at once touches a line of every input plane, and planes a multiple of
    4 KiB apart (224 x 224 floats: 49 pages) all fall in one set of L1: a row of VGG19's 64 planes on 224x224
    missed L1 on every read. Measured on Zen 4 (AVX-512, one conv + ReLU, one thread, CPU time, whole channel
    rows -> blocks of 16, interleaved, bit-identical): 3x3 64 on 224x224 50.1 -> 43.5 ms (the copy alone 8.9
    ms), 128 on 112x112 36.3 -> 35.6, ResNet-50's 3x3/2 128 on 56x56 2.26 -> 2.15, its other 3x3 convs and the
    stem within 2% (blocks of 32: 46.1 ms on 224x224; of 8: as 16); built for `x86-64-v3` (blocks of 8) on the
    same host: 45.2 -> 38.1 ms, 35.4 -> 34.7, 2.32 -> 2.25."""
    n, c, h, w = sch.get_loops(pad)
    if not channels_last:
        sch.parallel(sch.fuse(n, c))
        return
    sch.transform_layout(pad, ("write", 0), lambda n_, c_, h_, w_: (n_, h_, w_, c_))
    if not flat:
        co, ci = sch.split(c, [None, _factor(loop_extent(sch, c), lanes)])
        sch.reorder(n, h, co, w, ci)
        sch.parallel(sch.fuse(n, h))
        sch.vectorize(ci)
        return
    co, ci = sch.split(c, [None, _factor(loop_extent(sch, c), COPY_CHANNELS)])
    sch.reorder(n, h, co, w, ci)
    sch.parallel(sch.fuse(n, h, co))
    sch.vectorize(ci)


def _pack_weights(sch, conv, at_loop, reduction: int, lanes: int):
    """Copy the oc block's weights W[oc, rc, rh, rw] (the `weight` stage when the channels are padded) to a
    panel [rc, rh, rw, oc] at `at_loop`: the copy reads W rows contiguously (vectorized) and writes each
    element to its oc column."""
    panel = optional_block(sch, "weight")
    weight_index = len(sch.get(conv).reads) - 1  # reads are (input, weight)
    if panel is None and len(sch.get(conv).reads[weight_index].region) == 5:
        return  # packed at compile time (pack_conv): already [oc block, rc, rh, rw, oc]
    if panel is None:
        panel = sch.cache_read(conv, weight_index, "global")
    sch.compute_at(panel, at_loop)
    sch.transform_layout(panel, ("write", 0), lambda o, c, r, s: (c, r, s, o))
    oc, *taps = sch.get_loops(panel)[1:]  # unit loops (1x1 kernel, one input channel) are gone
    if not taps:
        return
    k = sch.fuse(*taps) if len(taps) > 1 else taps[0]
    ko, ki = sch.split(k, [None, _factor(reduction, lanes)])
    sch.reorder(ko, oc, ki)
    sch.vectorize(ki)


def schedule_tiled(sch, conv, epi, tile: ConvTile, regrouped: bool, padded_columns: bool, flat: bool = False,
                   tap_rows: bool = False, chunk: int = 0, cost: StepCost = StepCost()):
    """`regrouped`: the epilogue reads the padded channels of several groups (not an affine map of the
    block's channels), so the tile stores its accumulators and the epilogue runs as its own loop nest.
    `flat`: the conv's pixels are one row (`flat_pixels`), see `_schedule_flat` (and its `tap_rows`).
    `chunk` (`reduction_chunk`): per block of output channels the accumulators of all its pixels (the conv's
    local buffer, pixel-major) are zeroed, then for each kernel row and `chunk` input channels every tile of
    pixels loads its accumulators, runs the chunk's steps in registers and stores them back; the epilogue
    runs once over the block, vectorized along its columns."""
    if flat:
        _schedule_flat(sch, conv, epi, tile, tap_rows)
        return
    chunked = bool(chunk) and not regrouped
    if regrouped:
        store, later = sch.cache_write(conv, 0, "global"), epi
        sch.set_scope(conv, 0, "local")
        epi = store
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    reduction = loop_extent(sch, rc) * loop_extent(sch, rh) * loop_extent(sch, rw)
    oo, oi = sch.split(o, [None, tile.channels])
    ho, hi = sch.split(h, [None, tile.rows])
    wo, wi = sch.split(w, [None, tile.cols])
    # rc innermost of the reduction: each step reads a new input channel, so no broadcast stays live
    # across steps (with rw innermost LLVM reused them across taps and spilled the accumulators)
    if chunked:  # the chunks (kernel rows x blocks of channels) outside the tiles
        rco, rci = sch.split(rc, [None, chunk])
        sch.reorder(n, oo, rh, rco, ho, wo, rw, rci, hi, wi, oi)
    else:
        sch.reorder(n, oo, ho, wo, rh, rw, rc, hi, wi, oi)
    outer = sch.fuse(n, oo)
    sch.parallel(outer)
    _pack_weights(sch, conv, outer, reduction, tile.lanes)
    sch.reverse_compute_at(epi, outer if chunked else wo)
    # accumulators pixel-major, so each register holds `lanes` consecutive output channels
    sch.transform_layout(conv, ("write", 0), lambda n_, o_, h_, w_: (n_, h_, w_, o_))
    sch.set_scope(conv, 0, "local")
    sch.vectorize(oi)
    sch.unroll(wi)
    sch.unroll(hi)
    sch.decompose_reduction(conv, rh)  # after vectorize: the other order is "not compact dataflow"
    if regrouped or chunked:
        vectorize_own_inner_loop(sch, epi, conv)
    elif padded_columns or not column_epilogue(tile, cost):
        epilogue_by_channel_vectors(sch, epi, conv)
    elif tile.cols % tile.lanes:
        epilogue_by_columns(sch, epi, conv)
    else:
        vectorize_own_inner_loop(sch, epi, conv)
    if regrouped:
        n, o, h, w = sch.get_loops(later)
        sch.parallel(sch.fuse(n, o))
        sch.vectorize(w)


def _schedule_flat(sch, conv, epi, tile: ConvTile, tap_rows: bool = False):
    """A tiled conv whose pixels are one row (`flat_pixels`): the tiles follow the epilogue's loops, its rows
    and columns fused, and the conv is computed at each tile of pixels (a tile may end on a later image row,
    which a conv tile computed at the epilogue's column loop cannot).
    `tap_rows`: a kernel row's columns and input channels are one run of the channels-last input and of the
    taps-first W (KW > 1, dilation 1 along the width), so its rw and rc loops are fused into one (the same
    sums in the same order): a 3x3 conv's reduction runs 3 loops of 3 * C steps per tile instead of 9 of C, a
    7x7 stem's (3 channels) 7 of 21 instead of 49 of 3 (per tile, a third of the loop exits).
    Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU, two loops -> one, interleaved, bit-identical,
    on a host loaded by other jobs: times ~30% above quiet ones; three runs): ResNet-50's 3x3 64 on 56x56
    3.48 / 3.34 / 3.49 -> 3.48 / 3.31 / 3.37 ms, 128 on 28x28 3.41 / 3.46 / 3.36 -> 3.02 / 3.45 / 3.36 ms, 512
    on 7x7 4.42 / 4.58 / 4.31 -> 4.32 / 4.28 / 4.17 ms, 3x3/2 512 on 14x14 4.43 / 4.36 / 4.45 -> 4.29 / 4.88 /
    4.22 ms, Inception-v2's 3x3 96 on 28x28 1.85 / 1.97 -> 1.89 / 1.85 ms; the 7x7/2 stem 3.26 / 3.54 -> 3.25 /
    3.47 ms; VGG19's 3x3 512 on 14x14 12.53 -> 12.60 ms (one run)."""
    width = loop_extent(sch, sch.get_loops(epi)[3])
    # one pixel iterator, so the epilogue reads conv[.., p] (h and w relaxed apart would not bound a tile)
    sch.transform_block_layout(epi, lambda n_, o_, h_, w_: (n_, o_, h_ * width + w_))
    n, o, p = sch.get_loops(epi)
    oo, oi = sch.split(o, [None, tile.channels])
    po, pi = sch.split(p, [None, tile.cols])
    sch.reorder(n, oo, po, pi, oi)
    outer = sch.fuse(n, oo)
    sch.parallel(outer)
    sch.compute_at(conv, po)
    shared = len(sch.get_loops(epi)) - 2  # the epilogue's tile loops (pi, oi) are not the conv's
    # the conv's own loops; unit ones (one row, a 1x1 kernel or its rows: `flat_taps`) are gone
    co, cw, rc, *taps = sch.get_loops(conv)[shared:]
    reduction = loop_extent(sch, rc)
    for loop in taps:
        reduction *= loop_extent(sch, loop)
    _pack_weights(sch, conv, outer, reduction, tile.lanes)
    sch.reorder(*taps, rc, cw, co)  # the tiled kernel's reduction order: taps, then channels innermost
    if tap_rows:  # rw (the last tap loop: KW > 1) and the channels, one contiguous run
        rc, taps = sch.fuse(taps[-1], rc), taps[:-1]
    sch.transform_layout(conv, ("write", 0), lambda n_, o_, h_, w_: (n_, h_, w_, o_))
    sch.set_scope(conv, 0, "local")
    sch.vectorize(co)
    sch.unroll(cw)
    sch.decompose_reduction(conv, taps[0] if taps else rc)
    sch.unroll(pi)
    sch.vectorize(oi)


def _schedule_depthwise(sch, conv, epi, pad, tile: RowTile):
    """`depthwise`: parallel over (image, channel), each channel's padded plane written inside its task, where
    its taps read it (144 on 56x56: 0.309 -> 0.289 ms, one thread; smaller planes the same). The epilogue runs
    per tile, or per row of tiles where the last column tile ends in padding: per tile, its real columns
    would vary from tile to tile, and a vector loop under that predicate runs one lane at a time, which an
    activation with exp pays for per element (measured on Zen 4, AVX-512, 3x3 conv + SiLU, 4 x 1 tiles, per
    tile -> per row: 144 on 56x56 0.654 -> 0.375 ms, 5x5 240 on 28x28 0.448 -> 0.234; with ReLU 0.176 ->
    0.164 and the same)."""
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    ragged = loop_extent(sch, sch.get_loops(epi)[-1]) % tile.cols != 0 and loop_extent(sch, w) > tile.cols
    ho, hi = sch.split(h, [None, tile.rows])
    wo, wv, wl = sch.split(w, [None, tile.vectors, tile.lanes])
    sch.reorder(n, o, ho, wo, rc, rh, rw, hi, wv, wl)
    task = sch.fuse(n, o)
    sch.parallel(task)
    if pad is not None:
        sch.compute_at(pad, task)
        sch.vectorize(sch.get_loops(pad)[-1])
    sch.reverse_compute_at(epi, ho if ragged else wo)
    sch.set_scope(conv, 0, "local")
    sch.vectorize(wl)
    sch.unroll(wv)
    sch.unroll(hi)
    if tile.shared_taps:
        sch.unroll(rw)
        sch.unroll(rh)
    sch.decompose_reduction(conv, rc)
    vectorize_own_inner_loop(sch, epi, conv)


def _schedule_depthwise_channels(sch, conv, epi, pad, tile: ConvTile, padded_columns: bool):
    """`depthwise_channels`: the tiled kernel's loop nest (`schedule_tiled`, one vector of channels), its
    padded input written channels-last per block of channels inside the parallel loop (its copy still in
    cache when the block's taps read it; each copied vector of channels gathers one pixel of 8 planes).
    Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU, column vectors -> this, bit-identical):
    ShuffleNet's 3x3/2 112 on 56x56 0.244 -> 0.121 ms, 136 on 28x28 0.081 -> 0.041 ms, 272 on 14x14 0.051 ->
    0.023 ms; EfficientNet's 3x3/2 64 on 16x16 0.014 -> 0.010 ms, 5x5/2 96 on 8x8 0.017 -> 0.008 ms. The
    whole input copied channels-last first (a parallel loop over its rows) ran 0.22, 0.063 and 0.026 ms on
    ShuffleNet's three; the copy inside the block without vectorizing its channels 0.117, 0.064, 0.030 ms."""
    sch.transform_layout(pad, ("write", 0), lambda n_, c_, h_, w_: (n_, h_, w_, c_))
    schedule_tiled(sch, conv, epi, tile, regrouped=False, padded_columns=padded_columns)
    outer = sch.get_loops(conv)[0]
    sch.compute_at(pad, outer)
    c, *pixels = sch.get_loops(pad)[1:]  # the block's channels, then its rows and columns (unit ones gone)
    if pixels:
        sch.reorder(*pixels, c)
    sch.vectorize(c)


@register_schedule(CONV_FAMILY, target="llvm", pack=pack_conv)
def schedule_conv2d_llvm(sch, attrs, target):
    if optional_block(sch, amx.AMX_BLOCK) is not None:
        return amx.schedule_amx(sch)
    if optional_block(sch, dpbf16.DOT_BLOCK) is not None:
        return dpbf16.schedule_dpbf16(sch)
    if optional_block(sch, winograd.GEMM_BLOCK) is not None:
        return winograd.schedule_winograd(sch, target)
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    planned = scheduled_plan(sch, attrs, cpu_facts(target))
    if planned.kernel == "pixels":  # grouped 1x1: GEMMs over pixel vectors, their own loop nest
        pointwise.schedule_grouped_pointwise(sch, conv, epi, optional_block(sch, "pad"), planned.tile)
        return
    _, *loops = sch.get_loops(conv)
    cp, hp, wp, rc, rh, rw = (loop_extent(sch, loop) for loop in loops)
    cout, hout, wout = (loop_extent(sch, loop) for loop in sch.get_loops(epi)[1:])
    groups, facts, plan = attrs.get("groups", 1), cpu_facts(target), planned
    flat = plan.flat
    p = plan.padding
    if (cp, hp, wp) != (groups * p.group_channels, p.rows, p.cols):
        raise FusionError(f"conv2d llvm schedule: the conv stage computes {cp}x{hp}x{wp} outputs per image, "
                          f"the plan for {target} pads {cout}x{hout}x{wout} to "
                          f"{groups * p.group_channels}x{p.rows}x{p.cols}: build the PrimFunc with the llvm "
                          "compute (registry.get_compute(name, 'llvm')) under the same target")
    subsample = optional_block(sch, "subsample")
    if subsample is not None:
        _schedule_subsample(sch, subsample, inline=plan.kernel == "tiled" and not plan.in_place)
    pad = optional_block(sch, "pad")
    if pad is None and plan.kernel == "depthwise_channels":  # unpadded: x copied channels-last all the same
        pad = sch.cache_read(conv, 0, "global")
    channels_last = channels_last_input(plan.kernel, rc, cout, rh, rw, attrs["strides"], facts)
    if pad is not None and plan.kernel not in ("pointwise", "depthwise_channels", "depthwise"):
        _schedule_pad(sch, pad, facts.float32_lanes, channels_last=channels_last,
                      flat=flat and rh * rw == 1)  # `flat_taps` copies the image's rows
    if plan.kernel == "depthwise_channels":
        _schedule_depthwise_channels(sch, conv, epi, pad, plan.tile, padded_columns=wp != wout)
    elif plan.kernel == "depthwise":
        _schedule_depthwise(sch, conv, epi, pad, plan.tile)
    elif plan.kernel == "pointwise":
        schedule_pointwise(sch, conv, epi, plan.tile, facts.threads)
    else:
        schedule_tiled(sch, conv, epi, plan.tile, regrouped=groups > 1 and cp != cout,
                       padded_columns=wp != (hout * wout if flat else wout), flat=flat,
                       tap_rows=channels_last and rw > 1 and int(attrs["dilation"][1]) == 1, chunk=plan.chunk,
                       cost=step_cost(facts))
