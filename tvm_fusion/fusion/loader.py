"""Where rules come from: the built-in tables (fixed order), user files, and installed plugins."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tvm_fusion.errors import FusionError
from tvm_fusion.rules import RuleSet, may_hold_rules, rules_in_module
from tvm_fusion.patterns import builtin_rules

__all__ = ["load_rules", "load_rules_for"]

ENTRY_POINT_GROUP = "tvm_fusion.rules"


def load_rules(path) -> RuleSet:
    """The rules defined in a Python file (its Rule objects, in definition order), or in every module of a
    folder (`rule_modules`: a family with its kernel and its test, as the built-in families are found)."""
    path = Path(path)
    if not path.exists():
        raise FusionError(f"{path}: no such rules file")
    if path.is_dir():
        return _load_folder(path)
    return _load_file(path)


def rule_modules(folder: Path) -> list[Path]:
    """The modules of a folder that may hold rules, by name: every .py but tests (test_*.py, *_test.py,
    conftest.py) and private modules (_*.py)."""
    return sorted(p for p in folder.glob("*.py") if may_hold_rules(p.stem))


def _load_folder(folder: Path) -> RuleSet:
    rules = RuleSet()
    for path in rule_modules(folder):
        rules = rules + _module_rules(path)  # a helper module beside the rules adds none
    if not len(rules):
        raise FusionError(f"--rules {folder}: a directory whose modules define no rules (give a Python file of "
                          f"rules, e.g. my_rules.py, or a folder of them)")
    return rules


def _load_file(path: Path) -> RuleSet:
    rules = _module_rules(path)
    if not len(rules):
        raise FusionError(f"{path}: defines no rules (declare them with @tvm_fusion.rule(...))")
    return rules


def _module_rules(path: Path) -> RuleSet:
    """The rules a Python file defines (none: an empty set), each built now so a broken one names its file."""
    if path.suffix != ".py":
        raise FusionError(f"--rules {path}: not a Python file (expected a .py file defining @tvm_fusion.rule)")
    name = f"tvm_fusion_user_rules_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FusionError(f"--rules {path}: Python cannot load it as a module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except FusionError as err:
        raise FusionError(f"{path}: {err}") from None
    except Exception as err:
        raise FusionError(f"{path}: failed to load rules: {type(err).__name__}: {err}") from None
    rules = RuleSet()
    for r in rules_in_module(module):
        r.source = str(path)
        rules.add(r)
        _ = r.spec  # build the pattern now, so a broken rule fails here, naming file and rule
    return rules


def _plugin_rules() -> RuleSet:
    from importlib.metadata import entry_points

    rules = RuleSet()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = ep.load()  # a module of rules, like the built-in tables
        except Exception as err:
            raise FusionError(f"rules plugin {ep.name!r} ({ep.value}) failed to load: "
                              f"{type(err).__name__}: {err}") from None
        for r in rules_in_module(module):
            rules.add(r)
    return rules


def load_rules_for(files=(), only=None, disable=None, plugins: bool = True) -> RuleSet:
    """Built-in tables (with their computes and schedules), then plugins, then `files`; then `only` /
    `disable` applied."""
    rules = builtin_rules()
    if plugins:
        rules = rules + _plugin_rules()
    for f in files or ():
        rules = rules + load_rules(f)
    return rules.select(only=only, disable=disable)
