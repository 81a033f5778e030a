# deploy/build.mk: the Helm chart's tests (included by the top Makefile).
# They are a Go module of their own (deploy/helm/chart_test), so Helm's
# dependency tree stays out of the agent's go.mod; `go test ./...` from the
# root does not enter nested modules, so `make test` runs them through
# TEST_EXTRA. The device plugin's tests are in the root module
# (go test ./deploy/...).

##@ Deploy

.PHONY: chart-test
chart-test: $(BIN)/gpuwarden ## Lint and render the Helm chart with Helm's Go packages; decode every object strictly
	cd deploy/helm/chart_test && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

TEST_EXTRA += chart-test

# The real-GPU check (deploy/gpucheck, its bundle's sources in deploy/gpucheck/bundle): everything a bare
# GPU machine needs, in one directory that is copied there and run as
# `bin/gpu-check/run.sh OUTDIR`. Its tools link libcuda.so.1 without an
# rpath, so on a GPU machine they load NVIDIA's driver; simgpu's copy rides
# along for --simulate, which `make test` runs (deploy/gpucheck's test).
# lib/launch-shim-{tail,add,lock}.so are part 5's three launch wrappers.
GPU_CHECK     := $(BIN)/gpu-check
GPU_CHECK_MAX := 62914560 # 60 MiB
DEPS_TEST     += python3 # part 4's host-pace row runs in --simulate too

.PHONY: gpu-check
gpu-check: build ## Build the real-GPU check's bundle into bin/gpu-check (run.sh OUTDIR runs it)
	@rm -rf $(GPU_CHECK) && mkdir -p $(GPU_CHECK)/bin $(GPU_CHECK)/lib $(GPU_CHECK)/tools $(GPU_CHECK)/simgpu $(GPU_CHECK)/include/simgpu $(GPU_CHECK)/src
	cp deploy/gpucheck/bundle/run.sh $(GPU_CHECK)/
	cp deploy/gpucheck/bundle/cuda_paths.cu deploy/gpucheck/bundle/devtime.c deploy/gpucheck/bundle/train.py deploy/gpucheck/bundle/hostpace.py deploy/gpucheck/bundle/torch_quota.py $(GPU_CHECK)/src/
	cp $(BIN)/gpuwarden $(GPU_CHECK)/bin/
	cp $(BIN)/libgpuwarden.so $(GPU_CHECK)/lib/
	cp $(BIN)/simgpu/libcuda.so.1 $(BIN)/simgpu/libnvidia-ml.so.1 $(BIN)/simgpu/workload $(GPU_CHECK)/simgpu/
	cp simgpu/include/cuda.h simgpu/include/nvml.h $(GPU_CHECK)/include/simgpu/
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $(GPU_CHECK)/tools/cuda-alloc \
		bpf/testdata/cuda_alloc.c -L$(BIN)/simgpu -l:libcuda.so.1
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $(GPU_CHECK)/tools/calibrate \
		deploy/gpucheck/bundle/calibrate.c -L$(BIN)/simgpu -l:libcuda.so.1 -l:libnvidia-ml.so.1
	$(foreach s,tail:0 add:1 lock:2,$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -Isimgpu/include \
		-DGW_SHIM_AFTER=$(lastword $(subst :, ,$(s))) -o $(GPU_CHECK)/lib/launch-shim-$(firstword $(subst :, ,$(s))).so \
		deploy/gpucheck/bundle/launch_shim.c -ldl &&) true
	@size=$$(du -sb $(GPU_CHECK) | cut -f1); echo "gpu-check: $(GPU_CHECK) is $$((size / 1048576)) MiB"; \
		[ $$size -le $(GPU_CHECK_MAX) ] || { echo "gpu-check: the bundle is over 60 MiB" >&2; exit 1; }

# make test runs the check's simulation mode from the bundle.
test: gpu-check

# The end-to-end tests on a real single-node cluster (deploy/k8stest, a Go
# module of its own; deploy/k8stest/kubernetes and deploy/k8stest/containerd,
# two others, pin the Kubernetes, etcd and containerd that cluster.sh builds),
# part of `make test`. The first run on a machine builds Kubernetes and
# containerd (about 15 and 3 minutes on two cores, Go's build cache empty)
# into GPUWARDEN_K8S_CACHE, where later runs find them.
# cluster.sh runs the tests inside the cluster's network namespace and
# restores the host after, even when they fail; a host that cannot run a
# cluster skips them, or fails under GPUWARDEN_REQUIRE_PRIVILEGED=1.
# Its packages share one cluster, so they run one at a time (-p 1).
DEPS_K8S := runc containernetworking-plugins iptables busybox-static iproute2 util-linux openssl gcc libc6-dev
DEPS_TEST += $(DEPS_K8S)

.PHONY: k8s-test
k8s-test: build ## Run only the end-to-end tests on a real Kubernetes node (root; the first run builds Kubernetes and containerd)
	@.ci/deps.sh $(DEPS_K8S)
	cd deploy/k8stest && $(GO) vet ./...
	cd deploy/k8stest && ./cluster.sh run $(GO) test -p 1 -count=1 -timeout 20m -v ./...

TEST_EXTRA += k8s-test
