"""Every relative link in README.md, ARCHITECTURE.md and docs/*.md points to a file that exists, and every
`#anchor` to a heading of the file it names (GitHub's heading slugs)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
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
