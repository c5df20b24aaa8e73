#!/usr/bin/env bash
# Build CRI-O and crictl from the Go module proxy (the proxy serves pinned
# versions only, and refuses version lists, so `go install ...@v` fails:
# download the module, copy it out of the read-only cache, build in it).
# The binaries are cached outside the repo, keyed on the version.
set -euo pipefail
CRIO_VERSION=${CRIO_VERSION:-v1.34.0}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
CACHE=${FERRY_CACHE:-/var/cache/ferry-test}
OUT="$CACHE/crio-$CRIO_VERSION"
TAGS="containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs btrfs_noversion seccomp"

if [ -x "$OUT/crio" ] && [ -x "$OUT/crictl" ]; then
  echo "$OUT"; exit 0
fi
mkdir -p "$OUT.tmp"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
moddir() { go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }

src=$(moddir "github.com/cri-o/cri-o@$CRIO_VERSION")
cp -r "$src" "$work/cri-o"; chmod -R u+w "$work/cri-o"
(cd "$work/cri-o" && go mod download && CGO_ENABLED=1 go build -trimpath -tags "$TAGS" -o "$OUT.tmp/crio" ./cmd/crio) >&2
(cd "$work/cri-o" && make -s -C pinns && cp bin/pinns "$OUT.tmp/pinns") >&2 || echo "pinns not built (not needed for image tests)" >&2

src=$(GONOSUMDB=sigs.k8s.io/cri-tools moddir "sigs.k8s.io/cri-tools@$CRICTL_VERSION")
cp -r "$src" "$work/cri-tools"; chmod -R u+w "$work/cri-tools"
(cd "$work/cri-tools" && GONOSUMDB=sigs.k8s.io/cri-tools go mod download && CGO_ENABLED=0 go build -trimpath -o "$OUT.tmp/crictl" ./cmd/crictl) >&2
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
