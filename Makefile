# gpuwarden: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := build

GO      ?= go
CC      ?= gcc
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# -fno-ipa-icf: uprobes attach by address, so no two entry points may share a body.
CFLAGS  := -std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror -fvisibility=hidden -fno-ipa-icf -pthread
GOFLAGS_LD := -ldflags "-X main.version=$(VERSION)"
DURATION ?= 0

SIMGPU_STATE_SRC := simgpu/state/state.c simgpu/state/state.h
SIMGPU_CUDA_SRC  := $(wildcard simgpu/cuda/*.c) $(wildcard simgpu/cuda/*.h) simgpu/include/cuda.h simgpu/include/cuda_procaddr.h simgpu/include/cuda_ctx_flags.h simgpu/include/cuda_errors.h
SIMGPU_NVML_SRC  := $(wildcard simgpu/nvml/*.c) $(wildcard simgpu/nvml/*.h) simgpu/include/nvml.h simgpu/include/nvml_errors.h
GO_SRC           := $(shell find . -name '*.go' -not -path './bin/*') go.mod go.sum

# Each part adds its outputs and Debian packages to these (see its build.mk).
BUILD_TARGETS := $(BIN)/gpuwarden simgpu
TEST_EXTRA    :=
DEPS_BUILD    := gcc make
DEPS_TEST     := gcc make
DEPS_GENERATE := gcc make
-include bpf/build.mk enforcer/interposer/build.mk dashboards/build.mk deploy/build.mk

##@ Build

.PHONY: build
build: deps-build $(BUILD_TARGETS) ## Build everything into bin/

.PHONY: simgpu
simgpu: $(BIN)/simgpu/libcuda.so.1 $(BIN)/simgpu/libnvidia-ml.so.1 $(BIN)/simgpu/workload $(BIN)/simgpu/cuda-check $(BIN)/simgpu/visible-check ## Build the simulated GPU and its programs

$(BIN)/gpuwarden: $(GO_SRC)
	@mkdir -p $(@D)
	$(GO) build $(GOFLAGS_LD) -o $@ ./cmd/gpuwarden

$(BIN)/simgpu/libcuda.so.1: $(SIMGPU_CUDA_SRC) $(SIMGPU_STATE_SRC)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isimgpu/include -Isimgpu/state -shared -Wl,-soname,libcuda.so.1 -o $@ \
		$(filter %.c,$^)

$(BIN)/simgpu/libnvidia-ml.so.1: $(SIMGPU_NVML_SRC) $(SIMGPU_STATE_SRC)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isimgpu/include -Isimgpu/state -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ \
		$(filter %.c,$^)

$(BIN)/simgpu/workload: simgpu/workload/workload.c simgpu/include/cuda.h $(BIN)/simgpu/libcuda.so.1
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -ldl -Wl,-rpath,'$$ORIGIN'

$(BIN)/simgpu/cuda-check: simgpu/tests/cuda_check.c simgpu/include/cuda.h $(BIN)/simgpu/libcuda.so.1
	$(CC) -std=gnu11 -O1 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -ldl -Wl,-rpath,'$$ORIGIN'

$(BIN)/simgpu/visible-check: simgpu/tests/visible_check.c simgpu/include/cuda.h simgpu/include/nvml.h \
		$(BIN)/simgpu/libcuda.so.1 $(BIN)/simgpu/libnvidia-ml.so.1
	$(CC) -std=gnu11 -O1 -g -Wall -Wextra -Werror -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -l:libnvidia-ml.so.1 -Wl,-rpath,'$$ORIGIN'

.PHONY: generate
generate: deps-generate ## Regenerate generated code (eBPF objects, bindings)
	$(GO) generate ./...

##@ Test

.PHONY: test
test: deps-test build ## Run every Go and C test (privileged tests need root)
	$(GO) vet ./...
	$(GO) test -count=1 -p 1 -timeout 20m ./...  # one package at a time: timing tests need the CPUs they measure
	$(if $(TEST_EXTRA),$(MAKE) --no-print-directory $(TEST_EXTRA))

.PHONY: bench
bench: build ## Print benchmark figures as BENCH lines
	$(BIN)/gpuwarden bench

.PHONY: demo
demo: build ## Run the demo on the simulated GPU until Ctrl-C (DURATION=20s to stop by itself)
	$(BIN)/gpuwarden demo --duration $(DURATION)

##@ Dependencies

.PHONY: deps-build deps-test deps-generate
deps-build:
	@.ci/deps.sh $(DEPS_BUILD)
deps-test:
	@.ci/deps.sh $(sort $(DEPS_BUILD) $(DEPS_TEST))
deps-generate:
	@.ci/deps.sh $(DEPS_GENERATE)

##@ Other

.PHONY: clean
clean: ## Remove build outputs
	rm -rf $(BIN)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9\/.-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
