#!/usr/bin/env bash
# Finish a debootstrapped Debian 12 root so it boots systemd inside a container.
# Usage: setup-rootfs.sh ROOTFS MIRROR
set -euo pipefail
R=$1 MIRROR=$2
cat > "$R/etc/apt/sources.list" <<SRC
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
SRC
# Units that make no sense in a container.
for u in systemd-remount-fs.service systemd-udevd.service systemd-udev-trigger.service \
         getty.target console-getty.service systemd-logind.service \
         systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$R/etc/systemd/system/$u"
done
echo 'gpufleet-lab' > "$R/etc/hostname"
: > "$R/etc/machine-id"
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* "$R"/usr/share/man/*
