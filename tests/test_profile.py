"""`profile`: per-kernel times before/after fusion, the traffic model, what to fuse next, the HTML report.

Two models: a small one whose Abs -> Sin -> Cos chain no rule takes (profiled through the CLI, read back
from its JSON), and SqueezeNet (through the Python API). The page is rendered in headless Chromium.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion.cli import main
from tvm_fusion.profile.measure import SCHEMA_VERSION, profile

SHAPE = [1, 8, 32, 32]
TENSOR_BYTES = int(np.prod(SHAPE)) * 4


def chain_model(path):
    """Conv(+bias) -> Relu -> Abs -> Sin -> Cos -> Mul -> Add -> Tanh: the rules take conv..relu and
    mul..tanh; Abs -> Sin -> Cos is an elementwise chain no rule's pattern covers."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "B"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(0.25, np.float32), "quarter")]
    ops = [("Conv", ["x", "W", "B"], "conv"), ("Relu", ["c"], "relu"), ("Abs", ["r"], "abs"), ("Sin", ["a"], "sin"),
           ("Cos", ["s"], "cos"), ("Mul", ["k", "half"], "mul"), ("Add", ["m", "quarter"], "add"),
           ("Tanh", ["p"], "tanh")]
    outs = ["c", "r", "a", "s", "k", "m", "p", "y"]
    nodes = [helper.make_node(op, ins, [out], name=name, **({"pads": [1, 1, 1, 1]} if op == "Conv" else {}))
             for (op, ins, name), out in zip(ops, outs)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The CLI run on the chain model: (stdout, JSON data, HTML path)."""
    d = tmp_path_factory.mktemp("chain")
    model = chain_model(d / "chain.onnx")
    out_json, out_html = d / "p.json", d / "p.html"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["profile", str(model), "--repeat", "3", "--modes", "unfused,fused,tvm", "--json", str(out_json),
                   "--html", str(out_html)])
    assert rc == 0
    return buf.getvalue(), json.loads(out_json.read_text()), out_html


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory):
    from tvm_fusion.examples import example_path

    report = profile(example_path("squeezenet"), repeat=2)
    html_path = tmp_path_factory.mktemp("squeezenet") / "report.html"
    report.write_html(html_path)
    return report, html_path


def test_chain_is_the_first_candidate_with_its_saving(chain):
    _, data, _ = chain
    chains = [c for c in data["candidates"] if c["kind"] == "elementwise chain"]
    assert [c["onnx_nodes"] for c in chains] == [["abs", "sin", "cos"]]
    c = chains[0]
    assert c["bytes_saved"] == 2 * 2 * TENSOR_BYTES  # abs and sin outputs: one write + one read each
    assert c["launches_saved"] == 2 and 0 < c["seconds_saved"] <= c["measured_s"]
    assert any("no rule's pattern covers" in r for r in c["reasons"])


def test_chain_groups_before_after(chain):
    out, data, _ = chain
    groups = {g["rule"]: g for g in data["groups"]}
    assert sorted(groups) == ["conv2d_bias_relu", "elementwise_chain_3"]
    conv = groups["conv2d_bias_relu"]
    # unfused: conv2d, bias add, relu; the conv and bias-add outputs no longer go to memory
    assert (conv["before_launches"], conv["after_launches"], conv["launches_removed"]) == (3, 1, 2)
    assert conv["bytes_saved"] == 2 * 2 * TENSOR_BYTES
    assert [i["shape"] for i in conv["intermediates"]] == [SHAPE, SHAPE]
    ew = groups["elementwise_chain_3"]
    assert (ew["before_launches"], ew["bytes_saved"], sorted(ew["onnx_nodes"])) == (3, 2 * 2 * TENSOR_BYTES,
                                                                                    ["add", "mul", "tanh"])
    # the fused kernel still reads its input and writes its output (the two scalars are constants)
    assert ew["reads"] >= TENSOR_BYTES and ew["writes"] == TENSOR_BYTES
    assert conv["flops"] >= 2 * 8 * 8 * 9 * int(np.prod(SHAPE[2:])) * 1  # 2 per multiply-add of the conv
    assert "fusion saved 0.262 MB of memory traffic and 4 launches per inference" in out  # 8 x 32 KiB


def test_every_unfused_kernel_names_its_onnx_node(chain):
    _, data, _ = chain
    sites = data["builds"]["unfused"]["sites"]
    assert all(s["onnx_nodes"] for s in sites)
    assert sorted({n for s in sites for n in s["onnx_nodes"]}) == sorted(
        ["conv", "relu", "abs", "sin", "cos", "mul", "add", "tanh"])


def test_json_schema(chain):
    _, data, _ = chain
    assert data["schema"] == SCHEMA_VERSION
    assert sorted(data["builds"]) == ["fused", "tvm", "unfused"]
    assert set(data) >= {"model", "target", "device", "repeat", "peaks", "builds", "groups", "candidates",
                         "declined", "totals", "counts"}
    assert set(data["peaks"]) >= {"bandwidth", "flops", "ridge", "source"}
    for b in data["builds"].values():
        assert set(b) >= {"latency_s", "kernel_time_s", "overhead_per_call_s", "sites", "kernels", "calls"}
        for s in b["sites"]:
            assert set(s) >= {"kernel", "origin", "onnx_nodes", "reads", "writes", "flops", "median_s", "times_s"}
            assert len(s["times_s"]) == data["repeat"]
        assert abs(sum(k["share"] for k in b["kernels"]) - 1) < 1e-6
    for g in data["groups"]:
        assert set(g) >= {"rule", "kernel", "onnx_nodes", "before_s", "after_s", "before_launches",
                          "after_launches", "intermediates", "bytes_saved", "reads", "writes", "flops",
                          "roofline_fraction"}


def test_squeezenet_every_group_has_before_after_and_traffic(squeezenet):
    report, _ = squeezenet
    assert len(report.groups) == sum(report.counts.values()) == 26
    for g in report.groups:
        assert g.before_s > 0 and g.after_s > 0, g
        # conv2d, bias add, relu (and a conv -> pool group's pool) -> one kernel
        assert g.before_launches == (4 if g.rule == "conv2d_relu_pool" else 3) and g.after_launches == 1
        assert g.bytes_saved == 2 * sum(i["bytes"] for i in g.intermediates) > 0
        assert g.reads > 0 and g.writes > 0 and g.flops > 0
    # a conv -> pool group where the target's conv plan pools whole planes (AVX2's tiled classifier with its
    # global pool; AVX-512 runs it as the pixel-vectorized 1x1 and keeps the stem's 1.5 MiB planes apart)
    assert sum(g.rule == "conv2d_relu_pool" for g in report.groups) == report.counts["conv2d_relu_pool"]
    # every kernel call of the unfused build is accounted to some ONNX node
    assert all(s.onnx_nodes for s in report.builds["unfused"].sites)


def test_squeezenet_totals_are_consistent(squeezenet):
    report, _ = squeezenet
    data = report.to_json()
    assert data["totals"]["bytes_saved"] == sum(g.bytes_saved for g in report.groups)
    assert data["totals"]["launches_removed"] == sum(g.launches_removed for g in report.groups)
    unfused, fused = (data["builds"][m] for m in ("unfused", "fused"))
    # each unfused call belongs to at most one group, each group is at least one fused call; the calls outside
    # the groups depend on the target's plans (an AVX-512 plan may add a copy kernel), so no bound on them
    assert sum(g.before_launches for g in report.groups) <= unfused["calls"]
    assert len(report.groups) <= sum(g.after_launches for g in report.groups) <= fused["calls"]
    assert all(g.before_launches >= g.after_launches >= 1 for g in report.groups)
    assert re.fullmatch(r"fusion saved \d+\.\d+ MB of memory traffic and \d+ launches per inference",
                        report.summary())
    json.dumps(data)


def test_profile_needs_both_builds(capsys, tmp_path):
    rc = main(["profile", str(chain_model(tmp_path / "m.onnx")), "--modes", "fused"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs the unfused and fused builds" in err


def test_page_without_dot_says_so(squeezenet, monkeypatch, tmp_path):
    from tvm_fusion.profile.html import render

    report, _ = squeezenet
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    page = render(report)
    assert 'id="graph-missing"' in page and "dot program was not found" in page
    assert 'id="chart-time"' in page and 'id="chart-roofline"' in page


# ---------------------------------------------------------------- the page in a real browser
def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _png_pixels(data: bytes) -> np.ndarray:
    """RGB(A) 8-bit PNG -> array (height, width, channels); stdlib only."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8 and color in (2, 6), header
    ch = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * ch)
    out = np.zeros((height, width * ch), np.int32)
    prev = np.zeros(width * ch, np.int32)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros_like(line)
        for x in range(len(line)):
            a = cur[x - ch] if x >= ch else 0
            b, c = prev[x], (prev[x - ch] if x >= ch else 0)
            if f == 4:  # Paeth
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            else:
                pred = (0, a, b, (a + b) // 2)[f]
            cur[x] = (line[x] + pred) & 0xFF
        out[y], prev = cur, cur
    return out.reshape(height, width, ch)


def test_page_renders_in_headless_chromium(squeezenet, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium not found on PATH (Debian: apt-get install chromium)")
    report, page = squeezenet
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    env = {**os.environ, "HOME": str(tmp_path)}
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=400,300", page.as_uri()],
                   check=True, capture_output=True, timeout=60, env=env)
    pixels = _png_pixels(shot.read_bytes())[..., :3]
    non_white = (pixels < 240).any(axis=-1).mean()
    assert pixels.shape[:2] == (300, 400) and non_white > 0.01, f"blank screenshot ({non_white:.2%} ink)"
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], check=True, capture_output=True,
                         timeout=60, env=env, text=True).stdout
    assert dom.count('class="cluster"') == len(report.groups) == sum(report.counts.values())
    assert 'id="chart-time"' in dom and dom.count('class="bar"') == 2 * len(report.groups)
    assert 'id="chart-roofline"' in dom and 'class="roof"' in dom and dom.count('class="point fused"') > 0
    assert report.summary() in dom


def test_cuda_without_a_gpu_says_so(capsys, tmp_path):
    from tvm_fusion.check.compare import gpu_available

    if gpu_available()[0]:
        pytest.skip("a GPU is present: this checks the message without one")
    rc = main(["profile", str(chain_model(tmp_path / "m.onnx")), "--target", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs a GPU to time kernels on" in err


def test_page_outlines_the_candidate_chain_and_the_declined_match(chain):
    from tvm_fusion.profile.html import CANDIDATE_COLOR, DECLINED_COLOR

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot not found on PATH (Debian: apt-get install graphviz)")
    _, data, page = chain
    html = page.read_text()
    assert html.count('class="cluster"') == len(data["groups"]) == 2
    assert html.count(f'stroke="{CANDIDATE_COLOR}"') == 3  # abs, sin, cos
    assert html.count(f'stroke="{DECLINED_COLOR}"') == len({d["onnx_node"] for d in data["declined"]}) >= 1
    assert "no rule&#x27;s pattern covers" in html or "no rule's pattern covers" in html


def test_a_kernel_tvms_fuseops_made_names_the_nodes_of_all_its_ops(chain):
    """Abs -> Sin -> Cos, which no rule takes, is one kernel of TVM's FuseOps in the fused build: it names the
    three nodes (traced through the legalized module), not only its last consumer's."""
    _, data, _ = chain
    merged = [s for s in data["builds"]["fused"]["sites"] if s["group"] is None and "sin" in s["kernel"]]
    assert [s["onnx_nodes"] for s in merged] == [["abs", "sin", "cos"]], merged


def test_chain_peak_activation_memory_from_tvms_plan(chain):
    """Each build's peak activation memory is TVM's memory plan (tests/test_memory.py works the plans out): the
    chain's intermediates reuse two storages unfused and fused alike, TVM's FuseOps makes one kernel; each
    group's conv / bias-add (mul / add) outputs would take two storages of the plan if unfused."""
    out, data, page = chain
    peaks = {m: b["memory"]["peak_bytes"] for m, b in data["builds"].items()}
    assert peaks == {"unfused": 3 * TENSOR_BYTES, "fused": 3 * TENSOR_BYTES, "tvm": TENSOR_BYTES}
    assert data["builds"]["unfused"]["memory"]["storages"] == [TENSOR_BYTES, TENSOR_BYTES]
    assert {g["rule"]: (g["storage_before"], g["storage_after"], g["storage_saved"]) for g in data["groups"]} == {
        "conv2d_bias_relu": (2 * TENSOR_BYTES, 0, 2 * TENSOR_BYTES),
        "elementwise_chain_3": (2 * TENSOR_BYTES, 0, 2 * TENSOR_BYTES)}
    lines = out.splitlines()
    start = lines.index("peak activation memory (TVM's static memory plan: reused storages + outputs; inputs and "
                        "weights not counted):")
    assert lines[start + 1:start + 4] == [
        "  unfused  0.098 MB (2 storages 0.066 MB for 8 tensors + outputs 0.033 MB)",
        "  fused    0.098 MB (2 storages 0.066 MB for 2 tensors + outputs 0.033 MB)",
        "  tvm      0.033 MB (0 storages 0.000 MB for 0 tensors + outputs 0.033 MB)"]
    assert ("peak activation memory (TVM's memory plan): unfused 0.098 MB, fused 0.098 MB, tvm 0.033 MB; fused saves "
            "0.000 MB against unfused") in lines
    html = page.read_text()
    assert 'id="memory"' in html and "<td>unfused</td><td>0.098</td><td>2</td><td>0.066</td><td>8</td>" in html
    assert "peak saved MB" in html and html.count("<td>0.07</td></tr>") >= 2  # each group's last column


def test_profile_at_a_precision(tmp_path, capsys):
    """`profile --precision bf16` converts the float32 model first, as compare does: the kernels take bfloat16
    tensors, the report says so, and the profile compare prints to follow up keeps the flag."""
    from tvm_fusion.testing import conv_bn_relu

    model = tmp_path / "conv.onnx"
    onnx.save(conv_bn_relu(cin=16, cout=32, hw=(16, 16)), str(model))
    assert main(["profile", str(model), "--repeat", "1", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "precision bf16 (converted from float32)" in out.splitlines()[0]
    report = profile(str(model), repeat=1, precision="bf16")
    assert report.precision == "bf16" and report.counts["conv2d_bn_relu"] == 1
    assert main(["compare", str(model), "--repeat", "0", "--precision", "bf16", "--modes", "fused"]) == 0
    assert "tvm-fusion profile" in (hint := capsys.readouterr().out) and "--precision bf16" in hint
