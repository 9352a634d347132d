"""The docs name what exists. In README.md, ARCHITECTURE.md, docs/*.md and tvm_fusion/patterns/README.md:
every relative link points to a file that exists, and every `#anchor` to a heading of the file it names
(GitHub's heading slugs); every repository path written (`tvm_fusion/check/compare.py`, `patterns/qdq.py`)
names a file that exists; every dotted `tvm_fusion.x.y` imports, or resolves as an attribute of the longest
part that imports, or is a key the package writes as a string (an IR attribute, the custom ONNX domain)."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: the files whose paths and module names must be current: the docs and the rule authors' guide
NAMING = [*DOCS, ROOT / "tvm_fusion" / "patterns" / "README.md"]
#: a repository path (`tvm_fusion/check/compare.py`, `benchmarks/gpu_bundle/`), or one inside the package as
#: the rule guides write it (`patterns/activations.py`, `schedules/llvm/dense.py`); not a piece of a longer
#: path (`~/.cache/tvm_fusion/tune`, `out/gpu_bundle/...`) and not a glob (`tests/test_*.py`, `<name>`)
REPO_PATH = re.compile(r"(?<![\w./~-])((?:tvm_fusion|benchmarks|tests|patterns|schedules)/[\w./*{}<>-]*)")
#: a dotted name in the package: `tvm_fusion.runtime.load`, `tvm_fusion.check.numerics`
DOTTED = re.compile(r"(?<![\w./-])(tvm_fusion(?:\.[A-Za-z_]\w*)+)")


def _prose(text: str) -> str:
    """The text outside code fences and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    heading = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_docs_have_links():
    assert sum(len(_links(p)) for p in DOCS) > 20


def test_slugs_follow_github():
    assert _slug("Dynamic batch: `--shape` with a symbolic dim") == "dynamic-batch---shape-with-a-symbolic-dim"
    assert _slug("Tensor cores (CUDA, sm_80+)") == "tensor-cores-cuda-sm_80"


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in _links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_sections_the_messages_name_exist():
    """A message that sends the user to "README: 'Section'" names a heading the README has."""
    named = {m for path in (ROOT / "tvm_fusion").rglob("*.py")
             for m in re.findall(r"README: '([^']+)'", path.read_text())}
    headings = set(re.findall(r"^#{1,6} (.+)$", (ROOT / "README.md").read_text(), re.M))
    assert named and not named - headings, f"no such README heading: {sorted(named - headings)}"


def _paths_in(text: str) -> set[str]:
    found = {p.rstrip(".-") for p in REPO_PATH.findall(text)}
    return {p for p in found if not re.search(r"[*{}<>]", p) and "/" in p.rstrip("/")}


def _exists(written: str) -> bool:
    under = ROOT / "tvm_fusion" if written.startswith(("patterns/", "schedules/")) else ROOT
    return (under / written).exists()


def _code_keys() -> set[str]:
    """The dotted names the package writes as strings: IR module attribute keys (`tvm_fusion.simplify`), the
    custom ONNX domain (`tvm_fusion.recurrent`); a doc names them as keys, not as Python names."""
    return {k for path in (ROOT / "tvm_fusion").rglob("*.py") if not path.name.endswith("_test.py")
            for k in re.findall(r"[\"'](tvm_fusion(?:\.\w+)+)[\"']", path.read_text())}


def _resolves(dotted: str) -> bool:
    """`dotted` is a module, or the longest importable prefix of it has the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        tried = ".".join(parts[:cut])
        try:
            value = importlib.import_module(tried)
        except ModuleNotFoundError as err:
            if tried != err.name and not tried.startswith(f"{err.name}."):
                raise  # a dependency is missing, not the name
            continue
        try:
            for name in parts[cut:]:
                value = getattr(value, name)
        except AttributeError:
            return False
        return True
    return False


def test_the_docs_name_paths_and_modules():
    assert sum(len(_paths_in(p.read_text())) for p in NAMING) > 20
    assert sum(len(DOTTED.findall(p.read_text())) for p in NAMING) > 10


def test_path_finder_skips_globs_and_foreign_paths():
    text = ("`tests/test_*.py`, `~/.cache/tvm_fusion/tune`, `out/gpu_bundle/x.py`, `patterns/<name>.py`, "
            "`tvm_fusion/`, see `tvm_fusion/check/compare.py`.")
    assert _paths_in(text) == {"tvm_fusion/check/compare.py"}
    assert _missing_paths("`patterns/qdq.py`\n```bash\npytest tvm_fusion/patterns/qdq_test.py\n```\n") == []
    assert _missing_paths("```bash\npytest patterns/qdq_test.py\n```\n") == ["patterns/qdq_test.py (in a code block)"]


def _missing_paths(text: str) -> list[str]:
    """The paths `text` names that do not exist; in a code block (a command) a path is from the repository
    root, where `patterns/` alone is not one."""
    fence = re.compile(r"^```.*?^```", flags=re.S | re.M)
    missing = {p for p in _paths_in(fence.sub("", text)) if not _exists(p)}
    missing |= {f"{p} (in a code block)" for p in _paths_in("\n".join(fence.findall(text)))
                if not (ROOT / p).exists()}
    return sorted(missing)


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: str(p.relative_to(ROOT)))
def test_written_paths_exist(doc):
    missing = _missing_paths(doc.read_text())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: str(p.relative_to(ROOT)))
def test_dotted_names_resolve(doc):
    keys = _code_keys()
    stale = sorted({d for d in DOTTED.findall(doc.read_text()) if d not in keys and not _resolves(d)})
    assert not stale, f"{doc.relative_to(ROOT)} names modules or attributes that do not resolve: {stale}"


def test_resolver_tells_a_moved_module():
    assert _resolves("tvm_fusion.check.numerics") and _resolves("tvm_fusion.runtime.manifest.Manifest")
    assert not _resolves("tvm_fusion.numerics") and not _resolves("tvm_fusion.check.numerics.no_such_name")
    assert {"tvm_fusion.simplify", "tvm_fusion.onnx_nodes"} <= _code_keys()
