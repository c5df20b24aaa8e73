#!/usr/bin/env bash
# Build a real kube-apiserver and kubectl (the docs' and oc wait's
# commands run with it) from the Go module proxy, and fetch
# OpenShift's ClusterVersion and MachineConfigPool CRDs from the
# github.com/openshift/api module, for the tests that play the cluster
# version operator and the machine config operator against a real API.
# Cached outside the repo, keyed on the versions; prints the cache dir.
#
# The k8s.io/kubernetes module zip holds no staging/ (nested modules are
# cut out of module zips): its ./staging replaces are dropped and the
# published k8s.io/* modules of the same release are required instead.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
STAGING_VERSION=v0${KUBE_VERSION#v1}
OPENSHIFT_API=${OPENSHIFT_API:-github.com/openshift/api@v0.0.0-20260213204242-d34f11c515b3}
CACHE=${FERRY_CACHE:-/var/cache/ferry-test}
OUT="$CACHE/kube-$KUBE_VERSION"
# OpenShift's CRDs, by the name they are cached under (the Default
# featureset's variant where there are several).
declare -A CRDS=(
  [clusterversions.crd.yaml]=config/v1/zz_generated.crd-manifests/0000_00_cluster-version-operator_01_clusterversions-Default.crd.yaml
  [machineconfigpools.crd.yaml]=machineconfiguration/v1/zz_generated.crd-manifests/0000_80_machine-config_01_machineconfigpools-Default.crd.yaml
  [clusteroperators.crd.yaml]=config/v1/zz_generated.crd-manifests/0000_00_cluster-version-operator_01_clusteroperators.crd.yaml
)
missing=()
for name in "${!CRDS[@]}"; do
  [ -s "$OUT/$name" ] || missing+=("$name")
done
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kubectl" ] && [ ${#missing[@]} -eq 0 ]; then
  echo "$OUT"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
moddir() { (cd "$work" && go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }

# k8s prepares Kubernetes' source in $work/k8s with the published
# staging modules in place of ./staging.
k8s() {
  cp -r "$(moddir "k8s.io/kubernetes@$KUBE_VERSION")" "$work/k8s"
  chmod -R u+w "$work/k8s"
  cd "$work/k8s"
  rm -rf vendor go.work go.work.sum
  python3 - "$STAGING_VERSION" <<'PY'
import re, sys
v = sys.argv[1]
s = open('go.mod').read()
staged = re.findall(r'^\s*(k8s\.io/[\w.-]+) => \./staging/src/k8s\.io/[\w.-]+\s*$', s, re.M)
s = re.sub(r'^\s*k8s\.io/[\w.-]+ => \./staging/src/k8s\.io/[\w.-]+\s*\n', '', s, flags=re.M)
for m in staged:
    s = re.sub(r'(^\s*' + re.escape(m) + r') v0\.0\.0\b', r'\1 ' + v, s, flags=re.M)
open('go.mod', 'w').write(s)
PY
}
if [ -x "$OUT/kube-apiserver" ]; then
  # A cache made before a kubectl was built: add it in place.
  if [ ! -x "$OUT/kubectl" ]; then
    (k8s && GOFLAGS=-mod=mod go build -trimpath -o "$OUT/.kubectl.tmp" ./cmd/kubectl >&2)
    mv "$OUT/.kubectl.tmp" "$OUT/kubectl"
  fi
  # A cache made before a CRD was added to the list: add it in place
  # (renamed in, so that a test starting meanwhile never reads half).
  api=$(moddir "$OPENSHIFT_API")
  for name in "${missing[@]}"; do
    cp "$api/${CRDS[$name]}" "$OUT/.$name.tmp"
    mv "$OUT/.$name.tmp" "$OUT/$name"
  done
  echo "$OUT"; exit 0
fi
mkdir -p "$OUT.tmp"
api=$(moddir "$OPENSHIFT_API")
for name in "${!CRDS[@]}"; do
  cp "$api/${CRDS[$name]}" "$OUT.tmp/$name"
done
k8s
GOFLAGS=-mod=mod go build -trimpath -o "$OUT.tmp/kube-apiserver" ./cmd/kube-apiserver >&2
GOFLAGS=-mod=mod go build -trimpath -o "$OUT.tmp/kubectl" ./cmd/kubectl >&2
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
