"""GPU facts from NVML, from `nvidia-smi -q -x`, or from the PCI bus.

Plain data in, plain data out; no Ansible imports. Every source produces the same
dict, the `ansible_facts.gpu` vocabulary of docs/conventions.md:

    present, source, driver_version, cuda_driver_version, count, nvlink, devices[]
    device: index, name, uuid, pci_bus_id, pci_device_id, memory_total_mib,
            memory_reserved_mib, compute_capability, architecture, persistence_mode,
            mig_mode

`memory_reserved_mib` is the memory the driver keeps for itself (nvidia-smi's "FB Memory
Usage / Reserved", NVML's nvmlMemory_v2_t.reserved, rounded up to whole MiB): CUDA
programs never see it. cudaMemGetInfo's total, which vLLM multiplies by
gpu_memory_utilization, is memory_total_mib - memory_reserved_mib (measured on an H200,
driver 580.159.04: 150,754,820,096 - 644,939,776 = 150,109,880,320 bytes;
tests/fixtures/nvidia-smi/device-h200-driver-580.json). None where a source cannot tell
(drivers before R510, the PCI bus).

Value formats: `pci_bus_id` as NVML and nvidia-smi print it ("00000000:84:00.0",
8-digit domain, upper-case hex); `pci_device_id` the 16-bit PCI device id as
"0x2684" (vendor 0x10de implied); `compute_capability` "8.9"; `architecture`
lower-case ("ada"). A value a source cannot know is None (the PCI source knows no
uuid, memory, persistence or MIG mode; nothing but NVML knows NVLink for sure).

`gather()` tries the sources in order (NVML, nvidia-smi, PCI by default); the first
that finds at least one GPU wins.
"""
from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from .arch import ARCHITECTURES, ArchError, cc_text
from .arch import architecture as _architecture_of

__all__ = [
    "GpuFactsError",
    "SOURCES",
    "architecture_for",
    "compute_capability_for",
    "cuda_version_from_int",
    "empty_facts",
    "facts_from_nvml",
    "facts_from_pci",
    "nvidia_smi_runner",
    "NVIDIA_SMI_DIRS",
    "gather",
    "open_kernel_modules_supported",
    "parse_nvidia_smi_xml",
    "pci_device_info",
]

SOURCES = ("nvml", "nvidia-smi", "pci")
NVIDIA_PCI_VENDOR = 0x10DE
# PCI class codes (upper 16 bits of the 24-bit class): VGA controller, 3D controller.
# Data-center parts (A100, H100...) are 3D controllers, desktop cards VGA controllers.
GPU_PCI_CLASSES = (0x0300, 0x0302)


class GpuFactsError(ValueError):
    """Input that cannot be turned into GPU facts (malformed XML, bad values)."""


# ---------------------------------------------------------------------------
# Architecture tables
# ---------------------------------------------------------------------------

# Compute capability -> architecture: gpufleet.arch (the one table); the tables below
# map product names and PCI ids to compute capabilities.

# nvidia-smi's <product_architecture> spellings -> our names (nvsmi_device_v11+ DTD).
_ARCHITECTURE_NAMES = {
    "kepler": "kepler", "maxwell": "maxwell", "pascal": "pascal", "volta": "volta",
    "turing": "turing",
    "ampere": "ampere", "ada lovelace": "ada", "ada": "ada", "hopper": "hopper",
    "blackwell": "blackwell",
}

# Product name -> compute capability, for XML (which does not carry it) and for
# names NVML reports. Patterns are matched in order against the lower-cased name
# with "nvidia ", "geforce ", "tesla ", "quadro " prefixes kept. Source:
# developer.nvidia.com/cuda-gpus (CUDA GPUs compute capability list).
_CC_BY_NAME = [
    # Generation words first: "RTX 5000 Ada Generation" is Ada, "Quadro RTX 5000" Turing.
    (r"\bb300\b|\bgb300\b", "10.3"),
    (r"\bb200\b|\bgb200\b|\bb100\b", "10.0"),
    (r"\bblackwell\b|geforce rtx 50\d0\b", "12.0"),
    (r"ada generation|\bl40s?\b|\bl4\b|\bl20\b|geforce rtx 40\d0\b", "8.9"),
    (r"quadro rtx|titan rtx|\bt4\b|geforce rtx 20\d0\b|geforce gtx 16\d0\b", "7.5"),
    # Hopper
    (r"\bgh200\b|\bh200\b|\bh100\b|\bh800\b|\bh20\b", "9.0"),
    # Ampere: GA100, then GA10x
    (r"\ba100\b|\ba800\b|\ba30\b", "8.0"),
    (r"\ba10g?\b|\ba16\b|\ba2\b|\ba40\b|rtx a\d{4}\b|geforce rtx 30\d0\b", "8.6"),
    # Volta
    (r"\bv100s?\b|titan v\b|gv100", "7.0"),
    # Pascal
    (r"\bp100\b", "6.0"),
    (r"\bp40\b|\bp4\b|gtx 10\d0\b|gt 1030\b|quadro p\d+|titan xp?\b", "6.1"),
    # Maxwell
    (r"\bm10\b|gtx 750\b", "5.0"),
    (r"\bm40\b|\bm60\b|\bm4\b|\bm6\b|gtx 9\d0\b|quadro m\d+", "5.2"),
]
_CC_BY_NAME = [(re.compile(pattern), cc) for pattern, cc in _CC_BY_NAME]

# PCI device id -> (product, compute capability). Names and ids from the PCI ID
# database, pci.ids (github.com/pciutils/pciids, commit c1c12547d626, 2026-08-22),
# which agrees with the "supported NVIDIA GPU products" appendix of NVIDIA's Linux
# driver README; the compute capability from developer.nvidia.com/cuda-gpus.
_PCI_DEVICES = {
    # Maxwell
    0x13BD: ("Tesla M10", "5.0"),
    0x13F2: ("Tesla M60", "5.2"),
    0x17FD: ("Tesla M40", "5.2"),
    # Pascal
    0x15F7: ("Tesla P100 PCIe 12GB", "6.0"),
    0x15F8: ("Tesla P100 PCIe 16GB", "6.0"),
    0x15F9: ("Tesla P100 SXM2 16GB", "6.0"),
    0x1B06: ("GeForce GTX 1080 Ti", "6.1"),
    0x1B38: ("Tesla P40", "6.1"),
    0x1B80: ("GeForce GTX 1080", "6.1"),
    0x1BB3: ("Tesla P4", "6.1"),
    0x1C30: ("Quadro P2000", "6.1"),
    0x1CB3: ("Quadro P400", "6.1"),
    # Volta
    0x1DB1: ("Tesla V100 SXM2 16GB", "7.0"),
    0x1DB4: ("Tesla V100 PCIe 16GB", "7.0"),
    0x1DB5: ("Tesla V100 SXM2 32GB", "7.0"),
    0x1DB6: ("Tesla V100 PCIe 32GB", "7.0"),
    0x1DF6: ("Tesla V100S PCIe 32GB", "7.0"),
    # Turing
    0x1E04: ("GeForce RTX 2080 Ti", "7.5"),
    0x1E07: ("GeForce RTX 2080 Ti Rev. A", "7.5"),
    0x1E82: ("GeForce RTX 2080", "7.5"),
    0x1E87: ("GeForce RTX 2080 Rev. A", "7.5"),
    0x1EB8: ("Tesla T4", "7.5"),
    0x1F02: ("GeForce RTX 2070", "7.5"),
    0x2182: ("GeForce GTX 1660 Ti", "7.5"),
    0x2184: ("GeForce GTX 1660", "7.5"),
    # Ampere
    0x20B0: ("A100 SXM4 40GB", "8.0"),
    0x20B1: ("A100 PCIe 40GB", "8.0"),
    0x20B2: ("A100 SXM4 80GB", "8.0"),
    0x20B3: ("A100-SXM-64GB", "8.0"),
    0x20B5: ("A100 PCIe 80GB", "8.0"),
    0x20B7: ("A30 PCIe", "8.0"),
    0x20F1: ("A100 PCIe 40GB", "8.0"),
    0x20F3: ("A800-SXM4-80GB", "8.0"),
    0x2203: ("GeForce RTX 3090 Ti", "8.6"),
    0x2204: ("GeForce RTX 3090", "8.6"),
    0x2206: ("GeForce RTX 3080", "8.6"),
    0x2216: ("GeForce RTX 3080 Lite Hash Rate", "8.6"),
    0x2230: ("RTX A6000", "8.6"),
    0x2231: ("RTX A5000", "8.6"),
    0x2235: ("A40", "8.6"),
    0x2236: ("A10", "8.6"),
    0x2237: ("A10G", "8.6"),
    0x2487: ("GeForce RTX 3060", "8.6"),
    0x2520: ("GeForce RTX 3060 Mobile / Max-Q", "8.6"),
    0x25B6: ("A2 / A16", "8.6"),
    # Ada
    0x2684: ("GeForce RTX 4090", "8.9"),
    0x2685: ("GeForce RTX 4090 D", "8.9"),
    0x26B1: ("RTX 6000 Ada Generation", "8.9"),
    0x26B5: ("L40", "8.9"),
    0x26B9: ("L40S", "8.9"),
    0x26BA: ("L20", "8.9"),
    0x27B0: ("RTX 4000 SFF Ada Generation", "8.9"),
    0x27B8: ("L4", "8.9"),
    # Hopper
    0x2321: ("H100L 94GB (H100 NVL)", "9.0"),
    0x2322: ("H800 PCIe", "9.0"),
    0x2324: ("H800", "9.0"),
    0x2329: ("H20", "9.0"),
    0x2330: ("H100 SXM5 80GB", "9.0"),
    0x2331: ("H100 PCIe", "9.0"),
    0x2339: ("H100 SXM5 94GB", "9.0"),
    0x2335: ("H200 SXM 141GB", "9.0"),
    0x233B: ("H200 NVL", "9.0"),
    0x2342: ("GH200 120GB / 480GB", "9.0"),
    0x2348: ("GH200 144G HBM3e", "9.0"),
    # Blackwell
    0x2901: ("B200", "10.0"),
    0x2941: ("HGX GB200", "10.0"),
    0x3182: ("B300 SXM6 AC", "10.3"),
    0x2B85: ("GeForce RTX 5090", "12.0"),
    0x2BB1: ("RTX PRO 6000 Blackwell Workstation Edition", "12.0"),
    0x2BB4: ("RTX PRO 6000 Blackwell Max-Q Workstation Edition", "12.0"),
    0x2BB5: ("RTX PRO 6000 Blackwell Server Edition", "12.0"),
}


def architecture_for(compute_capability):
    """Architecture name ("hopper") for a compute capability ("9.0"); None if unknown."""
    if compute_capability is None:
        return None
    try:
        return _architecture_of(compute_capability, unknown_ok=True)
    except ArchError as exc:
        raise GpuFactsError(str(exc)) from None


def compute_capability_for(name):
    """Compute capability ("8.9") for a product name ("NVIDIA GeForce RTX 4090").

    None when the name is not in the table (e.g. "Graphics Device", which old
    drivers print for parts they predate).
    """
    if not name:
        return None
    lowered = " ".join(str(name).lower().split())
    for pattern, cc in _CC_BY_NAME:
        if pattern.search(lowered):
            return cc
    return None


def pci_device_info(device_id):
    """(product, compute capability) for an NVIDIA PCI device id, or (None, None)."""
    return _PCI_DEVICES.get(int(device_id), (None, None))


def cuda_version_from_int(value):
    """NVML's CUDA driver version integer (12020) -> "12.2"."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise GpuFactsError(
            "CUDA driver version %r is not an integer such as 12020 "
            "(NVML's nvmlSystemGetCudaDriverVersion format)" % (value,)) from None
    if number <= 0:
        raise GpuFactsError(
            "CUDA driver version %r is not positive: expected NVML's format, "
            "e.g. 12020 for CUDA 12.2" % (value,))
    return "%d.%d" % (number // 1000, (number % 1000) // 10)


def open_kernel_modules_supported(facts):
    """Whether NVIDIA's open kernel modules drive every GPU in `facts`.

    The open modules support Turing (compute capability 7.5) and newer only;
    Maxwell, Pascal and Volta need the proprietary modules (NVIDIA driver README,
    "Using the Open GPU Kernel Modules"; gpufleet.arch). Returns None when there is no
    GPU or a device's compute capability is unknown (or not in the architecture table),
    so the caller decides.
    """
    devices = (facts or {}).get("devices") or []
    if not devices:
        return None
    verdict = True
    for device in devices:
        cc = device.get("compute_capability")
        if cc is None:
            return None
        name = architecture_for(cc)
        if name is None:
            return None
        if ARCHITECTURES[name]["open_kernel_modules"] == "unsupported":
            verdict = False
    return verdict


def empty_facts(source="none", driver_version=None, cuda_driver_version=None):
    """Facts for a host with no NVIDIA GPU found."""
    return {
        "present": False,
        "source": source,
        "driver_version": driver_version,
        "cuda_driver_version": cuda_driver_version,
        "count": 0,
        "nvlink": None,
        "devices": [],
    }


def _facts(source, driver_version, cuda_driver_version, devices, nvlink):
    facts = empty_facts(source, driver_version, cuda_driver_version)
    facts.update(present=bool(devices), count=len(devices), nvlink=nvlink,
                 devices=devices)
    return facts


# nvidia-smi's "Product Brand" for NVML's brand enum (nvml.h nvmlBrandType_t; nvidia-smi
# prints these names). 14 "NVIDIA" is what A100/H100/H200/A10/T4 report.
NVML_BRAND_NAMES = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "TITAN",
    7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server", 10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA Cloud Gaming", 12: "Quadro RTX", 13: "NVIDIA RTX", 14: "NVIDIA",
    15: "GeForce RTX", 16: "TITAN RTX",
}
# Data-center parts report "Tesla" (up to Volta/Turing) or plain "NVIDIA" (T4 on newer
# drivers, A10/A100/H100/H200/B200); workstation parts say Quadro / NVIDIA RTX.
_DATACENTER_BRANDS = ("tesla", "nvidia")


def is_datacenter_brand(brand):
    """True for a data-center GPU brand, False for another brand, None when unknown."""
    if not brand or " ".join(str(brand).split()).lower() == "unknown":
        return None
    return " ".join(brand.split()).lower() in _DATACENTER_BRANDS


def _device(index, name, uuid, pci_bus_id, pci_device_id, memory_total_mib,
            compute_capability, architecture, persistence_mode, mig_mode, brand=None,
            memory_reserved_mib=None):
    if compute_capability is None:
        compute_capability = compute_capability_for(name)
    if compute_capability is None and pci_device_id is not None:
        compute_capability = pci_device_info(int(pci_device_id, 16))[1]
    if architecture is None:
        architecture = architecture_for(compute_capability)
    return {
        "index": index,
        "name": name,
        "uuid": uuid,
        "pci_bus_id": pci_bus_id,
        "pci_device_id": pci_device_id,
        "memory_total_mib": memory_total_mib,
        "memory_reserved_mib": memory_reserved_mib,
        "compute_capability": compute_capability,
        "architecture": architecture,
        "persistence_mode": persistence_mode,
        "mig_mode": mig_mode,
        "brand": brand,
        "datacenter": is_datacenter_brand(brand),
    }


# ---------------------------------------------------------------------------
# nvidia-smi -q -x
# ---------------------------------------------------------------------------

_NOT_AVAILABLE = {"", "n/a", "not found", "[n/a]", "[not supported]", "not supported",
                  "unknown error", "requested functionality has been deprecated"}


def _value(element, path):
    """Stripped text at `path` under `element`, None if absent or N/A."""
    if element is None:
        return None
    text = element.findtext(path)
    if text is None:
        return None
    text = text.strip()
    if text.lower() in _NOT_AVAILABLE or text.startswith("[REDACTED"):
        return None
    return text


def _flag(element, path):
    """True for "Enabled", False for "Disabled" or N/A (e.g. Windows), None if absent."""
    text = element.findtext(path)
    if text is None:
        return None
    return text.strip().lower() == "enabled"


def parse_nvidia_smi_xml(text):
    """Facts from the output of `nvidia-smi -q -x` (any driver from R418 on).

    Reads, per <gpu>: product_name, uuid, pci/pci_bus_id (or the gpu id attribute),
    pci/pci_device_id, fb_memory_usage/total ("81559 MiB"; MIG instances' own
    fb_memory_usage blocks are ignored), persistence_mode, mig_mode/current_mig,
    product_architecture, and compute_cap if a driver ever prints it; otherwise the
    compute capability comes from the product name or PCI device id tables.
    `index` is the position in the document, which is nvidia-smi's GPU index
    (minor_number is the /dev/nvidiaN number and may differ, and is N/A on Windows).
    NVLink: true when a GPU reports an NVLink fabric (fabric/state Completed or In
    Progress, Hopper and newer on NVSwitch systems), otherwise unknown (None): the
    XML carries no per-link state.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str) or not text.strip():
        raise GpuFactsError("nvidia-smi XML is empty: expected the output of "
                            "`nvidia-smi -q -x`")
    if "<!ENTITY" in text:
        raise GpuFactsError("nvidia-smi XML declares entities, which nvidia-smi never "
                            "writes; refusing to parse it (use a real `nvidia-smi -q -x` "
                            "capture)")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GpuFactsError("nvidia-smi XML is malformed (%s): expected the complete "
                            "output of `nvidia-smi -q -x`" % exc) from None
    if root.tag != "nvidia_smi_log":
        raise GpuFactsError("XML root element is <%s>, not <nvidia_smi_log>: this is not "
                            "`nvidia-smi -q -x` output" % root.tag)

    devices = []
    fabric = False
    for index, gpu in enumerate(root.findall("gpu")):
        name = _value(gpu, "product_name")
        memory = _value(gpu, "fb_memory_usage/total")
        reserved = _value(gpu, "fb_memory_usage/reserved")
        architecture = _value(gpu, "product_architecture")
        if architecture is not None:
            architecture = _ARCHITECTURE_NAMES.get(architecture.lower(),
                                                   architecture.lower())
        cc = _value(gpu, "compute_cap")
        devices.append(_device(
            index=index,
            name=name,
            uuid=_value(gpu, "uuid"),
            pci_bus_id=_bus_id(_value(gpu, "pci/pci_bus_id") or gpu.get("id")),
            pci_device_id=_xml_device_id(_value(gpu, "pci/pci_device_id")),
            memory_total_mib=_mib(memory) if memory else None,
            memory_reserved_mib=_mib(reserved) if reserved else None,
            compute_capability=_normalise_cc(cc) if cc else None,
            architecture=architecture,
            persistence_mode=_flag(gpu, "persistence_mode"),
            mig_mode=_flag(gpu, "mig_mode/current_mig"),
            brand=_value(gpu, "product_brand"),
        ))
        state = (_value(gpu, "fabric/state") or "").lower()
        fabric = fabric or state in ("completed", "in progress")
    return _facts("nvidia-smi", _value(root, "driver_version"),
                  _value(root, "cuda_version"), devices, True if fabric else None)


def _mib(text):
    match = re.fullmatch(r"(\d+)\s*MiB", text.strip())
    if not match:
        raise GpuFactsError("GPU memory total %r is not in nvidia-smi's 'N MiB' form"
                            % text)
    return int(match.group(1))


def _xml_device_id(text):
    """nvidia-smi's "233010DE" (device then vendor) -> "0x2330"; None if unusable."""
    if not text or not re.fullmatch(r"[0-9A-Fa-f]{8}", text):
        return None
    device = int(text, 16) >> 16
    return "0x%04x" % device if device else None


def _bus_id(text):
    """Normalise a PCI address to NVML's form: 00000000:84:00.0."""
    if not text:
        return None
    match = re.fullmatch(r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})"
                         r"\.([0-7])", text.strip())
    if not match:
        return text.strip()
    domain, bus, device, function = match.groups()
    return "%08X:%02X:%02X.%s" % (int(domain or "0", 16), int(bus, 16),
                                  int(device, 16), function)


def _normalise_cc(value):
    try:
        return cc_text(value)
    except ArchError as exc:
        raise GpuFactsError(str(exc)) from None


# ---------------------------------------------------------------------------
# NVML (nvidia-ml-py's `pynvml`)
# ---------------------------------------------------------------------------

def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return value


def facts_from_nvml(nvml):
    """Facts through NVML. `nvml` is the `pynvml` module (or a stand-in for tests).

    Raises whatever NVML raises when it cannot start (pynvml.NVMLError_LibraryNotFound
    without a driver, NVMLError_DriverNotLoaded...); gather() turns that into a
    fallback. Per-device queries a GPU does not support (MIG on a GeForce card,
    NVLink on a PCIe card) give False rather than failing.
    """
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = cuda_version_from_int(nvml.nvmlSystemGetCudaDriverVersion())
        devices = []
        nvlink_known = False
        nvlink = False
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            pci = nvml.nvmlDeviceGetPciInfo(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            links = _nvml_nvlink(nvml, handle)
            if links is not None:
                nvlink_known = True
                nvlink = nvlink or links
            devices.append(_device(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_bus_id(_text(pci.busId)),
                pci_device_id="0x%04x" % ((int(pci.pciDeviceId) >> 16) & 0xFFFF),
                memory_total_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                memory_reserved_mib=_nvml_reserved_mib(nvml, handle),
                compute_capability="%d.%d" % (major, minor),
                architecture=None,
                persistence_mode=_nvml_optional(
                    nvml, lambda: nvml.nvmlDeviceGetPersistenceMode(handle)
                    == nvml.NVML_FEATURE_ENABLED),
                mig_mode=_nvml_optional(
                    nvml, lambda: nvml.nvmlDeviceGetMigMode(handle)[0]
                    == nvml.NVML_DEVICE_MIG_ENABLE),
                brand=_nvml_brand(nvml, handle),
            ))
        return _facts("nvml", driver, cuda, devices, nvlink if nvlink_known else None)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _nvml_reserved_mib(nvml, handle):
    """The driver's reserved memory in MiB, rounded up as nvidia-smi prints it; None
    when NVML has no nvmlDeviceGetMemoryInfo_v2 (drivers before R510, old nvidia-ml-py)."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        reserved = int(nvml.nvmlDeviceGetMemoryInfo(handle, version=version).reserved)
    except nvml.NVMLError:
        return None
    return -(-reserved // 2**20)


def _nvml_brand(nvml, handle):
    try:
        return NVML_BRAND_NAMES.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown")
    except (nvml.NVMLError, AttributeError):
        return None


def _nvml_optional(nvml, query):
    """False where the GPU does not support the query (NVML_ERROR_NOT_SUPPORTED)."""
    try:
        return bool(query())
    except nvml.NVMLError_NotSupported:
        return False


def _nvml_nvlink(nvml, handle):
    """True if any NVLink of the GPU is up, False if none, None if NVML cannot say."""
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            # NOT_SUPPORTED: no NVLink on this GPU; INVALID_ARGUMENT: past its last link
            continue
        except nvml.NVMLError:
            return None
        if state == nvml.NVML_FEATURE_ENABLED:
            return True
    return False


# ---------------------------------------------------------------------------
# PCI bus (sysfs), for hosts without a driver
# ---------------------------------------------------------------------------

def _read_hex(path):
    with open(path, encoding="ascii") as handle:
        return int(handle.read().strip(), 16)


def facts_from_pci(sysfs_root="/sys"):
    """NVIDIA GPUs on the PCI bus, read from `<sysfs_root>/bus/pci/devices/*`.

    Works before any driver is installed, so the driver role can choose open or
    proprietary kernel modules. A device counts when its `vendor` is 0x10de and its
    `class` is a VGA (0x0300xx) or 3D (0x0302xx) controller (NVIDIA's audio and USB
    functions on the same card are not GPUs). Names and compute capabilities come
    from the PCI device id table; uuid, memory, persistence and MIG mode are None.
    driver_version is read from `<sysfs_root>/module/nvidia/version` if the kernel
    module is loaded.
    """
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    if os.path.isdir(devices_dir):
        for address in sorted(os.listdir(devices_dir)):
            path = os.path.join(devices_dir, address)
            try:
                vendor = _read_hex(os.path.join(path, "vendor"))
                pci_class = _read_hex(os.path.join(path, "class"))
                device_id = _read_hex(os.path.join(path, "device"))
            except (OSError, ValueError):
                continue
            if vendor != NVIDIA_PCI_VENDOR or (pci_class >> 8) not in GPU_PCI_CLASSES:
                continue
            found.append((_bus_id(address), device_id))
    devices = []
    for index, (bus_id, device_id) in enumerate(found):
        name, cc = pci_device_info(device_id)
        devices.append(_device(
            index=index,
            name=name,
            uuid=None,
            pci_bus_id=bus_id,
            pci_device_id="0x%04x" % device_id,
            memory_total_mib=None,
            compute_capability=cc,
            architecture=None,
            persistence_mode=None,
            mig_mode=None,
        ))
    driver = None
    try:
        with open(os.path.join(sysfs_root, "module", "nvidia", "version"),
                  encoding="ascii") as handle:
            driver = handle.read().strip() or None
    except OSError:
        pass
    return _facts("pci", driver, None, devices, None)


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------

# Where NVIDIA's packages and the container toolkit put nvidia-smi besides the PATH.
NVIDIA_SMI_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"]


def nvidia_smi_runner(module, path=None):
    """gather()'s run_nvidia_smi for an Ansible module (its get_bin_path and run_command):
    `nvidia-smi -q -x` from `path`, or from the PATH and NVIDIA_SMI_DIRS; None when there
    is no nvidia-smi."""
    if path is None:
        path = module.get_bin_path("nvidia-smi", required=False, opt_dirs=NVIDIA_SMI_DIRS)
        if path is None:
            return None

    def run():
        rc, out, err = module.run_command([path, "-q", "-x"])
        if rc != 0:
            raise RuntimeError("%s -q -x exited %d: %s" % (path, rc, (err or out).strip()[:400]))
        return out

    return run


def _import_pynvml():
    import pynvml  # noqa: PLC0415 (optional dependency, imported only when used)
    return pynvml


def gather(sources=SOURCES, nvml=None, run_nvidia_smi=None, sysfs_root="/sys"):
    """Try `sources` in order; return (facts, probes).

    nvml: the pynvml module (imported on demand when None; an ImportError counts as
    "NVML unavailable"). run_nvidia_smi: a callable returning the text of
    `nvidia-smi -q -x`; it raises (OSError, RuntimeError...) or returns None when
    nvidia-smi is missing or fails. The first source that finds a GPU wins; if none
    does, the facts say present=false, source "none", keeping the driver and CUDA
    versions a source did report (a driver with no visible GPU). probes lists what
    each source did, for the module's output.
    """
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise GpuFactsError("unknown GPU fact source(s) %s: choose from %s"
                            % (", ".join(map(str, unknown)), ", ".join(SOURCES)))
    probes = []
    fallback = empty_facts()
    for source in sources:
        try:
            facts = _probe(source, nvml, run_nvidia_smi, sysfs_root)
        except Exception as exc:  # noqa: BLE001 (every failure means: try the next)
            probes.append({"source": source, "result": "failed",
                           "detail": "%s: %s" % (type(exc).__name__, exc)})
            continue
        if facts is None:
            probes.append({"source": source, "result": "unavailable"})
            continue
        probes.append({"source": source, "result": "ok", "count": facts["count"]})
        if facts["present"]:
            return facts, probes
        for key in ("driver_version", "cuda_driver_version"):
            fallback[key] = fallback[key] or facts[key]
    return fallback, probes


def _probe(source, nvml, run_nvidia_smi, sysfs_root):
    if source == "nvml":
        module = nvml if nvml is not None else _import_pynvml()
        return facts_from_nvml(module)
    if source == "nvidia-smi":
        if run_nvidia_smi is None:
            return None
        text = run_nvidia_smi()
        return None if text is None else parse_nvidia_smi_xml(text)
    return facts_from_pci(sysfs_root)
