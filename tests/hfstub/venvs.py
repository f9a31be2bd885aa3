"""Tools the integration tests run in their own venvs under .cache/ (apart from ansible's
.venv, whose dependencies they would fight): olah (a real HF mirror) and huggingface_hub
(the `hf` client). Created on first use from PyPI; pinned."""
from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PINS = {"olah": "olah==0.5.4", "hfhub": "huggingface_hub==2.4.0"}


def tool_venv(name):
    """bin/ folder of .cache/<name>-venv with PINS[name] installed (idempotent)."""
    venv = ROOT / ".cache" / f"{name}-venv"
    pip = venv / "bin" / "pip"
    if not pip.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run([str(pip), "freeze"], capture_output=True, text=True).stdout
    if PINS[name].lower().replace("_", "-") not in installed.lower().replace("_", "-"):
        subprocess.run([str(pip), "install", "-q", PINS[name]], check=True)
    return venv / "bin"
