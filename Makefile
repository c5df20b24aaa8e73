# ferry — build, test, benchmark, demo. `make help` lists the targets.
SHELL   := bash
GO      ?= go
VERSION := $(shell git describe --tags --always --dirty --match 'v[0-9]*' 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
BIN     := bin/ferry
UNIT_PKGS = $(shell $(GO) list ./... | grep -v '/test/')
# fuzz-short counts executions, not seconds: a wall-clock -fuzztime can end
# mid-call on a busy machine and fail with "context deadline exceeded"
# though nothing was found (golang/go#51484).
FUZZTIME ?= 5000x
# Tests make bundles with no route to the public signature store.
export FERRY_SIGNATURE_STORE ?=
# containers/image's policy code (imagepolicy/) verifies GPG signatures
# with Go's openpgp under this tag instead of cgo's gpgme, as CRI-O's
# builds do; every go command here, and the tests' own builds, inherit it.
export GOFLAGS ?= -tags=containers_image_openpgp

.PHONY: help build setup generate check-generate unit check-english integration e2e test fuzz fuzz-short bench bench-compare bench-cluster demo rpm faults clean

help:
	@echo "make demo   the main job end to end in a VM: bundle → stick → agent → images pinned in CRI-O"
	@echo "make test   every test: unit, real udev/CRI-O/registry/netns integration, VM end to end"
	@echo "make build  bin/ferry;  make bench  performance report (make bench-compare: vs an earlier commit; make bench-cluster: N agents at work against the API server);  make fuzz  longer fuzzing"
	@echo "make rpm    the RPM;    make e2e    only the VM tests"
	@echo "make generate  the UpgradeBundle and UpgradeBundleNode CRDs and deep copies from api/v1alpha1"

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/ferry

# What the tests need on a fresh Debian 12: packages, a CRI-O build (cached
# in /var/cache/ferry-test), a kube-apiserver build and OpenShift's
# ClusterVersion CRD (cached there too), QEMU and friends.
setup:
	bash test/setup/install-deps.sh
	bash test/setup/setup-vm-host.sh
	bash test/setup/build-crio.sh >/dev/null
	bash test/setup/build-apiserver.sh >/dev/null

# The UpgradeBundle and UpgradeBundleNode CRDs (one file) are generated from its Go types (api/v1alpha1) by
# controller-gen, pinned here and fetched from the module proxy (kept out
# of go.mod: its x/tools would raise x/net and x/crypto for the agent).
CONTROLLER_GEN = $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.19.0
CRD = packaging/upgradebundle-crd.yaml
# gen-crd OUT: the CRD, as generated from the types, into OUT.
gen-crd = tmp=$$(mktemp -d); \
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:dir=$$tmp && \
	{ cat api/crd-header.txt; grep -vx -- '---' $$tmp/ferry.io_upgradebundles.yaml; echo ---; \
	  grep -vx -- '---' $$tmp/ferry.io_upgradebundlenodes.yaml; } >$(1); \
	st=$$?; rm -rf $$tmp; test $$st = 0
generate:
	$(CONTROLLER_GEN) object paths=./api/...
	@$(call gen-crd,$(CRD))

# CI fails when the checked-in CRD is not what the types generate.
check-generate:
	@out=$$(mktemp); $(call gen-crd,$$out) && \
	if ! diff -u $(CRD) $$out; then rm -f $$out; echo "$(CRD) is not what api/v1alpha1 generates: run make generate and commit it"; exit 1; fi; \
	rm -f $$out; echo "$(CRD) is current"

unit: check-english check-generate
	$(GO) vet ./...
	$(GO) vet -tags faults,containers_image_openpgp ./test/faults
	$(GO) test -race -count=1 $(UNIT_PKGS)

# Tests assert machine reasons and golden outputs, not English: no test
# matches a status's Reason or Line against words (docs/design.md,
# "Reasons and messages"). A refusal's facts are checked in its Message.
ENGLISH_ASSERTIONS = grep -rnE 'strings\.(Contains|HasPrefix|HasSuffix)\([^,()]*\.(Reason|Line)\b,[[:space:]]*"' --include='*_test.go' agent cmd localapi peer kube cluster test
check-english:
	@n=$$($(ENGLISH_ASSERTIONS) | wc -l); echo "test assertions on English status text: $$n"; \
	if [ "$$n" != 0 ]; then $(ENGLISH_ASSERTIONS); exit 1; fi

# Brief runs of every fuzz target (CI); `make fuzz FUZZTIME=5m` for longer.
fuzz-short fuzz:
	@set -e; for pkg in $(UNIT_PKGS); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    log=$$(mktemp); \
	    if ! $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >$$log 2>&1; then \
	      tail -n 60 $$log; \
	      echo "fuzz: $$f failed; a new input that fails is under $$dir/testdata/fuzz/$$f (commit it with the fix)"; \
	      exit 1; \
	    fi; rm -f $$log; \
	  done; \
	done
fuzz: FUZZTIME = 2m

# Integration tests against the real parts (root): udev, CRI-O, registries,
# network namespaces, packaging tools. One package at a time: they share
# udevd, loop devices and CPU. Of the fault campaign (make faults), the
# disk-full fetch runs here too: it is issue 22's regression test on a
# real filesystem.
integration: build
	$(GO) test -count=1 -p 1 -timeout 60m $$($(GO) list ./test/... | grep -v '/test/vm')
	$(GO) test -tags faults,containers_image_openpgp -count=1 -timeout 10m -run 'TestFaults_AFetchThatFillsTheDiskIsAbandoned' ./test/faults

e2e: build
	$(GO) test -count=1 -timeout 45m -v ./test/vm

test: setup unit fuzz-short integration e2e

bench: setup build
	bash test/bench/run.sh

# bench-cluster: K2, a cluster at work, N real agents against the real
# API server (K2_NODES, default 10,50,100): test/bench/k2-cluster.sh.
bench-cluster: setup build
	bash test/bench/k2-cluster.sh

# bench-compare: rows (BENCH_ONLY, default "p2 p2c") of BENCH_BASE
# (default HEAD~1) and of this tree in one run, as ratios.
bench-compare: setup build
	bash test/bench/compare.sh

demo:
	bash test/vm/demo.sh

rpm:
	bash scripts/rpm.sh

faults: setup build
	bash test/faults/run.sh

clean:
	rm -rf bin dist
