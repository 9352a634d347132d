"""Layering you can see: the package's stages import downwards only.

Every module of tvm_fusion is parsed (ast: imports at the top, inside functions, and the module names its
import tables give importlib as strings); each import of one of our modules must reach its own stage or a
lower one. A new upward import fails here, naming the module, the line, the import and the rule. A
function-local import of our modules says why it is not at the top (`# local: ...`), except in the modules
that load stages on use by design (LAZY).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "tvm_fusion"

#: the stages, lowest first: a module imports modules of its own stage and of the stages below it
STAGES = ("base", "kernels", "frontend", "fusion", "build", "check", "deploy", "profile", "entry")

#: module (or package: everything under it; tvm_fusion itself is the facade alone) -> stage; the longest prefix wins
PLACES = {
    # what every stage stands on: TVM's API, errors, console, hardware facts, dtypes, the rule API and the
    # compute / schedule registry, and the runtime a deployed library runs on
    **{f"tvm_fusion.{m}": "base" for m in ("_tvm", "errors", "console", "quiet", "cpu_features", "hardware",
                                           "precision", "rules", "registry", "runtime")},
    "tvm_fusion.schedules": "kernels",  # TE computes and their schedules (the frontend's recurrence uses them)
    "tvm_fusion.frontend": "frontend",
    "tvm_fusion.fusion": "fusion",
    "tvm_fusion.patterns": "fusion",  # the built-in rule tables
    "tvm_fusion.build": "build",
    "tvm_fusion.check": "check",
    "tvm_fusion.examples": "check",  # example models, with onnxruntime's outputs to calibrate them
    "tvm_fusion.deploy": "deploy",
    "tvm_fusion.profile": "profile",
    "tvm_fusion": "entry",  # the facade (tvm_fusion/__init__.py)
    "tvm_fusion.__main__": "entry",
    "tvm_fusion.cli": "entry",
    "tvm_fusion.testing": "entry",
}

#: (importer, imported) -> why this upward import is allowed
ALLOWED: dict = {}

#: modules whose function-local imports are their design, not a workaround
LAZY = {
    "tvm_fusion": "the facade loads a stage when a name of it is used (PEP 562); the runtime pulls in no compiler",
    "tvm_fusion.cli": "a command imports its stage when it runs: --help and bad arguments answer without TVM",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if not p.stem.endswith("_test")}


def stage_of(module: str) -> str | None:
    for prefix in sorted(PLACES, key=len, reverse=True):
        if module == prefix or (prefix != "tvm_fusion" and module.startswith(prefix + ".")):
            return PLACES[prefix]
    return None


def _resolve(module: str, is_package: bool, node: ast.ImportFrom, known) -> list[str]:
    """The modules of ours an ImportFrom reaches: `from pkg import sub` reaches pkg.sub when that is a module."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target != "tvm_fusion" and not target.startswith("tvm_fusion."):
        return []
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    rest = [a for a in node.names if f"{target}.{a.name}" not in known]
    return subs + ([target] if rest else [])


def imports_of(module: str, source: str, is_package: bool, known) -> list[tuple[str, int, bool, str]]:
    """(imported module, line, function-local, source line) for each import of our modules in `source`; a
    string constant naming one of our modules (an import table for importlib) counts as a top-level import."""
    tree = ast.parse(source)
    lines = source.splitlines()
    local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == "tvm_fusion"]
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(module, is_package, node, known)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known - {"tvm_fusion"}:
            targets = [node.value]
        else:
            continue
        text = " ".join(lines[node.lineno - 1:node.end_lineno]).strip()
        found += [(t, node.lineno, id(node) in local, text) for t in targets]
    return found


def violations(sources: dict[str, tuple[str, str, bool]], known) -> list[str]:
    """Each upward import, each module without a stage, and each unexplained function-local import of
    `sources` ({module: (path, source, is_package)})."""
    order = {s: i for i, s in enumerate(STAGES)}
    out = []
    for module, (path, source, is_package) in sorted(sources.items()):
        stage = stage_of(module)
        if stage is None:
            out.append(f"{path}: module {module} has no stage: put it in a stage package, or name it in PLACES")
            continue
        for target, line, is_local, text in imports_of(module, source, is_package, known):
            to = stage_of(target)
            if to is None or target == module:
                continue
            if order[to] > order[stage] and (module, target) not in ALLOWED:
                out.append(f"{path}:{line}: {module} ({stage}) imports {target} ({to}): `{text}`; a stage imports "
                           f"only its own and lower stages ({' < '.join(STAGES)}): move the shared code down, "
                           f"or the caller up")
            if is_local and module not in LAZY and "# local:" not in text:
                out.append(f"{path}:{line}: {module} imports {target} inside a function: `{text}`; import it at "
                           f"the top, or say why it must wait (`# local: <reason>` on that line)")
    return out


def _sources() -> dict[str, tuple[str, str, bool]]:
    return {m: (str(p.relative_to(ROOT)), p.read_text(), p.name == "__init__.py") for m, p in our_modules().items()}


def test_no_stage_imports_a_higher_one():
    sources = _sources()
    assert len(sources) > 100, "the package's modules were not found"
    problems = violations(sources, set(sources))
    assert not problems, "\n".join(problems)


def test_the_check_catches_an_upward_and_an_unexplained_local_import():
    known = set(_sources())
    fake = {"tvm_fusion.frontend.fake": ("tvm_fusion/frontend/fake.py", (
        "from tvm_fusion.build.builder import build\n"
        "from ..check import io\n"
        "def f():\n"
        "    from tvm_fusion.frontend.simplify import front_door\n"
        "    from tvm_fusion.rules import RuleSet  # local: a reason\n"), False),
        "tvm_fusion.stray": ("tvm_fusion/stray.py", "", False)}
    problems = violations(fake, known | set(fake))
    assert len(problems) == 4, "\n".join(problems)
    assert problems[0].startswith("tvm_fusion/frontend/fake.py:1: tvm_fusion.frontend.fake (frontend) imports "
                                  "tvm_fusion.build.builder (build)")
    assert "tvm_fusion.check.io (check)" in problems[1]
    assert "tvm_fusion.frontend.simplify inside a function" in problems[2]
    assert problems[3].startswith("tvm_fusion/stray.py: module tvm_fusion.stray has no stage")


def test_every_allowed_exception_still_exists():
    sources = _sources()
    for module, target in ALLOWED:
        assert module in sources and target in sources, f"{module} or {target} is gone: drop it from ALLOWED"
        path, source, is_package = sources[module]
        assert any(t == target for t, *_ in imports_of(module, source, is_package, set(sources))), \
            f"{module} no longer imports {target}: drop it from ALLOWED"


def test_at_most_16_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 16, f"{len(top)} modules directly in tvm_fusion/ (put the new one in its stage): {top}"
