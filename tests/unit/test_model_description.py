"""gpufleet.model_description: the typed record of a model's description.

The record is built by gpufleet.model.describe, read by attribute everywhere in
module_utils (an AST scan below, with its control), and turned into the same mapping
the modules always returned at the boundary (as_dict).
"""
import ast
import dataclasses
import json

import pytest

from conftest import FIXTURES, ROOT
from gpufleet import kv_memory
from gpufleet import model as m
from gpufleet.model_description import _TYPES, ModelDescription, ModelDescriptionError

MODULE_UTILS = ROOT / "plugins" / "module_utils" / "gpufleet"
FIELDS = {f.name for f in dataclasses.fields(ModelDescription)}
# Variables that hold a description in module_utils (tune's ctx["model"] too).
DESCRIPTION_NAMES = {"model", "desc", "description", "planned"}
# "name" is also the key of an inventory model entry (serve.py's model["name"]), which is
# no description: the scan looks for the other fields.
SCANNED_FIELDS = FIELDS - {"name"}


def llama():
    cfg = json.loads((FIXTURES / "models" / "llama-3.1-8b" / "config.json").read_text())
    return m.describe(cfg, weights_bytes=16_060_522_496)


def _holds_description(node):
    if isinstance(node, ast.Name):
        return node.id in DESCRIPTION_NAMES
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value == "model")


def dict_reads(source, filename="<source>"):
    """(file, line, key) of each `model["field"]` / `model.get("field")` in source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _holds_description(node.value) \
                and isinstance(node.slice, ast.Constant) and node.slice.value in SCANNED_FIELDS:
            found.append((filename, node.lineno, node.slice.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and _holds_description(node.func.value) \
                and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in SCANNED_FIELDS:
            found.append((filename, node.lineno, node.args[0].value))
    return found


def test_no_reader_in_module_utils_indexes_the_description_as_a_mapping():
    found = []
    for path in sorted(MODULE_UTILS.glob("*.py")):
        found += dict_reads(path.read_text(), path.name)
    assert found == [], "read the description by attribute (model.num_layers): " + repr(found)


@pytest.mark.parametrize("source, count", [
    ("def f(model):\n    return model['num_layers'] + model.get('head_size')\n", 2),
    ("def f(ctx):\n    return ctx['model']['attention']\n", 1),
    ("def f(desc):\n    return desc['kv_lora_rank'] or desc.num_layers\n", 1),
    ("def f(model):\n    return model.num_layers, model['name'], entry['attention']\n", 0),
])
def test_the_scan_finds_mapping_reads_control(source, count):
    assert len(dict_reads(source)) == count


def test_every_field_has_a_checked_type():
    assert set(_TYPES) == FIELDS


def test_the_record_has_no_item_access_and_is_frozen():
    desc = llama()
    with pytest.raises(TypeError):
        desc["num_layers"]  # noqa: B018 (the access itself is the test)
    with pytest.raises(dataclasses.FrozenInstanceError):
        desc.num_layers = 1
    assert not hasattr(desc, "__dict__")  # slots


def test_describe_config_is_the_records_mapping_and_it_round_trips():
    desc = llama()
    cfg = json.loads((FIXTURES / "models" / "llama-3.1-8b" / "config.json").read_text())
    as_dict = m.describe_config(cfg, weights_bytes=16_060_522_496)
    assert as_dict == desc.as_dict()
    assert isinstance(as_dict["layer_kinds"], list) and as_dict["layer_kinds"] == ["full"] * 32
    assert ModelDescription.of(as_dict) == desc
    assert ModelDescription.of(desc) is desc
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_readers_take_the_record_or_its_mapping_alike():
    desc = llama()
    assert kv_memory.kv_layout(desc, 1, 16) == kv_memory.kv_layout(desc.as_dict(), 1, 16)


@pytest.mark.parametrize("change, words", [
    ({"num_layer": 32}, "unknown key(s) num_layer"),
    ({"num_layers": "32"}, "num_layers is '32' (str); it must be int"),
    ({"num_layers": True}, "num_layers is True (bool); it must be int"),
    ({"known_architecture": 1}, "known_architecture is 1 (int); it must be bool"),
    ({"layer_kinds": ["full", 2]}, "layer_kinds must hold strings"),
    ({"kind_heads": [8, 128]}, "kind_heads is [8, 128] (list); it must be dict or NoneType"),
])
def test_unknown_keys_and_wrong_types_fail_at_construction(change, words):
    data = dict(llama().as_dict(), **change)
    with pytest.raises(ModelDescriptionError) as exc:
        ModelDescription.of(data)
    assert words in str(exc.value)


def test_missing_keys_and_a_wrong_type_on_replace_fail():
    data = llama().as_dict()
    del data["head_size"]
    with pytest.raises(ModelDescriptionError, match="missing key.s. head_size"):
        ModelDescription.of(data)
    with pytest.raises(ModelDescriptionError, match="num_kv_heads is 8.0"):
        llama().replace(num_kv_heads=8.0)
    with pytest.raises(ModelDescriptionError, match="not list"):
        ModelDescription.of([("num_layers", 32)])


def test_a_description_error_is_a_model_error():
    # the modules catch ModelError: a bad description fails like a bad config.json
    assert issubclass(ModelDescriptionError, m.ModelError)


def test_model_summary_folds_layer_kinds_of_the_record_or_mapping():
    desc = llama()
    assert m.model_summary(desc) == m.model_summary(desc.as_dict())
    assert m.model_summary(desc)["layer_kinds"] == {"full": 32}
