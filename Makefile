# stratad developer tasks. `make help` lists them.
# Everything runs inside ./.venv, which `make dev` creates on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help dev build run test test-fast test-slow lint format typecheck stubtest \
        rust-check proto proto-check core-purity bench clean deploy-check s3-server \
        go-tools deploy-tools proto-lint go-gen go-check chromium ts-client ts-proto interop-tools

help: ## List the targets with a one-line description
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Installing stratad builds its Rust core (maturin, then cargo): minutes on a
# first run. pip hides a build's output unless --verbose, and --verbose is
# mostly pip's own chatter: the whole log goes to $(INSTALL_LOG), and only
# cargo's Compiling/Finished lines and the result reach the terminal (on a
# failure, the log's last lines too).
INSTALL_LOG  := $(VENV)/install.log
BUILD_LINES  := ^ *(Compiling|Finished|Successfully installed|ERROR:|error)

$(STAMP): pyproject.toml Cargo.toml $(wildcard rust/*/Cargo.toml)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@echo "building the Rust core (first time: ~3-4 min; full log in $(INSTALL_LOG))..."
	@bash -o pipefail -c "$(PIP) install --verbose --progress-bar off -e '.[dev]' 2>&1 \
		| tee $(INSTALL_LOG) | { grep --line-buffered -E '$(BUILD_LINES)' || true; }" \
		|| { echo "pip install failed; the end of $(INSTALL_LOG):"; tail -n 30 $(INSTALL_LOG); exit 1; }
	@touch $(STAMP)

dev: $(STAMP) ## Create .venv and install stratad editable with dev tools (builds the Rust core)

build: $(STAMP) ## Rebuild the Rust extension into the source tree after a Rust change
	$(VENV)/bin/maturin develop --release --quiet

run: $(STAMP) ## Set up and run the daemon on 127.0.0.1:50051 with ./stratad-data
	$(VENV)/bin/stratad serve

test: build s3-server go-tools ## Set up (S3 test server and grpcurl for the docs check included) and run the whole test suite
	$(PY) -m pytest -q

test-slow: build s3-server go-tools ## Run the test suite including long soak tests (e.g. 50 crash rounds)
	$(PY) -m pytest -q --runslow

lint: $(STAMP) ## ruff lint + format check; import contracts (layers point down, no circles)
	$(VENV)/bin/ruff check python tests bench scripts examples
	$(VENV)/bin/ruff format --check python tests bench scripts examples
	$(VENV)/bin/lint-imports
	$(PY) scripts/gen_sync_client.py --check

format: $(STAMP) ## Format Python and Rust code
	$(VENV)/bin/ruff format python tests bench scripts examples
	$(VENV)/bin/ruff check --fix python tests bench scripts examples
	cargo fmt --all

typecheck: $(STAMP) ## mypy --strict over python/stratad
	$(VENV)/bin/mypy

stubtest: build ## Check the hand-written _core.pyi against the built extension
	$(PY) -m mypy.stubtest stratad._core

rust-check: ## cargo fmt --check, clippy -D warnings, cargo test
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo test --workspace

proto: $(STAMP) ## Regenerate python/stratad/api/v1 from proto/
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP) ## Fail if the committed generated code differs from proto/
	$(PY) scripts/gen_proto.py --check

.PHONY: sdk-gen
sdk-gen: $(STAMP) ## Regenerate the blocking SDK client's methods (sdk/_sync_methods.py) from the async ones
	$(PY) scripts/gen_sync_client.py

go-tools: ## Build (once, cached in ~/.cache/stratad-tools/bin) buf, protoc-gen-go, protoc-gen-go-grpc, grpcurl; needs Go
	bash scripts/go-tools.sh install

proto-lint: ## buf lint (STANDARD) and buf breaking against the previous commit (HEAD~1)
	bash scripts/buf-check.sh lint
	bash scripts/buf-check.sh breaking

go-gen: ## Regenerate the Go client's code (clients/go/stratadv1) from proto/
	bash scripts/buf-check.sh gen-go

go-check: ## Fail if clients/go/stratadv1 is stale, or clients/go is not gofmt-clean or fails go vet
	bash scripts/buf-check.sh check-go
	@out=$$(cd clients/go && gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	cd clients/go && go vet ./...

ts-client: $(STAMP) ## TypeScript client: npm ci if stale, build, generated-code freshness, tsc
	scripts/ts-client-deps.sh
	cd clients/ts && STRATAD_PYTHON=$(abspath $(PY)) npm run --silent check:generated
	cd clients/ts && npm run --silent typecheck

ts-proto: $(STAMP) ## Regenerate clients/ts/src/gen from proto/ (after `make proto`)
	scripts/ts-client-deps.sh
	cd clients/ts && STRATAD_PYTHON=$(abspath $(PY)) npm run --silent generate

core-purity: ## Fail if the pure Rust core depends on pyo3
	@if cargo tree -p stratad-core -e normal | grep -qi pyo3; then \
		echo "stratad-core must not depend on pyo3"; exit 1; \
	else echo "stratad-core is pyo3-free"; fi

bench: build ## Run every benchmark and update docs/benchmarks.md
	@for b in bench/[a-z]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The wheel (docs/install.md): abi3 (CPython >= 3.11), manylinux x86_64, in dist/.
# `make wheel ZIG=1`: linked by zig against glibc 2.17 (manylinux2014; a second,
# cross release build). `make wheel-test` installs it into a fresh venv with no
# Rust on PATH and runs the daemon, the SDK and the LangGraph saver from there.
.PHONY: wheel wheel-test
ZIG ?= 0

wheel: ## Build the stratad wheel into dist/ (abi3, manylinux; needs Rust; ZIG=1: manylinux2014 via zig)
	ZIG=$(ZIG) bash scripts/build-wheel.sh

wheel-test: $(STAMP) wheel ## Install dist/'s wheel without Rust: an agent venv (no daemon deps) and a [server] venv; serve, SDK, LangGraph
	STRATAD_WHEEL="$$(ls dist/stratad-*.whl)" $(PY) -m pytest -q tests/e2e/test_wheel_install.py

deploy-check: $(STAMP) ## Check deploy/ offline: hadolint, Dockerfile build steps, helm lint/template, kubeconform
	bash scripts/check_deploy.sh

deploy-tools: ## Install deploy-check's tools only (helm, kubeconform, hadolint, schemas) into .tools/
	bash scripts/check_deploy.sh --tools-only

# Deployment tested for real (docs/deploy.md "What CI proves"): a Docker engine
# (Debian's docker.io, dockerd started by scripts/docker/engine.sh) builds
# deploy/Dockerfile from local Debian bases when no registry is reachable; a
# one-node Kubernetes built from source (scripts/k8s/cluster.sh, binaries cached
# under ~/.cache/stratad-k8s) runs the image as a sidecar.
.PHONY: image image-test k8s-build k8s-up k8s-down k8s-test

image: ## Build the stratad image with a real Docker engine (starts dockerd if needed; local bases if no registry)
	bash scripts/docker/image.sh

image-test: $(STAMP) image ## Run the image's tests against real containers (non-root, read-only, health, socket, SIGTERM)
	STRATAD_REQUIRE_DOCKER=1 $(PY) -m pytest -q tests/image

k8s-build: ## Build (once, cached in ~/.cache/stratad-k8s) the Kubernetes binaries from source; needs Go
	bash scripts/k8s/cluster.sh build

k8s-up: k8s-build ## Start a one-node Kubernetes (etcd, apiserver, scheduler, controller-manager, containerd, kubelet)
	bash scripts/k8s/cluster.sh up

k8s-down: ## Stop the one-node Kubernetes and remove its state
	bash scripts/k8s/cluster.sh down

k8s-test: $(STAMP) image k8s-up ## Run the sidecar in real pods: manifests, Helm chart, shutdown order, S3 scale-out
	STRATAD_REQUIRE_K8S=1 $(PY) -m pytest -q tests/k8s

s3-server: ## Build (once, cached in .tools/bin) the SeaweedFS S3 server the tests use; needs Go
	bash scripts/s3-test-server.sh build

interop-tools: ## Build (once, cached in ~/.cache/stratad-tools) grpc-go's interop client and server, and h2spec, for tests/interop and tests/edge; needs Go
	bash scripts/interop-tools.sh build
	bash scripts/h2spec.sh build

chromium: ## Install headless Chromium + chromedriver (Debian packages) for the inspector's browser test
	bash scripts/install-chromium.sh

clean: ## Remove build outputs (keeps .venv)
	cargo clean
	rm -rf dist .pytest_cache .mypy_cache .ruff_cache
