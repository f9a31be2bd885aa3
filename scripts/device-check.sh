#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, as one script: run it on a GPU machine from the
# repository root (this workplace's device machine, or any host with a driver, python3,
# nvidia-ml-py and PyTorch). It writes into $OUT (default .cache/device-check):
#   nvidia-smi-q-x.xml      the GPU's `nvidia-smi -q -x`, byte for byte (a test fixture)
#   log.txt                what Ansible printed on stderr
#   host.txt                where and when: date, kernel, driver, nvidia-smi version, GPUs
#   gpu_facts-<source>.json the gpu_facts module (Ansible, real module) through NVML, through
#                           nvidia-smi, and parsing the capture above
#   cuda.json               libcuda's own cuDriverGetVersion, to hold against what gpufleet
#                           derives from the driver version; and, for each CUDA runtime
#                           wheel in .whl (nvidia-cuda-runtime 13.2, -cu12 12.8), whether
#                           that libcudart runs on this driver (device count, an allocation)
#   memory.json             what a CUDA context and cuBLAS take outside PyTorch's allocator
#                           (the tuner's NON_TORCH_BYTES), measured the way vLLM's
#                           MemorySnapshot does (cudaMemGetInfo used minus torch reserved)
# Without Ansible installed it installs the wheels in .whl (scripts/device-check.sh
# --wheels, run where pip can download, fetches them). Nothing on the host is changed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == --wheels ]]; then
  # ansible-core and what it needs beyond the device image's packages (jinja2, PyYAML and
  # packaging are there), for its Python 3.12
  mkdir -p .whl
  # and two CUDA runtimes to try against the driver: one newer than it (13.2 on a 13.0
  # driver: minor-version compatibility) and one older (12.8)
  for p in ansible-core==2.19.14 resolvelib==1.2.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
           nvidia-cuda-runtime==13.2.86 nvidia-cuda-runtime-cu12==12.8.90; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$p" || exit 1
  done
  exit 0
fi

out=${OUT:-$PWD/.cache/device-check}
mkdir -p "$out"
py=$(command -v python3)
if ! "$py" -c 'import ansible' 2>/dev/null; then
  [[ -d .whl ]] || { echo "no Ansible and no .whl: run scripts/device-check.sh --wheels first" >&2; exit 2; }
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/device-check-site $(ls .whl/*.whl | grep -v nvidia_cuda_runtime) || exit 2
  export PYTHONPATH=/tmp/device-check-site PATH=/tmp/device-check-site/bin:$PATH
fi

{ echo "date: $(date -u +%FT%TZ)"; echo "kernel: $(uname -srm)"
  echo "driver: $(cat /proc/driver/nvidia/version 2>/dev/null | head -1)"
  nvidia-smi --version; nvidia-smi -L; } > "$out/host.txt" 2>&1
nvidia-smi -q -x > "$out/nvidia-smi-q-x.xml" || echo "nvidia-smi -q -x failed: $?" >&2

# The real module, through Ansible, on this host (explicit local host: the lab inventory
# of ansible.cfg is not read).
module() {  # NAME ARGS; the JSON result of `ansible -o` (one line: "host | STATUS => {...}")
  ANSIBLE_CONFIG=ansible.cfg ANSIBLE_FACT_CACHING=memory ANSIBLE_CALLBACKS_ENABLED=ansible.builtin.minimal \
    ansible all -i localhost, -c local -e ansible_python_interpreter="$py" -m gpufleet.fleet.gpu_facts -a "$2" -o \
    2>> "$out/log.txt" | sed -n 's/^[^|]* | [A-Z]* => //p' > "$out/gpu_facts-$1.json"
  echo "gpu_facts $1: exit ${PIPESTATUS[0]}"
}
module nvml "sources=nvml"
module nvidia-smi "sources=nvidia-smi"
module capture "nvidia_smi_xml=$out/nvidia-smi-q-x.xml"

# Each CUDA runtime wheel unpacked on its own (never on the Python path)
for w in .whl/nvidia_cuda_runtime*.whl; do
  [[ -f "$w" ]] && "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$w" "/tmp/device-check-cudart/$(basename "$w" .whl)"
done
OUT_DIR="$out" PYTHONPATH="$PWD/module_utils${PYTHONPATH:+:$PYTHONPATH}" "$py" - <<'EOF'
import ctypes, glob, json, os, subprocess, sys
from gpufleet import cuda_versions

# One process per libcudart: the runtime's version, the driver version it sees, the
# device count and a 1 MiB allocation, each with its cudaError_t (0 = success).
PROBE = r"""
import ctypes, json, sys
rt = ctypes.CDLL(sys.argv[1])
out = {}
v = ctypes.c_int()
out["cudaRuntimeGetVersion"] = [rt.cudaRuntimeGetVersion(ctypes.byref(v)), v.value]
out["cudaDriverGetVersion"] = [rt.cudaDriverGetVersion(ctypes.byref(v)), v.value]
out["cudaGetDeviceCount"] = [rt.cudaGetDeviceCount(ctypes.byref(v)), v.value]
p = ctypes.c_void_p()
out["cudaMalloc_1MiB"] = [rt.cudaMalloc(ctypes.byref(p), 1 << 20)]
out["cudaFree"] = [rt.cudaFree(p)]
print(json.dumps(out))
"""
runtimes = {}
for lib in sorted(glob.glob("/tmp/device-check-cudart/*/nvidia/**/libcudart.so.*", recursive=True)):
    proc = subprocess.run([sys.executable, "-c", PROBE, lib], capture_output=True, text=True)
    wheel = lib.split("/")[3]
    runtimes[wheel] = {"library": lib.split(wheel + "/", 1)[1], "exit": proc.returncode,
                       "result": json.loads(proc.stdout) if proc.returncode == 0 else None,
                       "stderr": proc.stderr[-2000:]}

out = os.environ["OUT_DIR"]
lib = ctypes.CDLL("libcuda.so.1")
v = ctypes.c_int()
assert lib.cuInit(0) == 0, "cuInit failed"
assert lib.cuDriverGetVersion(ctypes.byref(v)) == 0
import pynvml
pynvml.nvmlInit()
driver = pynvml.nvmlSystemGetDriverVersion()
driver = driver.decode() if isinstance(driver, bytes) else driver
found = "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)
derived = cuda_versions.driver_cuda_version(driver)
result = {"driver_version": driver, "cuDriverGetVersion": v.value, "libcuda_cuda": found,
          "gpufleet_driver_cuda_version": str(derived), "nvml_cuda_driver_version":
          pynvml.nvmlSystemGetCudaDriverVersion(), "runtimes": runtimes}
json.dump(result, open(os.path.join(out, "cuda.json"), "w"), indent=1)
print("cuda:", result)
EOF

OUT_DIR="$out" "$py" - <<'EOF'
import json, os
import pynvml, torch

out = os.environ["OUT_DIR"]
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def nvml_used():
    return pynvml.nvmlDeviceGetMemoryInfo(h).used
def snap(label):
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return {"label": label, "nvml_used": nvml_used(), "cuda_total": total,
            "cuda_used": total - free, "torch_reserved": reserved,
            "non_torch": total - free - reserved}
v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
r = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
     "nvml_total": pynvml.nvmlDeviceGetMemoryInfo(h).total, "nvml_used_before": nvml_used(),
     "nvml_v2_reserved": v2.reserved, "nvml_v2_used_before": v2.used}
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
r["after_context"] = snap("CUDA context and one tensor")
a = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
b = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
(a @ b).sum().item(); torch.cuda.synchronize()
r["after_cublas"] = snap("after a bf16 matmul (cuBLAS handle and workspace)")
del a, b; torch.cuda.empty_cache()
r["after_empty_cache"] = snap("after freeing the tensors and empty_cache")
json.dump(r, open(os.path.join(out, "memory.json"), "w"), indent=1)
print("memory:", json.dumps(r, indent=1))
EOF
ls -la "$out"
