"""fuse.match hands FuseOpsByPattern only the patterns whose ops the module calls (fuse.needed_ops): what each
pattern needs, and the same groups with the filter as without it."""

from __future__ import annotations

import numpy as np

from tvm_fusion.fusion import fuse
from tvm_fusion._tvm import dpl
from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.testing import GraphBuilder


def test_needed_ops_of_alternatives_calls_and_tuples():
    x = dpl.wildcard()
    conv = dpl.is_op("relax.nn.conv2d")(x, dpl.is_const())
    biased = dpl.is_op("relax.add")(conv, dpl.is_const())
    relu_or_sigmoid = dpl.is_op("relax.nn.relu")(biased) | dpl.is_op("relax.sigmoid")(biased)
    assert fuse.needed_ops(relu_or_sigmoid) == {"relax.nn.conv2d", "relax.add"}  # neither activation is needed
    assert fuse.needed_ops(dpl.is_tuple_get_item(dpl.is_op("relax.nn.batch_norm")(x, x, x, x, x), 0)) == \
        {"relax.nn.batch_norm"}
    assert fuse.needed_ops(biased.has_dtype("float16")) == {"relax.nn.conv2d", "relax.add"}
    assert fuse.needed_ops(x) == frozenset()


def test_the_filter_leaves_the_groups_as_they_were(rules, monkeypatch):
    """A conv net with an LSTM after it: the groups and counts with the filter equal those without it."""
    g = GraphBuilder(4)
    x = g.input("x", [1, 3, 8, 8])
    y = g.op("Relu", [g.conv(x, 3, 8)])
    y = g.op("Reshape", [y, g.const(np.array([8, 1, 64], np.int64))])  # 8 steps of 64 features
    w = g.const(g.rng.normal(0, 0.2, (1, 16, 64)).astype(np.float32))
    r = g.const(g.rng.normal(0, 0.2, (1, 16, 4)).astype(np.float32))
    y = g.op("LSTM", [y, w, r], n_out=2, hidden_size=4)[1]
    mod = import_onnx(g.model([y]))
    filtered = build(mod, "llvm", "fused", rules=rules)
    monkeypatch.setattr(fuse, "needed_ops", lambda pattern, memo=None: frozenset())
    unfiltered = build(mod, "llvm", "fused", rules=rules)
    assert filtered.counts == unfiltered.counts and filtered.counts["conv2d_bias_relu"] == 1
    assert [gr.rule for gr in filtered.fused.groups] == [gr.rule for gr in unfiltered.fused.groups]
