"""Ranges of module options, beyond the types Ansible's argument_spec checks (issue #32
item 9): no option value reaches a module's logic as a traceback, a raw Python error, a
loop without end or a message holding megabytes.

Ansible converts each option to its type; what a type lets through is checked here:

- every float is finite (NaN compares False both ways: it passed every `<= 0` check;
  infinity has no end), and no longer reaches sleep(), a socket timeout or a division;
- every str and path option, and every string item of a list, is at most TEXT_MAX
  (PATH_MAX for paths) characters and holds no NUL byte, so no message echoes megabytes
  and no regular expression or file name meets one;
- each option named in a module's rules is within its range: rules are built here
  (whole(), number(), text()) and given to check() as {option: rule}.

Plain Python, no Ansible imports. check() raises OptionError (a ValueError) naming the
option, the value (cut to SHOWN characters) and what is accepted; a module's main() calls
it first and turns the error into fail_json.
"""
from __future__ import annotations

import math

__all__ = ["DAY", "HOUR", "MINUTE", "OptionError", "PATH_MAX", "SHOWN", "TEXT_MAX", "YEAR",
           "check", "items", "number", "shown", "text", "whole"]

MINUTE, HOUR, DAY = 60, 3600, 86400
YEAR = 366 * DAY
PATH_MAX = 4096    # Linux's PATH_MAX: no longer path can be opened
TEXT_MAX = 4096    # a string option longer than this is a mistake (an image, a URL, a name)
SHOWN = 80         # characters of a refused value quoted in a message

_SPANS = {MINUTE: "a minute", HOUR: "an hour", DAY: "a day", YEAR: "a year"}


class OptionError(ValueError):
    """An option out of its range; the message names the option, the value, the range."""


def shown(value, limit=SHOWN):
    """repr(value) cut to `limit` characters, saying how long it was when cut."""
    text_ = repr(value)
    if len(text_) <= limit:
        return text_
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text_)} characters shown"
    return f"{text_[:limit]}... ({size})"


def _bound(value, unit):
    out = f"{value:g}" if isinstance(value, float) else str(value)
    span = _SPANS.get(value) if unit == "seconds" else None
    return f"{out} ({span})" if span else out


def _range(low, high, above, unit, kind):
    """'a whole number of seconds from 1 to 86400 (a day)' and the like."""
    if above is not None:
        where = f"above {_bound(above, unit)}"
        where += f" and at most {_bound(high, unit)}" if high is not None else ""
    elif low is not None and high is not None:
        where = f"from {_bound(low, unit)} to {_bound(high, unit)}"
    elif low is not None:
        where = f"at least {_bound(low, unit)}"
    elif high is not None:
        where = f"at most {_bound(high, unit)}"
    else:
        where = "(finite)" if kind == "a number" else ""
    return f"{kind}{f' of {unit}' if unit else ''} {where}".rstrip()


def _hidden(value):
    return "the value (not shown: no_log)"


def whole(low=None, high=None, unit=""):
    """A rule: a whole number (int, not bool) from `low` to `high` (None: unbounded)."""
    def rule(name, value, show=shown):
        if isinstance(value, bool) or not isinstance(value, int) or \
                (low is not None and value < low) or (high is not None and value > high):
            raise OptionError(f"{name} must be {_range(low, high, None, unit, 'a whole number')}"
                              f", not {show(value)}")
        return value
    return rule


def number(low=None, high=None, above=None, unit=""):
    """A rule: a finite number from `low` (or above `above`, exclusive) to `high`."""
    def rule(name, value, show=shown):
        ok = not isinstance(value, bool) and isinstance(value, (int, float))
        if ok:
            try:
                as_float = float(value)
            except OverflowError:  # an int too large for a float
                as_float = math.inf
            ok = math.isfinite(as_float) and (low is None or as_float >= low) and \
                (above is None or as_float > above) and (high is None or as_float <= high)
        if not ok:
            raise OptionError(f"{name} must be {_range(low, high, above, unit, 'a number')}"
                              f", not {show(value)}")
        return value
    return rule


def text(max_length=TEXT_MAX, empty=True, what="option"):
    """A rule: a string of at most `max_length` characters without a NUL byte, not empty
    unless `empty`."""
    def rule(name, value, show=shown):
        if not isinstance(value, str):
            raise OptionError(f"{name} must be a string, not {type(value).__name__}: "
                              f"{show(value)}")
        if not empty and not value.strip():
            raise OptionError(f"{name} must not be empty")
        if len(value) > max_length:
            raise OptionError(f"{name} is {len(value)} characters long; at most {max_length} "
                              f"are accepted: {show(value)}")
        if "\0" in value:
            raise OptionError(f"{name} holds a NUL byte, which no {what} can hold: {show(value)}")
        return value
    return rule


def items(rule):
    """A rule for a list: `rule` for each item, named NAME[INDEX]."""
    def each(name, value, show=shown):
        for index, item in enumerate(value or []):
            if item is not None:
                rule(f"{name}[{index}]", item, show)
        return value
    return each


def _default(spec):
    kind = spec.get("type", "str")
    if kind == "float":
        return number()
    if kind == "str":
        return text()
    if kind == "path":
        return text(PATH_MAX, what="path")
    if kind == "list" and spec.get("elements", "str") in ("str", "path"):
        return items(text(PATH_MAX if spec.get("elements") == "path" else TEXT_MAX))
    return None


def check(params, spec, rules=None):
    """Check AnsibleModule.params against its argument_spec `spec` and `rules`
    ({option: rule}; a rule replaces the option's default one). Options that are None
    (not given, no default) are not checked; the value of a no_log option is not quoted.
    Raises OptionError for the first bad one."""
    rules = rules or {}
    for name in spec:
        value = params.get(name)
        rule = rules.get(name) or _default(spec[name])
        if value is not None and rule is not None:
            rule(name, value, _hidden if spec[name].get("no_log") else shown)
    return params
