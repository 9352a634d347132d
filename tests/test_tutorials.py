"""Tutorials are executed, so they cannot rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "tutorials").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_notebooks_match_their_source():
    """tutorials/make_notebooks.py is the source; the committed notebooks must be what it writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS[0].parent / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sorted(module.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        cells = [c.source for c in module.NOTEBOOKS[path.name]]
        assert [c.source for c in nbformat.read(path, as_version=4).cells] == cells, f"{path.name} is stale"
