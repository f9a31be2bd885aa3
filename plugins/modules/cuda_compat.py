#!/usr/bin/python
"""Ansible module cuda_compat: can this host's driver and GPUs run a CUDA image?"""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: cuda_compat
short_description: Decide whether a host can run a CUDA container image
description:
  - Compares the host's NVIDIA driver and GPU compute capabilities with what a CUDA image
    needs, and says whether it runs natively, under CUDA minor-version compatibility,
    under forward compatibility (data-center GPUs only), or not at all.
  - Evaluates the image's C(NVIDIA_REQUIRE_CUDA) exactly as nvidia-container-cli does
    (space-separated alternatives, comma-separated conditions on cuda, driver, arch and
    brand). That check runs before the container starts, so its verdict dominates.
  - A condition on another property (C(foo=bar)) is not malformed. NVIDIA's Go
    requirements parser (CSV mode only) skips it, but on docker C(--gpus)
    nvidia-container-cli refuses the container with "requirement error - invalid
    expression" when it reads the term. That is returned as the verdict with the term; a
    term it does not read is reported as ignored on this host. A term with no property
    name or operator, or a value that is no version, is malformed and fails the task.
  - Checks the GPU architecture against the CUDA version (CUDA 13 dropped Maxwell, Pascal
    and Volta), the driver branch (R580 is the last for them) and the image's kernel list.
  - Predicts whether the container toolkit puts the image's CUDA forward-compatibility
    libraries (C(/usr/local/cuda/compat/libcuda.so.<version>)) on the loader path, from
    the toolkit version (O(toolkit_version)), how the container gets its GPUs
    (O(gpu_runtime)) and the host driver; on a GPU that does not support forward
    compatibility (GeForce and other non-data-center parts) that makes CUDA fail with error
    804, which the verdict then says, with the fixes. With O(image) the libraries are read
    from the image (a container is created, never started, and removed); otherwise what
    NVIDIA's CUDA base images ship is assumed and said in the reasons.
  - Changes nothing on the host; C(changed) is always false.
options:
  driver_version:
    description:
      - Host driver version as printed by nvidia-smi, for example C(535.129.03). Empty or
        absent when no driver is installed yet (then O(driver_branch) is required).
    type: str
  driver_branch:
    description:
      - The driver branch the host will run (the nvidia_driver role's branch), for example
        C(580). The check then uses the planned driver - the installed one when it is on
        this branch, else the branch's first release - instead of O(driver_version).
    type: str
  compute_capabilities:
    description: Compute capabilities of the GPUs the container will use, for example C(["9.0"]).
    type: list
    elements: str
    default: []
  cuda_version:
    description: CUDA version the image is built for, for example C(13.0).
    type: str
  require_cuda:
    description: The image's C(NVIDIA_REQUIRE_CUDA) value.
    type: str
  image:
    description:
      - A local image (name:tag or ID). The module reads C(NVIDIA_REQUIRE_*),
        C(NVIDIA_DISABLE_REQUIRE), C(CUDA_VERSION) and C(TORCH_CUDA_ARCH_LIST) from its
        config through the docker SDK. The image must already be present.
    type: str
  image_arch_list:
    description:
      - Architectures the image's kernels are built for, in C(TORCH_CUDA_ARCH_LIST) form
        (C(7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX)). Overrides the list read from O(image).
    type: str
  datacenter_gpu:
    description:
      - The GPUs are data-center parts (Tesla, A10, A100, H100, L40S...); forward compatibility
        needs them.
      - Unset, it is taken from what proves it - O(brand) (Tesla and NVIDIA are data-center
        brands; GeForce, TITAN, Quadro, NVIDIA RTX are not), else the compute capabilities
        (8.0, 9.0, 10.0, 10.3 and 3.7 are data-center only). Where nothing proves it, both
        are evaluated; different verdicts give RV(depends_on_brand) and RV(outcomes).
    type: bool
  brand:
    description:
      - GPU brand, as nvidia-smi prints it (C(Product Brand), for example C(GeForce),
        C(NVIDIA), C(NVIDIA RTX)) or as nvidia-container-cli reports it (quadro, tesla,
        nvs, grid, geforce, titan, unknown). Brand conditions of C(NVIDIA_REQUIRE_CUDA) are
        evaluated with it; A100/H100/L40S (C(NVIDIA)) count as unknown.
      - Default tesla for a data-center GPU (see O(datacenter_gpu)), geforce otherwise.
    type: str
  toolkit_version:
    description:
      - The host's nvidia-container-toolkit version (C(1.17.8), the package version
        C(1.17.8-1), or the output of C(nvidia-ctk --version)). Decides whether and how the
        image's forward-compatibility libraries are used. Empty or absent assumes a current
        toolkit (1.17.7 or later) and says so.
    type: str
  gpu_runtime:
    description:
      - How the container gets its GPUs. C(nvidia) is docker C(--gpus) or device_requests
        with the nvidia driver (nvidia-container-cli, C(cuda-compat-mode)); C(cdi) is the
        CDI spec from C(nvidia-ctk cdi generate) (the C(enable-cuda-compat) hook).
    type: str
    choices: [nvidia, cdi]
    default: nvidia
  cuda_compat_disabled:
    description:
      - The host's toolkit is set not to use the image's forward-compatibility libraries
        (C(nvidia-container-runtime.modes.legacy.cuda-compat-mode = "disabled") for
        O(gpu_runtime=nvidia); a CDI spec generated with
        C(--disable-hook enable-cuda-compat) for O(gpu_runtime=cdi)).
    type: bool
    default: false
  allow_forward_compat:
    description: Accept forward compatibility (cuda-compat libraries, C(VLLM_ENABLE_CUDA_COMPATIBILITY=1)) as compatible.
    type: bool
    default: false
  fail_on_incompatible:
    description: Fail the task when the verdict is incompatible.
    type: bool
    default: true
notes:
  - Exactly one of O(cuda_version), O(require_cuda) or O(image) is required.
  - Tables (driver per CUDA release, minor-version floors, driver branches, architecture
    support) live in plugins/module_utils/gpufleet/cuda_versions.py with their sources;
    the image's requirements in require_cuda.py, its compat libraries in compat_libs.py.
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
requirements:
  - docker (Python SDK) when O(image) is used
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Can this host run the CUDA 13 vLLM image?
  gpufleet.fleet.cuda_compat:
    driver_version: "{{ ansible_facts.gpu.driver_version }}"
    compute_capabilities: "{{ ansible_facts.gpu.devices | map(attribute='compute_capability') | list }}"
    image: vllm/vllm-openai:v0.23.0
    datacenter_gpu: true

- name: Plan before pulling, from the image's NVIDIA_REQUIRE_CUDA
  gpufleet.fleet.cuda_compat:
    driver_version: 535.129.03
    compute_capabilities: ["9.0"]
    require_cuda: "cuda>=12.8 brand=tesla,driver>=535,driver<536"
    datacenter_gpu: true
    fail_on_incompatible: false
  register: __vllm_cuda

- name: Check the driver the host will run after the driver role (branch 580)
  gpufleet.fleet.cuda_compat:
    driver_version: "{{ ansible_facts.gpu.driver_version | default('', true) }}"
    driver_branch: "580"
    require_cuda: "cuda>=13.0"

- name: Plain CUDA version check
  gpufleet.fleet.cuda_compat:
    driver_version: 570.133.20
    cuda_version: "12.9"
"""

RETURN = r"""
driver_version:
  description: The driver the verdict is for (the planned one when O(driver_branch) is set).
  type: str
  returned: always
  sample: 580.65.06
driver_planned:
  description: Whether RV(driver_version) is the planned driver rather than the installed one.
  type: bool
  returned: always
  sample: true
datacenter_gpu:
  description: Whether the GPUs were taken as data-center parts; null when nothing decides it.
  type: bool
  returned: always
  sample: true
datacenter_gpu_from:
  description: What decided RV(datacenter_gpu) (the option, the brand, the compute capability).
  type: str
  returned: always
  sample: compute capability 9.0 is data-center only (developer.nvidia.com/cuda-gpus)
depends_on_brand:
  description:
    - The verdict differs between a data-center GPU and another one, and nothing given decides
      which this is; RV(compatible) is then false and RV(outcomes) has both.
  type: bool
  returned: always
  sample: false
outcomes:
  description: The verdict (compatible, mode) for a data-center GPU and for another one.
  type: dict
  returned: when depends_on_brand
  sample: {"datacenter": {"compatible": true, "mode": "forward_compat"}, "other": {"compatible": false, "mode": "incompatible"}}
compatible:
  description: Whether the image can run on this host (mode is not incompatible).
  type: bool
  returned: always
  sample: false
mode:
  description: native, minor_version, forward_compat or incompatible.
  type: str
  returned: always
  sample: incompatible
required_cuda:
  description: CUDA version the image needs; null when nothing names one.
  type: str
  returned: always
  sample: "13.0"
driver_cuda:
  description: Newest CUDA version the host driver supports (what nvidia-smi shows).
  type: str
  returned: always
  sample: "12.2"
driver_branch:
  description: Driver branch (major version).
  type: int
  returned: always
  sample: 535
min_driver:
  description: Minimum driver for the full feature set of required_cuda (NVIDIA release notes).
  type: str
  returned: always
  sample: 580.65.06
require_cuda_satisfied:
  description: Whether nvidia-container-cli accepts the image's requirements; null when none were given.
  type: bool
  returned: always
unsatisfied_condition:
  description:
    - nvidia-container-cli's message when it refuses the image (C(unsatisfied condition) and
      the condition, or C(invalid expression) for a condition on a property it does not know).
  type: str
  returned: always
  sample: "unsatisfied condition: cuda>=12.8, please update your driver to a newer version, or use an earlier cuda container"
image_requirements:
  description: What was read from the image (requirements, disabled, cuda_version, arch_list).
  type: dict
  returned: when image is given
compat_libs:
  description:
    - The image's CUDA forward-compatibility libraries and whether the container loads them
      (present, version, branch, note (the library's C(.note.cuda.fwd_compatibility) - cuda,
      driver branches, device brands), source C(image) or C(assumed), package, loaded,
      gpu_runtime, toolkit_version).
  type: dict
  returned: when a CUDA version is known
  sample: {"present": true, "version": "575.57.08", "branch": 575, "source": "image", "loaded": true}
reasons:
  description: Plain sentences explaining the verdict.
  type: list
  elements: str
  returned: always
suggestions:
  description: Concrete fixes (image, driver branch, forward compatibility).
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
import io
import tarfile

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.compat_libs import COMPAT_DIR, compat_libs_from_image
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.cuda import check
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.cuda_versions import planned_driver
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.require_cuda import image_requirements

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:  # pragma: no cover - the venv has it
    docker = docker_errors = None
    HAS_DOCKER = False


def read_image_config(image, client=None):
    """(Config.Env, Config.Labels) of a local image; ValueError when it is absent."""
    client = client or docker.from_env()
    try:
        img = client.images.get(image)
    except docker_errors.ImageNotFound:
        raise ValueError(f"image {image} is not present on this host; pull it first or pass "
                         "require_cuda") from None
    config = (img.attrs or {}).get("Config") or {}
    return config.get("Env") or [], config.get("Labels") or {}


# A compat libcuda is about 100 MB; more than this is not read.
_MAX_LIBCUDA = 512 * 1024 * 1024


class _Chunks(io.RawIOBase):
    """A file over the byte chunks of a docker archive stream (for tarfile's "r|")."""

    def __init__(self, chunks):
        self._chunks, self._buf = iter(chunks), b""

    def readable(self):
        return True

    def readinto(self, b):
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def read_image_compat_libs(image, client=None):
    """What the image holds in /usr/local/cuda/compat, without starting it: a container
    is created (never started), the directory read through the archive API, and the
    container removed.  Returns compat_libs for check(), or None when this client cannot
    create containers."""
    client = client or docker.from_env()
    api = getattr(client, "api", None)
    if api is None:   # a client without the low-level API (tests' stand-ins)
        return None
    cid = api.create_container(image, command=["true"], network_disabled=True)["Id"]
    try:
        try:
            chunks, _stat = api.get_archive(cid, COMPAT_DIR + "/.")
        except docker_errors.NotFound:
            return compat_libs_from_image(None)
        names, libcuda = [], None
        with tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks)), mode="r|") as tar:
            for member in tar:
                if not member.isreg() or "/" in member.name.strip("./").strip("/"):
                    continue
                name = member.name.rsplit("/", 1)[-1]
                names.append(name)
                if (name.startswith("libcuda.so.") and name.count(".") >= 3
                        and member.size <= _MAX_LIBCUDA):
                    libcuda = tar.extractfile(member).read()
        return compat_libs_from_image(names, libcuda if len(
            [n for n in names if n.startswith("libcuda.so.") and n.count(".") >= 3]) == 1 else None)
    finally:
        api.remove_container(cid, force=True)


def run(params, docker_client=None):
    """Module logic without AnsibleModule: params dict in, result dict out."""
    extra = {}
    installed = params.get("driver_version") or None
    driver = installed
    if params.get("driver_branch"):
        driver = planned_driver(installed, params["driver_branch"])
    if not driver:
        raise ValueError("driver_version is empty and no driver_branch is given: pass the "
                         "host's driver (ansible_facts.gpu.driver_version) or the branch the "
                         "driver role will install")
    extra["driver_version"] = driver
    extra["driver_planned"] = driver != installed
    require, cuda_version, arch_list = params.get("require_cuda"), params.get("cuda_version"), None
    compat, unread = "assume", False
    if params.get("image"):
        env, labels = read_image_config(params["image"], docker_client)
        info = image_requirements(env, labels)
        extra["image_requirements"] = info
        require, cuda_version, arch_list = info["requirements"], info["cuda_version"], info["arch_list"]
        compat = read_image_compat_libs(params["image"], docker_client)
        if compat is None:
            compat, unread = "assume", True
    result = check(
        driver,
        compute_capabilities=params.get("compute_capabilities") or [],
        cuda_version=cuda_version,
        require_cuda=require,
        image_arch_list=params.get("image_arch_list") or arch_list,
        datacenter_gpu=params.get("datacenter_gpu"),
        allow_forward_compat=params.get("allow_forward_compat", False),
        brand=params.get("brand"),
        compat_libs=compat,
        toolkit_version=params.get("toolkit_version") or None,
        gpu_runtime=params.get("gpu_runtime") or "nvidia",
        cuda_compat_disabled=params.get("cuda_compat_disabled", False),
    )
    if unread and result.get("compat_libs"):
        result["reasons"].append(f"{COMPAT_DIR} of {params['image']} could not be read; "
                                 "what NVIDIA's base image ships was assumed.")
    for ignored in extra.get("image_requirements", {}).get("ignored", []):
        result["reasons"].append(f"Ignored, as the container toolkit does: {ignored}.")
    if extra.get("image_requirements", {}).get("disabled"):
        result["reasons"].insert(0, "The image sets NVIDIA_DISABLE_REQUIRE: the container "
                                    "toolkit skips its requirement check.")
    if extra["driver_planned"]:
        result["reasons"].insert(0, f"Planned driver: {driver} (branch {params['driver_branch']}), "
                                    f"which the driver role installs in place of "
                                    f"{installed or 'no driver'}.")
    result.update(extra)
    return result


def failure_message(result, driver_version):
    fix = " ".join(result["suggestions"]) or "see reasons"
    # the forward-compatibility libraries' failure (804/803) is said after the first reason
    loads = [r for r in result["reasons"][1:] if "CUDA initialisation fails" in r]
    return (f"host cannot run this image: driver {driver_version} supports CUDA "
            f"{result['driver_cuda']}, the image requires CUDA {result['required_cuda'] or 'n/a'}. "
            f"{' '.join(result['reasons'][:1] + loads)} Fix: {fix}")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            driver_version=dict(type="str"),
            driver_branch=dict(type="str"),
            compute_capabilities=dict(type="list", elements="str", default=[]),
            cuda_version=dict(type="str"),
            require_cuda=dict(type="str"),
            image=dict(type="str"),
            image_arch_list=dict(type="str"),
            datacenter_gpu=dict(type="bool"),
            brand=dict(type="str"),
            allow_forward_compat=dict(type="bool", default=False),
            toolkit_version=dict(type="str"),
            gpu_runtime=dict(type="str", choices=["nvidia", "cdi"], default="nvidia"),
            cuda_compat_disabled=dict(type="bool", default=False),
            fail_on_incompatible=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("cuda_version", "require_cuda", "image")],
        required_one_of=[("cuda_version", "require_cuda", "image"),
                         ("driver_version", "driver_branch")],
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            # NVIDIA's NVIDIA_REQUIRE_CUDA lists a clause per brand: longer than a name
            "require_cuda": options.text(4 * options.TEXT_MAX),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if module.params["image"] and not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker"))
    try:
        result = run(module.params)
    except ValueError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except Exception as exc:  # docker daemon unreachable, API errors
        if HAS_DOCKER and isinstance(exc, docker_errors.DockerException):
            module.fail_json(msg=f"cannot read image {module.params['image']} through docker: {exc}",
                             changed=False)
        raise
    if not result["compatible"] and module.params["fail_on_incompatible"]:
        module.fail_json(msg=failure_message(result, result["driver_version"]),
                         changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
