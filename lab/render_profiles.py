#!/usr/bin/env python3
"""Render each lab profile's nvidia-smi XML into OUTDIR/<profile>/nvidia-smi.xml.

Reads lab/profiles.yml; the GPUs come from the named real capture, replicated to the
profile's GPU count by gpufleet.gpu.fleet_capture. Writes a file only when its content
changed, and prints a JSON line {"changed": [...]} for Ansible's changed_when.
"""
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "module_utils"))
from gpufleet.gpu import fleet_capture  # noqa: E402


def main(outdir):
    profiles = yaml.safe_load((ROOT / "lab" / "profiles.yml").read_text())
    changed = []
    for name, p in profiles.items():
        capture = (ROOT / p["capture"]).read_text(encoding="utf-8")
        xml = fleet_capture(capture, p["gpu_count"], driver_version=p["driver_version"],
                            cuda_version=p["cuda_version"], mig_mode=p.get("mig_mode"))
        target = pathlib.Path(outdir) / name / "nvidia-smi.xml"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != xml:
            target.write_text(xml, encoding="utf-8")
            changed.append(name)
    print(json.dumps({"changed": changed}))


if __name__ == "__main__":
    main(sys.argv[1])
