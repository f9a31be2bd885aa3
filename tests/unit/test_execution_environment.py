"""execution-environment.yml (AWX / Ansible Automation Platform, docs/scale.md) through the
real ansible-builder: `ansible-builder create` writes the build context (no image is
built: that needs a registry this machine cannot reach), and the context carries the same
pins as requirements.txt and the same collections as requirements.yml."""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILDER = pathlib.Path(sys.executable).parent / "ansible-builder"


def create(ee_file, context):
    if not BUILDER.exists():
        pytest.fail(f"ansible-builder is not installed next to {sys.executable} (requirements.txt)")
    return subprocess.run([str(BUILDER), "create", "-f", str(ee_file), "-c", str(context)],
                          cwd=ee_file.parent, capture_output=True, text=True, timeout=120)


def pin(name, text):
    m = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    return m and m.group(1)


def test_ansible_builder_creates_the_build_context(tmp_path):
    proc = create(ROOT / "execution-environment.yml", tmp_path / "ee")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = tmp_path / "ee"
    recipe = next(p for p in (build / "Containerfile", build / "Dockerfile") if p.exists())
    text = recipe.read_text()
    core = pin("ansible-core", (ROOT / "requirements.txt").read_text())
    assert core and f'ANSIBLE_INSTALL_REFS="ansible-core=={core} ansible-runner"' in text
    assert (build / "_build/requirements.yml").read_text() == (ROOT / "requirements.yml").read_text()
    runtime = (build / "_build/requirements.txt").read_text()
    assert runtime == (ROOT / "requirements-runtime.txt").read_text()
    # the runtime pins are the ones .venv gets (requirements.txt includes the file)
    assert "-r requirements-runtime.txt" in (ROOT / "requirements.txt").read_text()
    assert pin("docker", runtime) == "7.2.0"


def test_the_execution_environment_names_the_repositorys_own_files():
    ee = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
    deps = ee["dependencies"]
    assert (ROOT / deps["galaxy"]).is_file() and (ROOT / deps["python"]).is_file()
    collections = {c["name"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}
    assert {"community.docker", "community.general"} <= collections


def test_control_a_broken_file_fails_create(tmp_path):
    """The check can fail: a schema version ansible-builder does not know is refused."""
    shutil.copy(ROOT / "requirements.yml", tmp_path)
    shutil.copy(ROOT / "requirements-runtime.txt", tmp_path)
    broken = tmp_path / "execution-environment.yml"
    broken.write_text((ROOT / "execution-environment.yml").read_text().replace("version: 3", "version: 99"))
    proc = create(broken, tmp_path / "ee")
    assert proc.returncode != 0
    assert "version" in (proc.stdout + proc.stderr).lower()
