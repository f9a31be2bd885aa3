"""GPU architectures: the one compute-capability table and the one parser.

Plain data in, plain data out; no Ansible imports. gpu.py, cuda_versions.py, cuda.py,
hoststack.py and tune.py take every architecture fact from here, so a new GPU
generation is added in one place. An unknown or malformed compute capability is an ArchError (a ValueError)
that says what to pass or where to add it.

Sources:
- compute capability -> architecture: NVIDIA CUDA C++ Programming Guide, "Compute
  Capabilities", and developer.nvidia.com/cuda-gpus. 5.3/6.2/7.2/8.7 are the Tegra parts
  (TX1, TX2, Xavier, Orin). CUDA 13 renamed Thor 10.1 -> 11.0 (CUDA 13.0 release notes);
  both spellings map to Blackwell.
- first CUDA toolkit that builds for a compute capability, and the first that no longer
  does: mesonbuild/meson mesonbuild/modules/cuda.py `_MICROISA_RANGES_DEF` (replicates
  https://en.wikipedia.org/wiki/CUDA#GPUs_supported) and the CUDA 13.0 release notes
  ("Maxwell, Pascal and Volta ... no longer supported"; sm_101 -> sm_110).
- last driver branch: NVIDIA "Unix graphics feature deprecation schedule"
  (forums.developer.nvidia.com): "The release 580 series will be the last to support
  GPUs based on the Maxwell, Pascal, and Volta architectures"; R470 was the last branch
  for Kepler.
- open kernel modules: Turing and newer only; Blackwell requires them (NVIDIA driver
  README, "Using the Open GPU Kernel Modules"; Blackwell data-center guide).
- data-center-only compute capabilities: developer.nvidia.com/cuda-gpus lists, for 3.7
  only Tesla K80; 8.0 only A100 and A30 (A800 alike); 9.0 only GH200, H200 and H100; 10.0
  only GB200 and B200; 10.3 only GB300 and B300. Every other capability is shared with a
  GeForce, TITAN, Quadro/RTX workstation or Jetson part (6.0: Quadro GP100; 7.0: TITAN V
  and Quadro GV100; 8.6: RTX 30 and A10/A40; 8.9: RTX 40 and L4/L40; 12.0: RTX 50 and
  RTX PRO 6000).
- bf16: compute capability >= 8.0 (vLLM gpu_worker.py _check_if_gpu_supports_dtype
  refuses bfloat16 below it); fp8 compute units: >= 8.9 (Ada, Hopper, Blackwell; vLLM
  runs FP8 weight-only and refuses an fp8 KV cache on V1 below it, docs/tuning.md).
"""
from __future__ import annotations

import re

__all__ = [
    "ARCHITECTURES",
    "COMPUTE_CAPABILITIES",
    "ArchError",
    "architecture",
    "architecture_facts",
    "DATACENTER_ONLY",
    "cc_text",
    "datacenter_only",
    "parse_compute_capability",
]


class ArchError(ValueError):
    """A compute capability that is malformed or not in the table."""


# Compute capability -> (architecture, first CUDA toolkit that builds for it, first CUDA
# toolkit without it or None).
COMPUTE_CAPABILITIES = {
    "3.0": ("kepler", "5.0", "11.0"), "3.2": ("kepler", "6.0", "11.0"),
    "3.5": ("kepler", "5.0", "12.0"), "3.7": ("kepler", "6.5", "12.0"),
    "5.0": ("maxwell", "6.5", "13.0"), "5.2": ("maxwell", "6.5", "13.0"),
    "5.3": ("maxwell", "6.5", "13.0"),
    "6.0": ("pascal", "8.0", "13.0"), "6.1": ("pascal", "8.0", "13.0"),
    "6.2": ("pascal", "8.0", "13.0"),
    "7.0": ("volta", "9.0", "13.0"), "7.2": ("volta", "10.0", "13.0"),
    "7.5": ("turing", "10.0", None),
    "8.0": ("ampere", "11.0", None), "8.6": ("ampere", "11.1", None),
    "8.7": ("ampere", "11.5", None),
    "8.9": ("ada", "11.8", None),
    "9.0": ("hopper", "11.8", None),
    "10.0": ("blackwell", "12.8", None), "10.1": ("blackwell", "12.8", "13.0"),
    "10.3": ("blackwell", "12.9", None), "11.0": ("blackwell", "13.0", None),
    "12.0": ("blackwell", "12.8", None), "12.1": ("blackwell", "12.9", None),
}

# Compute capabilities that only data-center parts have (see Sources): a GPU of one of
# these is a data-center GPU whatever its brand string says.
DATACENTER_ONLY = frozenset({"3.7", "8.0", "9.0", "10.0", "10.3"})

# Architecture -> facts, oldest first. open_kernel_modules: "unsupported", "supported"
# or "required"; last_driver_branch: the last driver branch for it, None while current.
ARCHITECTURES = {
    "kepler": {"open_kernel_modules": "unsupported", "last_driver_branch": 470,
               "bf16": False, "fp8": False},
    "maxwell": {"open_kernel_modules": "unsupported", "last_driver_branch": 580,
                "bf16": False, "fp8": False},
    "pascal": {"open_kernel_modules": "unsupported", "last_driver_branch": 580,
               "bf16": False, "fp8": False},
    "volta": {"open_kernel_modules": "unsupported", "last_driver_branch": 580,
              "bf16": False, "fp8": False},
    "turing": {"open_kernel_modules": "supported", "last_driver_branch": None,
               "bf16": False, "fp8": False},
    "ampere": {"open_kernel_modules": "supported", "last_driver_branch": None,
               "bf16": True, "fp8": False},
    "ada": {"open_kernel_modules": "supported", "last_driver_branch": None,
            "bf16": True, "fp8": True},
    "hopper": {"open_kernel_modules": "supported", "last_driver_branch": None,
               "bf16": True, "fp8": True},
    "blackwell": {"open_kernel_modules": "required", "last_driver_branch": None,
                  "bf16": True, "fp8": True},
}

_CC_RE = re.compile(r"^(\d{1,2})\.(\d{1,2})$")


def parse_compute_capability(cc):
    """'8.6', ' 8.6 ' or (8, 6) -> (8, 6). ArchError on anything else.

    86 or '86' are refused (ambiguous for 10.0 and up), and so are booleans.
    Whether the table knows it is not checked here; see architecture().
    """
    if isinstance(cc, (tuple, list)) and len(cc) == 2 and all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 100 for p in cc):
        return int(cc[0]), int(cc[1])
    match = None if isinstance(cc, (bool, tuple, list, dict)) or cc is None else \
        _CC_RE.match(str(cc).strip())
    if not match:
        raise ArchError(
            f"compute capability {cc!r} is malformed: it is not like \"8.9\"; expected "
            "MAJOR.MINOR such as 8.0, as nvidia-smi --query-gpu=compute_cap prints it")
    return int(match.group(1)), int(match.group(2))


def cc_text(cc):
    """The table's spelling: (9, 0), '9.0' or '09.00' -> '9.0'."""
    major, minor = parse_compute_capability(cc)
    return f"{major}.{minor}"


def architecture(cc, unknown_ok=False):
    """Architecture name ("hopper") of a compute capability ("9.0").

    An unknown one is an ArchError naming the known ones, or None with unknown_ok
    (facts gathering reports a GPU newer than the table without failing).
    """
    key = cc_text(cc)
    if key in COMPUTE_CAPABILITIES:
        return COMPUTE_CAPABILITIES[key][0]
    if unknown_ok:
        return None
    raise ArchError(
        f"compute capability {key} is not in gpufleet's architecture table (known: "
        f"{', '.join(COMPUTE_CAPABILITIES)}): check the value (nvidia-smi "
        "--query-gpu=compute_cap), or add the GPU to plugins/module_utils/gpufleet/arch.py")


def architecture_facts(cc):
    """The ARCHITECTURES row of a compute capability, with `architecture`,
    `first_cuda` and `last_cuda_before` (the first toolkit without it, or None)."""
    name = architecture(cc)
    _arch_name, first, gone = COMPUTE_CAPABILITIES[cc_text(cc)]
    return dict(ARCHITECTURES[name], architecture=name, first_cuda=first,
                last_cuda_before=gone)


def datacenter_only(cc):
    """True when only data-center GPUs have compute capability `cc` (DATACENTER_ONLY), so
    it proves the GPU is one; False when consumer or workstation parts share it too.
    ArchError for a malformed or unknown one."""
    key = cc_text(cc)
    architecture(key)
    return key in DATACENTER_ONLY
