"""CPU targets as the hosts really are: features from /proc/cpuinfo text of machines we do not have,
TVM_FUSION_CPU, every form of --target, and the hardware facts schedules read from a target."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import te, tvm
from tvm_fusion.build.builder import default_cpu_target, resolve_target
from tvm_fusion.cli import main
from tvm_fusion.cpu_features import (cache_model, features_from_cpuinfo, host_cache_sizes, host_features,
                                    missing_features, parse_cache_model)
from tvm_fusion.errors import FusionError
from tvm_fusion.hardware import DEFAULT_CACHES, OTHER_CACHES, cpu_facts

codegen = tvm.target.codegen

_X86_BASE = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
             "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid "
             "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
             "aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse "
             "3dnowprefetch osvw topoext invpcid_single ssbd ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep "
             "bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero "
             "xsaveerptr rdpru wbnoinvd arat umip vaes vpclmulqdq rdpid fsrm")
_AVX512 = ("avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 gfni "
           "avx512_vnni avx512_bitalg avx512_vpopcntdq")


def _x86(model: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"


def _arm(features: str) -> str:
    return f"processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: {features}\nCPU implementer\t: 0x41\n\n"


# (name, /proc/cpuinfo text, the CPU name LLVM detects there, triple, features that must be on / off)
HOSTS = [
    ("zen4 with AVX-512", _x86("AMD EPYC 9R14", f"{_X86_BASE} {_AVX512}"), "znver4", None,
     ["avx512f", "avx512bw", "avx512vl", "avx2", "fma"], []),
    ("zen4, AVX-512 hidden by the hypervisor", _x86("AMD EPYC 9R14", _X86_BASE), "znver4", None,
     ["avx2", "fma", "avx"], ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512vnni", "avx512bf16"]),
    ("zen3", _x86("AMD EPYC 7R13", _X86_BASE), "znver3", None, ["avx2", "fma"], ["avx512f"]),
    ("intel client, no AVX-512", _x86("12th Gen Intel(R) Core(TM) i7-12700", f"{_X86_BASE} avx_vnni"), "alderlake",
     None, ["avx2", "fma", "avxvnni"], ["avx512f", "avx512vl"]),
    ("sapphire rapids, AMX hidden", _x86("Intel(R) Xeon(R) Platinum 8488C", f"{_X86_BASE} {_AVX512} avx512_fp16"),
     "sapphirerapids", None, ["avx512f", "avx512fp16"], ["amx-tile", "amx-int8", "amx-bf16"]),
    ("graviton2", _arm("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
                       "dcpop asimddp ssbs"), "neoverse-n1", "aarch64-linux-gnu", ["neon", "dotprod"], ["sve"]),
    ("graviton3", _arm("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
                       "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca "
                       "pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng"), "neoverse-v1", "aarch64-linux-gnu",
     ["neon", "sve", "i8mm", "bf16"], ["sve2"]),
]


@pytest.mark.parametrize("name,cpuinfo,mcpu,triple,on,off", HOSTS, ids=[h[0] for h in HOSTS])
def test_target_carries_what_the_host_exposes(name, cpuinfo, mcpu, triple, on, off):
    target = _tvm.cpu_target(2, cpuinfo=cpuinfo, mcpu=mcpu, mtriple=triple)
    assert target.attrs["mcpu"] == mcpu
    features = set(codegen.llvm_get_cpu_features(target))
    assert set(on) <= features, f"{name}: {sorted(set(on) - features)} missing"
    assert not set(off) & features, f"{name}: {sorted(set(off) & features)} enabled but not exposed"
    assert codegen.llvm_cpu_has_features(on, target)
    # nothing the code may use is missing from the host it was made for
    available = features_from_cpuinfo(cpuinfo, triple or "x86_64")
    assert missing_features(features, available, triple or "x86_64") == []


def test_the_hidden_avx512_host_gets_mattr_and_avx2_facts():
    target = _tvm.cpu_target(2, cpuinfo=HOSTS[1][1], mcpu="znver4")
    assert "-avx512f" in list(target.attrs["mattr"])
    facts = cpu_facts(target)
    assert (facts.isa, facts.float32_lanes, facts.vector_registers) == ("avx2", 8, 16)


def test_the_host_target_uses_nothing_this_host_lacks():
    target = default_cpu_target()
    available = host_features()
    if available is None:
        pytest.skip("this host's /proc/cpuinfo cannot be read")
    assert missing_features(_tvm.target_cpu_features(target), available) == []


@pytest.mark.parametrize("spec,isa,lanes,registers", [
    ({"kind": "llvm", "mcpu": "znver4"}, "avx512", 16, 32),
    ({"kind": "llvm", "mcpu": "x86-64-v3"}, "avx2", 8, 16),
    ({"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512f"]}, "avx2", 8, 16),
    ({"kind": "llvm", "mcpu": "x86-64"}, "sse", 4, 16),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, "neon", 4, 32),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, "neon", 4, 32),
])
def test_cpu_facts_come_from_the_target(spec, isa, lanes, registers):
    facts = cpu_facts(tvm.target.Target({**spec, "num-cores": 3}))
    assert (facts.isa, facts.float32_lanes, facts.vector_registers, facts.threads) == (isa, lanes, registers, 3)


def _sysfs(root, caches):
    """A fake /sys/devices/system/cpu/cpu0/cache: (level, type, size) per index directory."""
    for i, (level, kind, size) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    return root


@pytest.mark.parametrize("caches,expected", [
    ([(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"), (3, "Unified", "491520K")],
     {"l1d": 48 * 1024, "l2": 2048 * 1024}),
    ([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")],
     {"l1d": 32 * 1024, "l2": 1024 * 1024}),
    ([(1, "Data", "64K"), (2, "Unified", "1M")], {"l1d": 64 * 1024, "l2": 1024 * 1024}),  # AArch64 style
    ([(1, "Data", "32K"), (2, "Unified", "")], {"l1d": 32 * 1024}),  # an unreadable size is left out
])
def test_host_cache_sizes_are_read_from_sysfs(tmp_path, caches, expected):
    assert host_cache_sizes(_sysfs(tmp_path, caches)) == expected


def test_no_sysfs_means_no_cache_sizes(tmp_path):
    assert host_cache_sizes(tmp_path / "absent") is None


def test_cache_model_round_trips_and_ignores_other_models():
    sizes = {"l1d": 48 * 1024, "l2": 2048 * 1024}
    assert cache_model(sizes) == "l1d=48K,l2=2048K"
    assert parse_cache_model(cache_model(sizes)) == sizes
    assert parse_cache_model("L1D=32k, l2=1M") == {"l1d": 32 * 1024, "l2": 1024 * 1024}
    assert parse_cache_model("rasp4b") == {} and parse_cache_model("l2=lots") == {} and parse_cache_model("") == {}


@pytest.mark.parametrize("caches", [{"l1d": 32 * 1024, "l2": 1024 * 1024}, {"l1d": 48 * 1024, "l2": 2048 * 1024}])
def test_cache_sizes_travel_in_the_target_to_its_facts(caches):
    """cpu_target writes the caches into the target's `model`; the facts read them from the target, so a
    library built for that machine on another one is planned for that machine's caches."""
    target = _tvm.cpu_target(2, cpuinfo=HOSTS[0][1], mcpu="znver4", caches=caches)
    assert target.attrs["model"] == cache_model(caches)
    again = tvm.target.Target(target.export())  # as a JSON target travels (TVM_FUSION_CPU, --target)
    facts = cpu_facts(again)
    assert (facts.l1d_bytes, facts.l2_bytes) == (caches["l1d"], caches["l2"])


@pytest.mark.parametrize("spec,caches", [
    ({"kind": "llvm", "mcpu": "znver4"}, DEFAULT_CACHES["avx512"]),
    ({"kind": "llvm", "mcpu": "x86-64-v3"}, DEFAULT_CACHES["avx2"]),
    ({"kind": "llvm", "mcpu": "x86-64-v3", "model": "rasp4b"}, DEFAULT_CACHES["avx2"]),
    ({"kind": "llvm", "mcpu": "znver4", "model": "l2=512K"}, (DEFAULT_CACHES["avx512"][0], 512 * 1024)),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, OTHER_CACHES),
])
def test_a_target_naming_no_caches_gets_its_isa_defaults(spec, caches):
    facts = cpu_facts(tvm.target.Target(spec))
    assert (facts.l1d_bytes, facts.l2_bytes) == caches


def test_the_host_target_carries_the_host_caches():
    sizes = host_cache_sizes()
    if sizes is None:
        pytest.skip("this host's caches cannot be read from sysfs")
    target = _tvm.cpu_target()
    assert parse_cache_model(target.attrs["model"]) == sizes
    facts = cpu_facts(target)
    assert facts.l1d_bytes == sizes.get("l1d", facts.l1d_bytes) and facts.l2_bytes == sizes.get("l2", facts.l2_bytes)


@pytest.mark.parametrize("spec,kind,mcpu", [
    ("llvm", "llvm", None),
    ("cuda", "cuda", None),
    ('{"kind": "llvm", "mcpu": "x86-64-v3"}', "llvm", "x86-64-v3"),
    ({"kind": "llvm", "mcpu": "skylake"}, "llvm", "skylake"),
    ("aws/cpu/c5.12xlarge", "llvm", "cascadelake"),
    ("nvidia/nvidia-h100", "cuda", None),
    ("c", "c", None),
])
def test_resolve_target_accepts_every_tvm_form(spec, kind, mcpu):
    target = resolve_target(spec)
    assert target.kind.name == kind
    if mcpu:
        assert target.attrs["mcpu"] == mcpu


@pytest.mark.parametrize("spec,why", [
    ("bogus", 'Target kind "bogus" is not defined'),
    ("llvm -mcpu=x86-64-v3", "CLI target string form"),
    ('{"kind": "llvm", "mcpu": "znver99"}', "LLVM knows no CPU 'znver99'"),
    ('{"kind": "llvm",', "Expecting"),
])
def test_bad_target_is_one_line_naming_the_forms(spec, why):
    with pytest.raises(FusionError) as err:
        resolve_target(spec)
    message = str(err.value)
    assert why in message and "a JSON dict such as" in message and "a tag such as" in message
    assert "\n" not in message


def test_cli_bad_target_exits_2_with_one_line(capsys):
    assert main(["compare", "--example", "resnet50", "--target", "llvm -mcpu=znver4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: target 'llvm -mcpu=znver4' is not a TVM target") and err.count("\n") == 1


def test_tvm_fusion_cpu_replaces_the_host(monkeypatch):
    monkeypatch.setenv("TVM_FUSION_CPU", json.dumps({"kind": "llvm", "mcpu": "x86-64-v3"}))
    target = resolve_target("llvm")
    assert target.attrs["mcpu"] == "x86-64-v3" and cpu_facts(target).isa == "avx2"
    assert resolve_target("cuda").kind.name == "cuda"  # only the CPU default changes
    monkeypatch.setenv("TVM_FUSION_CPU", "aws/cpu/c5.12xlarge")
    assert resolve_target("cpu").attrs["mcpu"] == "cascadelake"


@pytest.mark.parametrize("value,why", [("nvidia/nvidia-h100", "must be an llvm target"),
                                       ("x86-64-v3", "TVM_FUSION_CPU 'x86-64-v3' is not a TVM target")])
def test_tvm_fusion_cpu_errors_name_the_variable(monkeypatch, value, why):
    monkeypatch.setenv("TVM_FUSION_CPU", value)
    with pytest.raises(FusionError, match=why):
        resolve_target("llvm")


def test_the_host_target_keeps_the_process_cores_after_tvm_pins_its_thread(monkeypatch):
    """TVM's thread pool pins the calling thread to one core once it has run a kernel on two threads, so
    os.sched_getaffinity(0) says 1 from then on; the host target made after that still has the cores this
    process may use (plans choose their tiles for that many parallel tasks)."""
    if _tvm.HOST_CORES < 2:
        pytest.skip("this process may run on one core only: nothing for TVM's pool to pin")
    monkeypatch.delenv("TVM_FUSION_CPU", raising=False)
    before = os.sched_getaffinity(0)
    a = te.placeholder((64, 256), name="a")
    b = te.compute((64, 256), lambda i, j: a[i, j] * 2, name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    lib = tvm.compile(sch.mod, target=resolve_target("llvm"))
    x, y = (tvm.runtime.tensor(np.ones((64, 256), "float32")) for _ in range(2))
    config = tvm.get_global_func("runtime.config_threadpool")
    try:
        config(1, 2)
        lib(x, y)
        target = resolve_target("llvm")
        assert int(target.attrs["num-cores"]) == _tvm.HOST_CORES == len(before)
        assert cpu_facts(target).threads == _tvm.HOST_CORES
    finally:
        config(1, int(os.environ.get("TVM_NUM_THREADS", "1")))
        os.sched_setaffinity(0, before)
    np.testing.assert_array_equal(y.numpy(), 2 * np.ones((64, 256), "float32"))
