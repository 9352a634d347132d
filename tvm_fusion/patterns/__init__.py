"""The built-in rule tables, one family per file, loaded in this fixed order by `builtin_rules()`, which
also loads the built-in computes and schedules they lower to: the RuleSet it returns is ready to fuse."""

from __future__ import annotations

import importlib

from tvm_fusion.rules import RuleSet, rules_in_module
from tvm_fusion import schedules

TABLES = (
    "tvm_fusion.patterns.attention",
    "tvm_fusion.patterns.se",
    "tvm_fusion.patterns.conv_epilogue",
    "tvm_fusion.patterns.dense_epilogue",
    "tvm_fusion.patterns.batch_matmul",
    "tvm_fusion.patterns.norm",
    "tvm_fusion.patterns.elementwise",
    "tvm_fusion.patterns.qdq",
)


def builtin_rules() -> RuleSet:
    schedules.load()
    rules = RuleSet()
    for name in TABLES:
        for r in rules_in_module(importlib.import_module(name)):
            rules.add(r)
    return rules
