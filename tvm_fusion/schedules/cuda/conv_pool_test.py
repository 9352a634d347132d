"""CUDA conv_pool: the fused group compiles for sm_90 (nvcc) within the arch's limits, one kernel, for max,
average and global pools, half types and a symbolic batch; the plan's halo recompute; the shared-memory
bound declines with its reason. Nothing runs (no GPU here)."""

from __future__ import annotations

import pytest

from tvm_fusion.build.builder import resolve_target
from tvm_fusion.frontend.importer import SymDim
from tvm_fusion.patterns.conv_pool_test import conv_pool
from tvm_fusion.schedules.conv_pool import PoolWindow
from tvm_fusion.schedules.cuda.conv_pool import pool_tile, supports
from tvm_fusion.testing import as_float16, check_cuda_build

ONE = {"conv2d_bn_relu_pool": 1}


@pytest.mark.parametrize("pool", ["max3s2p1", "avg3s2ceil", "avg3s1p1_incl", "gap"])
def test_cuda_build_compiles(pool, rules):
    built = check_cuda_build(conv_pool(pool), rules, expect=ONE)
    assert built.kernel_calls == 1, built.kernel_calls


def test_half_and_symbolic_batch_compile(rules):
    check_cuda_build(as_float16(conv_pool("max2s2")), rules, expect=ONE)
    check_cuda_build(conv_pool("avg2s2", n="N"), rules, expect=ONE, shapes={"x": (SymDim("N"), 5, 11, 13)})


def test_stem_tile_recomputes_its_halo():
    """The stem's 3x3/2 pool: a tile of 4 x 8 pool outputs reads 9 x 17 conv outputs and advances by 8 x 16."""
    window = PoolWindow("max", (3, 3), (2, 2), (1, 1, 1, 1), (56, 56))
    tile = pool_tile(window, (112, 112), 64)
    assert (tile.channels, tile.rows, tile.cols, tile.conv_rows, tile.conv_cols) == (4, 4, 8, 9, 17)
    assert tile.halo_recompute(window) == pytest.approx(9 * 17 / (8 * 16) - 1, abs=1e-4)


def test_a_plane_too_large_for_shared_memory_declines():
    attrs = dict(strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, pool_kind="global")
    why = supports(attrs, [(1, 64, 64, 64), (256, 64, 1, 1), (256,)], resolve_target("cuda", "sm_90"))
    assert why.startswith("the pool tile's conv outputs (128 channels x 64 x 64) need 2097152 bytes of shared "
                          "memory; the limit is"), why
