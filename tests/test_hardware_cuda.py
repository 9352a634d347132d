"""hardware.cuda_facts: launch limits and SM counts by arch, and the schedules sizing their grids by them."""

import pytest

from tvm_fusion._tvm import cuda_target
from tvm_fusion.hardware import CUDA_ARCHS, cuda_facts
from tvm_fusion.schedules.cuda.conv2d import ConvShape, pick_tiles


@pytest.mark.parametrize("arch,sms,optin_kib", [("sm_80", 108, 163), ("sm_86", 72, 99), ("sm_89", 58, 99),
                                                ("sm_90", 132, 227), ("sm_100", 148, 227)])
def test_known_archs(arch, sms, optin_kib):
    f = cuda_facts(cuda_target(arch))
    assert (f.known, f.sm_count, f.shared_optin_bytes, f.shared_static_bytes) == (True, sms, optin_kib * 1024, 49152)
    assert f.gpu_limits()["max_threads_per_block"] == 1024 and f.gpu_limits()["max_shared_memory_per_block"] == 49152
    assert f.gpu_limits(dynamic_shared=True)["max_shared_memory_per_block"] == optin_kib * 1024


@pytest.mark.parametrize("arch,version", [("sm_80", 80), ("sm_90a", 90), ("sm_120", 120), ("no arch", -1)])
def test_sm_version(arch, version):
    from tvm_fusion.hardware import cuda_sm_version

    assert cuda_sm_version(arch) == version


def test_suffixed_arch_has_its_base_limits():
    assert cuda_facts("sm_90a") == CUDA_ARCHS["sm_90"]


def test_unknown_arch_is_conservative_and_says_so():
    f = cuda_facts("sm_61")
    assert not f.known and f.shared_optin_bytes == f.shared_static_bytes == 48 * 1024
    assert f.sm_count <= min(a.sm_count for a in CUDA_ARCHS.values())
    assert "sm_61 is not in tvm_fusion.hardware.CUDA_ARCHS" in f.note and "conservative" in f.note


def test_conv_grid_follows_the_sm_count():
    """A late ResNet-50 layer (7x7, 512 -> 2048): the tiles keep at least one block per SM of the GPU."""
    s = ConvShape(n=1, groups=1, cpg=512, opg=2048, oh=7, ow=7, kh=1, kw=1, sh=1, sw=1, dh=1, dw=1)

    def blocks(arch):
        t = pick_tiles(s, cuda_facts(arch))
        return -(-s.opg // t.oc_tile) * -(-s.oh // t.h_threads) * -(-s.ow // t.w_tile)

    assert blocks("sm_89") >= 58 and blocks("sm_100") >= 148
    assert blocks("sm_89") < blocks("sm_100")  # a smaller GPU gets bigger tiles
