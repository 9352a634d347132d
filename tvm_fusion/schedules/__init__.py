"""Built-in TE computes (this package) and their schedules per target (`cuda/`, `llvm/`).

`load()` imports every module of the package (its own first, then `cuda/` and `llvm/`, each in name order;
`*_test` modules aside): registration happens in those imports, once. A new compute or schedule is a new
module here; nothing lists it.
"""

import importlib
import pkgutil

from tvm_fusion._tvm import tirx
from tvm_fusion.rules import may_hold_rules


def modules() -> list[str]:
    """The package's modules in load order: this package's own, then each subpackage's, by name."""
    found = [m.name for m in pkgutil.walk_packages(__path__, f"{__name__}.")
             if not m.ispkg and may_hold_rules(m.name.rsplit(".", 1)[-1])]
    return sorted(found, key=lambda name: (name.count("."), name))


def dims(shape) -> list:
    """A TE shape as ints, except a symbolic dim (a symbolic batch: the outermost), which stays a PrimExpr."""
    return [int(d) if isinstance(d, (int, tirx.IntImm)) else d for d in shape]


def load() -> None:
    for name in modules():
        importlib.import_module(name)
