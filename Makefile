# kubescribe — see README.md. The two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
BIN := $(CURDIR)/bin
KUBE_APISERVER := $(BIN)/kube-apiserver
ETCD := $(BIN)/etcd
# What every run of the real control plane (test/controlplane) is pointed at.
CONTROL_PLANE_ENV := KUBE_APISERVER=$(KUBE_APISERVER) ETCD=$(ETCD)
# Every Go build make runs uses the image's flags (hack/image: CGO_ENABLED=0, -trimpath): the
# tests, the image and the binaries the tests start then share one build cache, so a cold
# make test compiles each package once, not once per set of flags (docs/testing.md#how-long-make-test-takes).
# GOFLAGS keeps what `go env` says besides (an environment variable replaces go env's file).
export CGO_ENABLED := 0
export GOFLAGS := $(strip -trimpath $(filter-out -trimpath,$(shell $(GO) env GOFLAGS)))
# Debian packages the tests and the demo start for real (etcd is built: see the etcd target).
DEB_PACKAGES := redis-server git ca-certificates openssh-client gnupg

.PHONY: all build image test test-unit test-e2e fuzz demo generate verify-generate bench load load-snapshot lint deps kube-apiserver etcd clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## image: the container image, built without Docker or a registry (hack/image, its own module) as
## bin/kubescribe-image.tar, for ctr -n k8s.io images import, kind load image-archive or
## docker load (docs/install.md). The same commit gives the same digest. IMAGE names it,
## IMAGE_ARCH picks its GOARCH (default: this machine's), IMAGE_FLAGS passes more (-ca-bundle).
IMAGE ?= kubescribe:dev
image:
	cd hack/image && $(GO) run . -repo $(CURDIR) -image $(IMAGE) -out $(BIN)/kubescribe-image.tar \
	  $(if $(IMAGE_ARCH),-arch $(IMAGE_ARCH)) $(IMAGE_FLAGS)

## deps: install the Debian packages the tests and the demo need (skipped when present).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	$(GO) mod download

## kube-apiserver: build the real kube-apiserver (k8s.io/kubernetes v1.37.2) from its own module.
kube-apiserver: $(KUBE_APISERVER)
# The version is stamped as upstream's release build does, so /version reports v1.37.2.
KUBE_VERSION := v1.37.2
KUBE_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
	-X k8s.io/component-base/version.gitTreeState=clean
$(KUBE_APISERVER): test/kube-apiserver/go.mod test/kube-apiserver/go.sum
	cd test/kube-apiserver && $(GO) build -ldflags "$(KUBE_LDFLAGS)" -o $(KUBE_APISERVER) k8s.io/kubernetes/cmd/kube-apiserver

## etcd: build etcd v3.7.0, the version kube-apiserver v1.37.2's module graph pins, from its own
## module (Debian's etcd 3.4 is too old for the apiserver's watch-list: docs/testing.md).
etcd: $(ETCD)
# No ldflags: etcd's version is a constant of its source (go.etcd.io/etcd/api/v3/version), so
# `etcd --version` reports 3.7.0 as built; upstream's build stamps only the Git SHA, which the
# module proxy's copy does not carry.
$(ETCD): test/etcd/go.mod test/etcd/go.sum
	cd test/etcd && $(GO) build -o $(ETCD) go.etcd.io/etcd/server/v3

## node-binaries: kubelet, kube-proxy, kube-controller-manager and kube-scheduler v1.37.2, built
## from the same module (test/kube-apiserver) and k8s.io/kubernetes as kube-apiserver, with the
## same version stamp, for test/cluster's real node.
.PHONY: node-binaries cluster-test
NODE_COMPONENTS := kubelet kube-proxy kube-controller-manager kube-scheduler
NODE_BINARIES := $(addprefix $(BIN)/,$(NODE_COMPONENTS))
node-binaries: $(NODE_BINARIES)
$(NODE_BINARIES) &: test/kube-apiserver/go.mod test/kube-apiserver/go.sum
	cd test/kube-apiserver && $(GO) build -ldflags "$(KUBE_LDFLAGS)" -o $(BIN)/ $(addprefix k8s.io/kubernetes/cmd/,$(NODE_COMPONENTS))
# What the node runs besides them (containerd 1.6, runc, the bridge and host-local CNI plugins,
# iptables for kube-proxy and the guard rules), nftables, whose `nft` the tear-down's check
# reads the rules with, and busybox-static, whose sh, cat and grep go into the test's Redis image.
DEB_PACKAGES += containerd runc containernetworking-plugins iptables nftables busybox-static

## cluster-test: test/cluster's tests on a real single-node cluster, which they bring up and tear
## down themselves, checking that nothing is left on the machine; kubescribe's quickstart overlay
## is installed there with the image of make image (root; docs/testing.md#a-real-node).
cluster-test: deps kube-apiserver etcd node-binaries image
	KUBESCRIBE_NODE=1 $(CONTROL_PLANE_ENV) $(GO) test -count=1 -timeout 15m -v ./test/cluster/

## cluster-clean: tear down what a node left when its test binary died before its tear-down
## (killed, timed out), from the snapshot it kept (DIR=<run directory>, else every one no living
## process owns); the next bring-up does it by itself.
.PHONY: cluster-clean
cluster-clean:
	$(GO) run ./test/cluster/cmd/cleanup $(DIR)

verify-generate:
	hack/verify-generate.sh

generate:
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/... \
	  crd:crdVersions=v1 output:crd:artifacts:config=deploy/crds

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd hack/image && $(GO) vet ./...

# test: every test: go test ./... (test/e2e in two processes), hack/image's tests (a module of
# its own, which go test ./... does not reach: its test builds the image twice and compares the
# digests), make fuzz-endpoints and make cluster-test, side by side where they can be
# (hack/test.sh).
test: deps
	$(CONTROL_PLANE_ENV) GO=$(GO) MAKE=$(MAKE) hack/test.sh

## fuzz: every decoder of what a caller sends, fuzzed for FUZZTIME each (the seed corpora also
## run in every plain go test). A crash is saved under the package's testdata/fuzz/ and fails
## the run. FUZZTIME is a count of executions, not a duration: Go 1.26's fuzz coordinator can
## fail a duration-bounded run with "context deadline exceeded" and no crasher when the
## deadline meets a busy worker (go.dev/issue/75804, fixed in Go 1.27); a count never arms that
## deadline. 50000 runs take 3-15 s per target on 2 cores. A fuzz build instruments every
## package of its test binary, a build of its own: the tag kubescribe_fuzz leaves out test files
## whose imports would only add to it (docs/testing.md#fuzzing).
## fuzz-endpoints, part of make test: the decoders of what a network caller sends to
## kubescribe's HTTP endpoints (the audit batches, both admission webhooks' reviews).
FUZZTIME ?= 50000x
FUZZ_ENDPOINT_TARGETS := \
	./internal/admission:FuzzCandidate \
	./internal/audit:FuzzDecode \
	./internal/authz:FuzzDecodeReview
FUZZ_TARGETS := $(FUZZ_ENDPOINT_TARGETS) \
	./internal/controller:FuzzRestConfigFromKubeconfig
.PHONY: fuzz-endpoints
fuzz:
	@$(call fuzz-each,$(FUZZ_TARGETS))
fuzz-endpoints:
	@$(call fuzz-each,$(FUZZ_ENDPOINT_TARGETS))
define fuzz-each
set -e; for t in $(1); do \
  pkg=$${t%%:*}; fn=$${t##*:}; \
  echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
  $(GO) test -tags kubescribe_fuzz -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; \
done
endef

## test-unit: unit tests only (no real components needed).
test-unit:
	$(GO) test -count=1 -short ./...
	cd hack/image && $(GO) test -count=1 -short ./...

## test-e2e: the end-to-end tests against the real control plane only.
test-e2e: deps kube-apiserver etcd
	$(CONTROL_PLANE_ENV) $(GO) test -count=1 -timeout 30m ./test/...

demo: deps kube-apiserver etcd
	$(CONTROL_PLANE_ENV) $(GO) run ./test/demo

## bench: Go benchmarks, each reported as a ratio to its same-run baseline (hack/bench.sh).
bench:
	hack/bench.sh

## load: load test against the real stack (docs/operations.md#load-test); LOAD_FLAGS, e.g.
## LOAD_FLAGS=-duration=20s, are passed to test/load.
load: deps kube-apiserver etcd
	$(CONTROL_PLANE_ENV) $(GO) run ./test/load $(LOAD_FLAGS)

## load-snapshot: issue 5's measurement (e): a 10,000-ConfigMap snapshot and 10,000 further commits
## against the real control plane, with kubescribe's RSS (test/snapshotload; not part of make test).
## Flags through LOAD_SNAPSHOT_FLAGS, e.g. LOAD_SNAPSHOT_FLAGS="-pprof -gctrace".
load-snapshot: deps kube-apiserver etcd
	$(CONTROL_PLANE_ENV) $(GO) run ./test/snapshotload $(LOAD_SNAPSHOT_FLAGS)

clean:
	rm -rf $(BIN)
