"""The built-in rule families, one per module of this package, found by a scan (`families()`, in name order;
`*_test` modules and the helpers that define no rule aside). `builtin_rules()` loads the built-in computes
and schedules first (`schedules.load()`), then every family: the RuleSet it returns is ready to fuse. A
family module may register its own compute and schedules too; a new family is a new module here (and its
`*_test.py` beside it), nothing lists it. Priorities order the rules, not the scan (`priority.py`).
"""

from __future__ import annotations

import importlib
import pkgutil

from tvm_fusion import schedules
from tvm_fusion.rules import RuleSet, may_hold_rules, rules_in_module


def families() -> list[str]:
    """The modules of this package that may hold rules, by name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__, f"{__name__}.")
                  if not m.ispkg and may_hold_rules(m.name.rsplit(".", 1)[-1]))


def builtin_rules() -> RuleSet:
    schedules.load()
    rules = RuleSet()
    for name in families():
        for r in rules_in_module(importlib.import_module(name)):
            rules.add(r)
    return rules
