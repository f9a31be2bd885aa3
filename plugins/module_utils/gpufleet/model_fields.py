"""The errors of a model's description and the checks of one config field.

Shared by gpufleet.model (reading a config.json) and gpufleet.model_families (the
per-family tables and rules): a field is the first of several names set, and every
number the tuner uses is checked once, where it enters (booleans are not integers).
"""
from __future__ import annotations


class ModelError(ValueError):
    """The model folder or its config cannot be described."""


class UnsupportedModelError(ModelError):
    """The model is understood but its KV cache cannot be predicted honestly."""


def first_of(cfg, *keys):
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return None


def is_int(value):
    """An int that is not a bool (Python's True is an int; config.json's true is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value, field, source, minimum=1, extra=""):
    """`value` as an int >= minimum, or ModelError naming the field, file and range."""
    if not is_int(value) or value < minimum:
        raise ModelError(f"{source}: {field} is {value!r}; it must be an integer >= "
                         f"{minimum}{extra} (not a boolean, a string, a list or a fraction)")
    return value


def optional_int(cfg, field, source, minimum=1, extra=""):
    value = cfg.get(field)
    return None if value is None else positive_int(value, field, source, minimum, extra)


def positive_number(value, field, source):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelError(f"{source}: {field} is {value!r}; it must be a number > 0")
    return value


def field_name(text, *keys):
    """The first of `keys` present in the config (for error messages)."""
    return next((k for k in keys if text.get(k) is not None), keys[0])
