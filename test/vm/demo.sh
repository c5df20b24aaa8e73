#!/usr/bin/env bash
# make demo: ferry's main job end to end on this machine, narrated.
#
# On a fresh Debian 12 machine (root, network to Debian's apt and the Go
# module proxy) it installs what it needs, builds CRI-O (cached in
# /var/cache/ferry-test), builds ferry, makes an upgrade bundle, boots a
# node VM with real systemd, udev, D-Bus and CRI-O, plugs the bundle in on
# a USB stick and shows the node load and pin every image; then the
# cluster half: a real kube-apiserver with OpenShift's ClusterVersion and
# ferry's UpgradeBundle, the administrator's approval, the upgrade ferry
# asks for, the demo playing the version operator, until upgraded.
# First run: ~15 min (CRI-O and kube-apiserver builds, guest image); then
# ~4 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
export GOFLAGS=${GOFLAGS:--tags=containers_image_openpgp}
step() { printf '\n==> %s\n' "$*"; }

step "Host packages (test/setup/install-deps.sh, test/setup/setup-vm-host.sh)"
bash test/setup/install-deps.sh
bash test/setup/setup-vm-host.sh

step "CRI-O v1.34.0 and crictl (test/setup/build-crio.sh; cached after the first build)"
FERRY_CRIO_DIR=$(bash test/setup/build-crio.sh)
export FERRY_CRIO_DIR
echo "    $FERRY_CRIO_DIR"

step "kube-apiserver v1.34.4 and OpenShift's ClusterVersion CRD (test/setup/build-apiserver.sh; cached after the first build)"
bash test/setup/build-apiserver.sh >/dev/null

step "ferry (go build ./cmd/ferry)"
mkdir -p bin
go build -trimpath -o bin/ferry ./cmd/ferry
echo "    bin/ferry: $(bin/ferry version 2>/dev/null | head -1)"

# The narration is the test's; -v streams it as it happens.
FERRY_DEMO=1 go test -count=1 -timeout 40m -run '^TestDemo$' -v ./test/vm \
  | grep --line-buffered -v -e '^=== RUN' -e '^=== PAUSE' -e '^=== CONT' -e 'level=INFO msg="qemu started"'
