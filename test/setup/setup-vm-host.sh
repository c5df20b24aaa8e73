#!/usr/bin/env bash
# Debian 12 host packages for the VM end-to-end tests (test/vm). Idempotent:
# installs only what is missing, so a second run takes well under a second.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  qemu-system-x86 qemu-utils          # the VMs
  mmdebstrap e2fsprogs                # guest root image, built without mounting
  dosfstools mtools fdisk             # stick images
  exfatprogs exfat-fuse               # exFAT stick images (the host kernel may lack exfat)
  kmod busybox-static cpio            # guest initramfs and modules
  util-linux socat                    # unshare, losetup; a debug line channel
  xz-utils                            # the uncompressed kernel for PVH boot
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup-vm-host: ok (${#missing[@]} installed)"
