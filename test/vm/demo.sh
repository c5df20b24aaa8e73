#!/usr/bin/env bash
# make demo: ferry's main job end to end on this machine, narrated.
#
# On a fresh Debian 12 machine (root, network to Debian's apt and the Go
# module proxy) it installs what it needs, builds CRI-O (cached in
# /var/cache/ferry-test), builds ferry, makes an upgrade bundle, boots a
# node VM with real systemd, udev, D-Bus and CRI-O, plugs the bundle in on
# a USB stick and shows the node load and pin every image.
# First run: ~10 min (CRI-O build, guest image); then ~3 min.
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

step "ferry (go build ./cmd/ferry)"
mkdir -p bin
go build -trimpath -o bin/ferry ./cmd/ferry
echo "    bin/ferry: $(bin/ferry version 2>/dev/null | head -1)"

# The narration is the test's; -v streams it as it happens.
FERRY_DEMO=1 go test -count=1 -timeout 40m -run '^TestDemo$' -v ./test/vm \
  | grep --line-buffered -v -e '^=== RUN' -e '^=== PAUSE' -e '^=== CONT' -e 'level=INFO msg="qemu started"'

step "The cluster half"
echo "    This node has no Kubernetes API: it stops at cluster-ready, where an on_ready hook or an"
echo "    administrator takes over. To have ferry start the OpenShift upgrade itself (signature"
echo "    ConfigMap, ClusterVersion desiredUpdate), follow it and clean up: apply packaging/rbac.yaml"
echo "    and set [cluster] kubeconfig (docs/admin.md, \"The cluster through its API\")."
echo "    make test runs that path against a real kube-apiserver (test/kube, test/e2e, test/netns)."
