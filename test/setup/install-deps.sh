#!/usr/bin/env bash
# Debian 12 packages the tests and benchmarks need. Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  gcc make pkg-config libseccomp-dev          # cgo for CRI-O
  conmon runc golang-github-containers-common # CRI-O runtime bits, policy.json
  docker-registry skopeo minisign openssl     # outside checkers
  tar coreutils util-linux e2fsprogs dosfstools mtools udev kmod iproute2
  genisoimage                                 # test/vm: a bundle on an ISO, as BMC virtual media
  exfatprogs exfat-fuse                       # test/vm: an exFAT stick, written without the kernel's exfat
  curl ca-certificates rpm time rpm2cpio cpio      # rpm: make rpm and test/packaging
  systemd zsh fish                            # systemd-analyze; completion tests
  dbus-daemon                                 # systemd/reload_dbus_test.go: a private bus
  shellcheck                                  # test/packaging: the MachineConfig's installer script
  etcd-server                                 # test/kubeenv: the real API server's store
  fio                                         # test/bench/n1-etcd-fsync.sh: etcd's WAL pattern
  prometheus                                  # promtool (test/packaging: the PrometheusRule); a real Prometheus scraping an agent (test/kube)
  libgpgme-dev                                # a bare go build without GOFLAGS' containers_image_openpgp tag
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: ok (${#missing[@]} installed)"
