"""Stand-in for the pip bootstrap that `ansible-test sanity` downloads (get-pip-<version>.py
from ci-files.testing.ansible.com, which the machines that run gpufleet's CI do not reach).
scripts/collection-check.sh saves it where ansible-test looks for its cached copy
(~/.ansible/test/cache/get_pip_<version>.py, as ansible-test's own error message says to
do) when nothing is there yet; see docs/collection.md, "ansible-test sanity".

ansible-test runs it in each new, empty sanity virtual environment with get-pip's
arguments (`--disable-pip-version-check pip==24.2 --no-setuptools --no-wheel`). It does
what get-pip does from what the machine has: pip from the interpreter's own ensurepip,
then `pip install` of the packages asked for, from PyPI through the machine's pip
configuration.
"""
import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")

ensurepip.bootstrap(upgrade=True)
# ensurepip sets these in this process to isolate itself; the pip install below must read
# the machine's pip configuration (its index, certificates, constraints) as get-pip does.
for name in ("PIP_CONFIG_FILE", "ENSUREPIP_OPTIONS"):
    os.environ.pop(name, None)
args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
rc = subprocess.call([sys.executable, "-m", "pip", "install"] + args)
if rc == 0 and "--no-setuptools" in sys.argv[1:]:
    # Python 3.11's ensurepip installs setuptools too; get-pip would not have
    rc = subprocess.call([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
sys.exit(rc)
