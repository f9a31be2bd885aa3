"""gpufleet.options: the ranges of module options that Ansible's types leave open (issue #32
item 9). Every module's main() checks its options with options.check;
tests/unit/test_module_inputs.py feeds every option of every module bad values."""
import pytest

HUGE_STR = "x" * (10 * 1024 * 1024)
NAN = float("nan")


def test_a_range_error_names_the_option_the_value_and_the_range():
    from gpufleet import options

    with pytest.raises(options.OptionError) as raised:
        options.whole(1, options.DAY, "seconds")("timeout", -1)
    assert str(raised.value) == ("timeout must be a whole number of seconds from 1 to 86400 "
                                 "(a day), not -1")
    with pytest.raises(options.OptionError, match=r"^interval must be a number of seconds "
                                                  r"from 0\.1 to 3600 \(an hour\), not nan$"):
        options.number(0.1, options.HOUR, unit="seconds")("interval", NAN)


@pytest.mark.parametrize("value", [NAN, float("inf"), -float("inf"), 10 ** 400, True, "1",
                                   None, [1]])
def test_nan_infinity_and_other_types_pass_no_number_rule(value):
    from gpufleet import options

    for rule in (options.number(), options.number(above=0), options.number(0, 1),
                 options.number(high=10)):
        with pytest.raises(options.OptionError):
            rule("x", value)


@pytest.mark.parametrize("value", [1.0, True, 10 ** 18, -1, "3"])
def test_whole_numbers_are_ints_within_the_range(value):
    from gpufleet import options

    with pytest.raises(options.OptionError):
        options.whole(0, 10 ** 6)("x", value)
    assert options.whole(0, 10 ** 6)("x", 10 ** 6) == 10 ** 6


def test_a_huge_string_is_refused_and_quoted_short():
    from gpufleet import options

    with pytest.raises(options.OptionError) as raised:
        options.check({"image": HUGE_STR}, {"image": {"type": "str"}})
    assert len(str(raised.value)) < 200 and "10485760 characters" in str(raised.value)
    with pytest.raises(options.OptionError, match="NUL byte"):
        options.check({"dest": "/tmp/a\0b"}, {"dest": {"type": "path"}})
    with pytest.raises(options.OptionError, match=r"^cmd\[1\] is 2000000 characters long"):
        options.check({"cmd": ["a", "b" * 2000000]},
                      {"cmd": {"type": "list", "elements": "str"}})
    # a float option is finite without a rule of its own; None is an option not given
    with pytest.raises(options.OptionError, match="^ratio must be a number"):
        options.check({"ratio": NAN, "other": None},
                      {"ratio": {"type": "float"}, "other": {"type": "float"}})


def test_a_no_log_value_is_not_quoted():
    from gpufleet import options

    secret = "hf_" + "s3cret" * 1000
    with pytest.raises(options.OptionError) as raised:
        options.check({"token": secret}, {"token": {"type": "str", "no_log": True}})
    assert "s3cret" not in str(raised.value) and "not shown: no_log" in str(raised.value)
