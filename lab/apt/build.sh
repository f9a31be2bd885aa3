#!/usr/bin/env bash
# Build the lab's local apt repositories of STAND-IN NVIDIA packages (test doubles).
#
# The packages carry NVIDIA's real package names, versions and dependency structure
# (CUDA repository for Debian 12 / Ubuntu; libnvidia-container repository), so the
# roles install them exactly as they would install NVIDIA's. Their files only emulate
# what the lab needs: an nvidia-smi that prints the host profile's captured XML with the
# installed driver's version, an nvidia-ctk that edits daemon.json like the real one,
# systemd units for the persistence daemon and fabric manager, an nvcc that prints its
# version. No kernel module, no library code.
#
# Output (gitignored), rebuilt only when lab/apt/ or the stand-in nvidia-smi change:
#   .cache/lab/apt/cuda/debian12/x86_64/               flat repo: deb URL /
#   .cache/lab/apt/libnvidia-container/stable/deb/amd64/  flat repo: deb URL /
# Served by lab/apt/serve.sh on http://127.0.0.1:8081/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

OUT="$ROOT/.cache/lab/apt"
HASH=$(content_hash lab/apt lab/standins/nvidia-smi)
if [[ -f "$OUT/.content-hash" && "$(cat "$OUT/.content-hash")" == "$HASH" ]]; then
  exit 0
fi
for tool in dpkg-deb apt-ftparchive; do
  command -v "$tool" >/dev/null || die "$tool missing: run scripts/setup.sh (apt-utils, dpkg-dev)"
done

STAGE=$(mktemp -d /var/tmp/gpufleet-apt.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
rm -rf "$OUT"
CUDA_REPO="$OUT/cuda/debian12/x86_64"
CTK_REPO="$OUT/libnvidia-container/stable/deb/amd64"
mkdir -p "$CUDA_REPO" "$CTK_REPO"

# pkg REPO NAME VERSION ARCH DEPENDS [EXTRA-CONTROL-LINES]; files come from $PKGROOT,
# filled by the caller between `newpkg` and `pkg`.
newpkg() { PKGROOT="$STAGE/$1_$2"; rm -rf "$PKGROOT"; mkdir -p "$PKGROOT/DEBIAN"; }
pkg() {
  local repo=$1 name=$2 version=$3 arch=$4 depends=$5 extra=${6:-}
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: gpufleet lab <lab@gpufleet.invalid>"
    [[ -n "$depends" ]] && echo "Depends: $depends"
    [[ -n "$extra" ]] && printf '%s\n' "$extra"
    echo "Section: non-free/libs"
    echo "Priority: optional"
    echo "Description: gpufleet lab STAND-IN for NVIDIA's $name"
    echo " Test double with NVIDIA's package name and dependencies; emulates only what"
    echo " the gpufleet lab needs (no kernel module, no GPU code)."
  } > "$PKGROOT/DEBIAN/control"
  dpkg-deb --root-owner-group -Zgzip --build "$PKGROOT" "$repo/${name}_${version}_${arch}.deb" >/dev/null
}
script() {  # script PATH CONTENT: an executable file in the package
  mkdir -p "$PKGROOT$(dirname "$1")"
  printf '%s\n' "$2" > "$PKGROOT$1"
  chmod 0755 "$PKGROOT$1"
}
unit() {  # unit NAME DESCRIPTION EXEC: a systemd service enabled by the role, not the package
  mkdir -p "$PKGROOT/lib/systemd/system"
  printf '[Unit]\nDescription=%s (gpufleet lab stand-in)\n\n[Service]\nExecStart=%s\n\n[Install]\nWantedBy=multi-user.target\n' \
    "$2" "$3" > "$PKGROOT/lib/systemd/system/$1.service"
}
daemon() { script "$1" "#!/bin/sh
# gpufleet lab STAND-IN for NVIDIA's $(basename "$1"): stays up, does nothing.
exec sleep infinity"; }

# ---- Driver branches (CUDA repo for debian12; Ubuntu's has the same versioned metas).
# driver version -> newest CUDA it supports (nvidia-smi "CUDA Version").
# 580.65.06 and 580.95.05 are both published so that "no upgrade without the variable"
# can be shown; 535 and 550 are older branches to upgrade from, 590 (pinning package and
# unversioned metas) a newer one to upgrade to.
DRIVERS=("535.129.03 12.2" "550.127.05 12.4" "580.65.06 13.0" "580.95.05 13.0" "590.44.01 13.1")
for entry in "${DRIVERS[@]}"; do
  read -r drv cuda <<<"$entry"
  branch=${drv%%.*}
  v="$drv-1"

  # nvidia-smi and the record of which driver is installed (read by the stand-in nvidia-smi)
  newpkg nvidia-driver-cuda "$v"
  mkdir -p "$PKGROOT/usr/bin" "$PKGROOT/usr/lib/gpufleet-lab"
  install -m 0755 "$ROOT/lab/standins/nvidia-smi" "$PKGROOT/usr/bin/nvidia-smi"
  echo "$drv $cuda" > "$PKGROOT/usr/lib/gpufleet-lab/driver"
  pkg "$CUDA_REPO" nvidia-driver-cuda "$v" amd64 "python3"

  newpkg nvidia-persistenced "$v"
  daemon /usr/bin/nvidia-persistenced
  unit nvidia-persistenced "NVIDIA Persistence Daemon" /usr/bin/nvidia-persistenced
  pkg "$CUDA_REPO" nvidia-persistenced "$v" amd64 ""

  for flavor in open proprietary; do
    if [[ $flavor == open ]]; then name=nvidia-kernel-open-dkms; other=nvidia-kernel-dkms
    else name=nvidia-kernel-dkms; other=nvidia-kernel-open-dkms; fi
    newpkg "$name" "$v"
    mkdir -p "$PKGROOT/usr/src/nvidia-$drv" "$PKGROOT/usr/lib/gpufleet-lab"
    printf 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\n# gpufleet lab stand-in: no sources, nothing is built\n' "$drv" \
      > "$PKGROOT/usr/src/nvidia-$drv/dkms.conf"
    echo "$flavor $drv" > "$PKGROOT/usr/lib/gpufleet-lab/kernel-module"
    pkg "$CUDA_REPO" "$name" "$v" amd64 "" "Conflicts: $other
Replaces: $other"
  done

  newpkg nvidia-driver "$v"
  pkg "$CUDA_REPO" nvidia-driver "$v" amd64 "nvidia-driver-cuda (= $v), nvidia-persistenced (= $v)"
  # Branch metas: nvidia-open-<branch> (open modules), cuda-drivers-<branch> (proprietary).
  newpkg "nvidia-open-$branch" "$v"
  pkg "$CUDA_REPO" "nvidia-open-$branch" "$v" amd64 "nvidia-driver (= $v), nvidia-kernel-open-dkms (= $v)"
  newpkg "cuda-drivers-$branch" "$v"
  pkg "$CUDA_REPO" "cuda-drivers-$branch" "$v" amd64 "nvidia-driver (= $v), nvidia-kernel-dkms (= $v)"
  # From R590 NVIDIA's repositories choose the branch with nvidia-driver-pinning-<branch>
  # and unversioned metas (nvidia-open, cuda-drivers) of the branch's versions.
  if ((branch >= 590)); then
    # (The stand-in carries no preferences file: the role pins the version itself.)
    newpkg "nvidia-driver-pinning-$branch" "$v"
    pkg "$CUDA_REPO" "nvidia-driver-pinning-$branch" "$v" all ""
    newpkg nvidia-open "$v"
    pkg "$CUDA_REPO" nvidia-open "$v" amd64 "nvidia-driver (= $v), nvidia-kernel-open-dkms (= $v)"
    newpkg cuda-drivers "$v"
    pkg "$CUDA_REPO" cuda-drivers "$v" amd64 "nvidia-driver (= $v), nvidia-kernel-dkms (= $v)"
  fi

  newpkg "nvidia-fabricmanager-$branch" "$v"
  daemon /usr/bin/nv-fabricmanager
  unit nvidia-fabricmanager "NVIDIA fabric manager service" /usr/bin/nv-fabricmanager
  pkg "$CUDA_REPO" "nvidia-fabricmanager-$branch" "$v" amd64 "nvidia-driver (= $v)"
done

# ---- CUDA toolkits: cuda-toolkit-X-Y -> cuda-nvcc-X-Y, cuda-cudart-X-Y, files under
# /usr/local/cuda-X.Y as NVIDIA's packages lay them out.
TOOLKITS=("12.2 12.2.2 12.2.140" "12.8 12.8.1 12.8.93" "13.0 13.0.2 13.0.88")
for entry in "${TOOLKITS[@]}"; do
  read -r mm release nvccv <<<"$entry"
  dash=${mm/./-}
  newpkg "cuda-nvcc-$dash" "$nvccv-1"
  script "/usr/local/cuda-$mm/bin/nvcc" "#!/bin/sh
# gpufleet lab STAND-IN for nvcc: prints its version, compiles nothing.
echo 'nvcc: NVIDIA (R) Cuda compiler driver'
echo 'Cuda compilation tools, release $mm, V$nvccv'"
  pkg "$CUDA_REPO" "cuda-nvcc-$dash" "$nvccv-1" amd64 ""
  newpkg "cuda-cudart-$dash" "$nvccv-1"
  mkdir -p "$PKGROOT/usr/local/cuda-$mm/lib64"
  echo "gpufleet lab stand-in for libcudart $nvccv" > "$PKGROOT/usr/local/cuda-$mm/lib64/libcudart.so.${mm%%.*}"
  pkg "$CUDA_REPO" "cuda-cudart-$dash" "$nvccv-1" amd64 ""
  newpkg "cuda-toolkit-$dash" "$release-1"
  pkg "$CUDA_REPO" "cuda-toolkit-$dash" "$release-1" amd64 "cuda-nvcc-$dash (>= $nvccv), cuda-cudart-$dash (>= $nvccv)"
done

# ---- NVIDIA Container Toolkit (libnvidia-container repository):
# nvidia-container-toolkit -> nvidia-container-toolkit-base (nvidia-ctk,
# nvidia-container-runtime), libnvidia-container-tools -> libnvidia-container1.
for ctk in 1.17.8 1.18.0; do
  v="$ctk-1"
  newpkg nvidia-container-toolkit-base "$v"
  mkdir -p "$PKGROOT/usr/bin"
  sed "s/@VERSION@/$ctk/" "$ROOT/lab/apt/standins/nvidia-ctk" > "$PKGROOT/usr/bin/nvidia-ctk"
  chmod 0755 "$PKGROOT/usr/bin/nvidia-ctk"
  script /usr/bin/nvidia-container-runtime "#!/bin/sh
# gpufleet lab STAND-IN for nvidia-container-runtime: no GPU to inject, hands over to runc.
exec runc \"\$@\""
  pkg "$CTK_REPO" nvidia-container-toolkit-base "$v" amd64 "python3"
  newpkg libnvidia-container1 "$v"
  pkg "$CTK_REPO" libnvidia-container1 "$v" amd64 ""
  newpkg libnvidia-container-tools "$v"
  pkg "$CTK_REPO" libnvidia-container-tools "$v" amd64 "libnvidia-container1 (>= $v)"
  newpkg nvidia-container-toolkit "$v"
  pkg "$CTK_REPO" nvidia-container-toolkit "$v" amd64 \
    "nvidia-container-toolkit-base (= $v), libnvidia-container-tools (>= $v), libnvidia-container-tools (<< 2.0.0)"
done

for repo in "$CUDA_REPO" "$CTK_REPO"; do
  (
    cd "$repo"
    apt-ftparchive packages . > Packages
    gzip -9kn Packages
    apt-ftparchive -o APT::FTPArchive::Release::Origin="gpufleet-lab" \
      -o APT::FTPArchive::Release::Label="gpufleet lab stand-in" release . > Release
  )
done
echo "$HASH" > "$OUT/.content-hash"
log "apt: built the lab's stand-in NVIDIA repositories in $OUT"
