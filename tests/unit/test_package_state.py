"""The no-op run's package checks (issue 12 item 4): nvidia_driver and container_toolkit
skip their apt install when the package facts already show every wanted package at the
wanted version (gpufleet_missing_packages), and set only the holds dpkg-query shows
missing (gpufleet_packages_to_hold). Drift must still be seen: a removed package,
another version, a removed hold."""

import importlib.util

import pytest

from conftest import ROOT
from gpufleet import hoststack

INSTALLED = {
    "nvidia-open-580": [{"version": "580.65.06-1", "arch": "amd64", "source": "apt"}],
    "nvidia-driver-pinning-580": [{"version": "580.65.06-1"}],
    "nvidia-fabricmanager-580": [{"version": "580.65.06-1"}],
    "libfoo": [{"version": "1:2.0-1"}, {"version": "1:2.0-1"}],  # multi-arch: two entries
}


def test_nothing_missing_when_every_package_is_at_its_version():
    wanted = ["nvidia-driver-pinning-580", "nvidia-open-580=580.65.06-1",
              "nvidia-fabricmanager-580=580.65.06-1", "libfoo=1:2.0-1", "libfoo"]
    assert hoststack.missing_packages(INSTALLED, wanted) == []


@pytest.mark.parametrize("wanted, missing", [
    # removed by hand
    (["nvidia-open-580=580.65.06-1", "nvidia-persistenced"], ["nvidia-persistenced"]),
    # another version installed (an upgrade, a downgrade, an epoch left out)
    (["nvidia-open-580=580.95.05-1"], ["nvidia-open-580=580.95.05-1"]),
    (["libfoo=2.0-1"], ["libfoo=2.0-1"]),
    # an unversioned name only needs the package
    (["nvidia-fabricmanager-580", "absent"], ["absent"]),
])
def test_drift_is_missing(wanted, missing):
    assert hoststack.missing_packages(INSTALLED, wanted) == missing


def test_no_facts_means_everything_is_missing():
    assert hoststack.missing_packages(None, ["a", "b=1"]) == ["a", "b=1"]
    assert hoststack.missing_packages({}, []) == []


LINES = [
    "nvidia-open-580 hold installed",
    "nvidia-driver install installed",  # a hold removed by hand
    "nvidia-persistenced hold installed",
    "nvidia-kernel-open-dkms deinstall config-files",  # removed, not purged
    "nvidia-driver-cuda install not-installed",
]


def test_only_installed_packages_without_a_hold_are_held():
    names = ["nvidia-open-580", "nvidia-driver", "nvidia-persistenced", "nvidia-kernel-open-dkms",
             "nvidia-driver-cuda", "nvidia-fabricmanager-580"]  # the last: dpkg does not know it
    assert hoststack.packages_to_hold(LINES, names) == ["nvidia-driver"]


def test_everything_held_means_nothing_to_do():
    assert hoststack.packages_to_hold(["a hold installed", "b hold installed"], ["a", "b"]) == []
    assert hoststack.packages_to_hold([], ["a"]) == []
    assert hoststack.packages_to_hold(["a install installed"], ["a"]) == ["a"]


def test_the_roles_filters_are_these_functions():
    spec = importlib.util.spec_from_file_location("gpufleet_filters", ROOT / "plugins/filter/gpufleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    filters = module.FilterModule().filters()
    assert filters["gpufleet_missing_packages"](["absent", "nvidia-open-580"], INSTALLED) == ["absent"]
    assert filters["gpufleet_packages_to_hold"](LINES, ["nvidia-driver", "nvidia-open-580"]) == ["nvidia-driver"]
