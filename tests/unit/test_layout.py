"""The house a newcomer reads (issue #33 item 4): plugins/module_utils/gpufleet/__init__.py
names every file of the package with what it decides, so a new file cannot arrive
undescribed and a removed one cannot stay listed."""
import ast
import pathlib
import re

PKG = pathlib.Path(__file__).resolve().parents[2] / "plugins/module_utils/gpufleet"


def _described(doc):
    return set(re.findall(r"^  ([a-z_0-9]+) +\S", doc, re.M))


def test_every_module_utils_file_is_described_in_the_package_docstring():
    doc = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text()))
    files = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    described = _described(doc)
    assert files - described == set(), f"not described in __init__.py: {sorted(files - described)}"
    assert described - files == set(), f"described but gone: {sorted(described - files)}"


def test_the_description_check_can_fail():
    """Control: a docstring that lacks one file and names a ghost gives both differences."""
    doc = "x\n  tune             the planner\n  ghost            gone\n"
    assert _described(doc) == {"tune", "ghost"}
