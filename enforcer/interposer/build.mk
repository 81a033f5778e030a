# enforcer/interposer: libgpuwarden.so and its test programs (included by the top Makefile).
GW_DIR      := enforcer/interposer
GW_SRC      := $(wildcard $(GW_DIR)/src/*.c)
GW_HDR      := $(wildcard $(GW_DIR)/src/*.h) $(GW_DIR)/gpuwarden_abi.h simgpu/include/cuda.h simgpu/include/nvml.h
GW_INC      := -Isimgpu/include -I$(GW_DIR) -I$(GW_DIR)/src
GW_TESTPROG := $(BIN)/interposer/gw-check $(BIN)/interposer/gw-bench $(BIN)/interposer/gw-envcheck

BUILD_TARGETS += $(BIN)/libgpuwarden.so $(GW_TESTPROG)
DEPS_TEST     += clang libclang-rt-dev

# Only the hooks are exported (visibility hidden + the version script).
$(BIN)/libgpuwarden.so: $(GW_SRC) $(GW_HDR) $(GW_DIR)/exports.map
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(GW_INC) -shared -Wl,--version-script=$(GW_DIR)/exports.map \
		-Wl,-soname,libgpuwarden.so -Wl,-z,now -o $@ $(GW_SRC) -ldl -pthread

# Test programs link simgpu's driver directly (the "direct" hook path) and
# reach it by dlsym and cuGetProcAddress too; run them with LD_PRELOAD.
$(BIN)/interposer/gw-check: $(GW_DIR)/tests/gw_check.c simgpu/include/cuda.h simgpu/include/nvml.h $(BIN)/simgpu/libcuda.so.1 $(BIN)/simgpu/libnvidia-ml.so.1
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O1 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -l:libnvidia-ml.so.1 -ldl -Wl,-rpath,'$$ORIGIN/../simgpu'

$(BIN)/interposer/gw-bench: $(GW_DIR)/tests/gw_bench.c simgpu/include/cuda.h $(BIN)/simgpu/libcuda.so.1
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN/../simgpu'

# The C environment and cgroup parsers on their own, for the Go twins' differential tests.
$(BIN)/interposer/gw-envcheck: $(GW_DIR)/tests/gw_envcheck.c $(GW_DIR)/src/env.c $(GW_DIR)/src/env.h \
		$(GW_DIR)/src/vocab_gen.h $(GW_DIR)/src/cgroup.c $(GW_DIR)/src/cgroup.h $(GW_DIR)/gpuwarden_abi.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O1 -g -Wall -Wextra -Werror $(GW_INC) -o $@ $< $(GW_DIR)/src/env.c $(GW_DIR)/src/cgroup.c

# Remote GPUs: the client library a GPU-less node installs as its driver
# (libcuda.so.1 and libnvidia-ml.so.1 are both this file), and the worker
# that runs a remote session's calls on the GPU node.
GWR_DIR    := $(GW_DIR)/remote
GWR_HDR    := $(GWR_DIR)/proto.h $(GWR_DIR)/client.h $(GWR_DIR)/tls13.h $(GWR_DIR)/ktls.h $(GWR_DIR)/handover.h $(GWR_DIR)/ring.h $(GWR_DIR)/spin.h $(GWR_DIR)/blocks.h simgpu/include/cuda.h simgpu/include/cuda_procaddr.h simgpu/include/cuda_ctx_flags.h simgpu/include/cuda_errors.h simgpu/include/nvml.h simgpu/include/nvml_errors.h
GWR_COMMON := $(GWR_DIR)/decode.c $(GWR_DIR)/sha256.c $(GWR_DIR)/tls13.c $(GWR_DIR)/ktls.c $(GWR_DIR)/handover.c $(GWR_DIR)/ring.c $(GWR_DIR)/spin.c $(GWR_DIR)/blocks.c
GWR_CLIENT := $(GWR_DIR)/client.c $(GWR_DIR)/cuda.c $(GWR_DIR)/nvml.c $(GWR_DIR)/procaddr.c $(GWR_DIR)/handles.c $(GWR_DIR)/allocs.c $(GWR_COMMON)

BUILD_TARGETS += $(BIN)/remote/libgpuwarden-remote.so $(BIN)/remote/libcuda.so.1 $(BIN)/remote/libnvidia-ml.so.1 \
	$(BIN)/gpuwarden-worker

$(BIN)/remote/libgpuwarden-remote.so: $(GWR_CLIENT) $(GWR_HDR) $(GWR_DIR)/exports.map
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isimgpu/include -I$(GWR_DIR) -shared -Wl,-soname,libcuda.so.1 -Wl,-z,now \
		-Wl,--version-script=$(GWR_DIR)/exports.map -o $@ \
		$(GWR_CLIENT) -pthread

$(BIN)/remote/libcuda.so.1 $(BIN)/remote/libnvidia-ml.so.1: $(BIN)/remote/libgpuwarden-remote.so
	ln -sf libgpuwarden-remote.so $@

# Linked against the driver's soname only: LD_LIBRARY_PATH and LD_PRELOAD
# decide, on the GPU node, which libcuda.so.1 and interposer it runs under.
$(BIN)/gpuwarden-worker: $(GWR_DIR)/worker.c $(GWR_COMMON) $(GWR_HDR) $(BIN)/simgpu/libcuda.so.1
	$(CC) $(CFLAGS) -Isimgpu/include -I$(GWR_DIR) -o $@ $(GWR_DIR)/worker.c $(GWR_COMMON) \
		-L$(BIN)/simgpu -l:libcuda.so.1 -ldl -pthread

# Runs on either driver: simgpu's by its runpath, the remote client's by LD_LIBRARY_PATH.
BUILD_TARGETS += $(BIN)/interposer/gw-remote
$(BIN)/interposer/gw-remote: $(GW_DIR)/tests/gw_remote.c simgpu/include/cuda.h simgpu/include/nvml.h $(BIN)/simgpu/libcuda.so.1 $(BIN)/simgpu/libnvidia-ml.so.1
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -l:libnvidia-ml.so.1 -Wl,-rpath,'$$ORIGIN/../simgpu'

# Plain TCP between two C programs: the remote bench's ceiling.
BUILD_TARGETS += $(BIN)/interposer/gw-tcp
$(BIN)/interposer/gw-tcp: $(GW_DIR)/tests/gw_tcp.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -o $@ $<

# The remote record layer on its own, driven by the Go tests from the other end of a TLS connection.
BUILD_TARGETS += $(BIN)/interposer/gw-tlsrec
$(BIN)/interposer/gw-tlsrec: $(GW_DIR)/tests/gw_tlsrec.c $(GWR_DIR)/tls13.c $(GWR_DIR)/ktls.c $(GWR_DIR)/sha256.c $(GWR_DIR)/tls13.h $(GWR_DIR)/ktls.h $(GWR_DIR)/proto.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -I$(GWR_DIR) -o $@ $< $(GWR_DIR)/tls13.c $(GWR_DIR)/ktls.c $(GWR_DIR)/sha256.c

# Kernel TLS under a kernel that has it: this machine's may not (the tls
# module, Linux 6.14 for key updates), where TestTLSRecordLayer's kernel
# half and handover's TestKernelTLS skip or see a refusal, and a
# handed-over session's records stay in user space; tests/uml.sh boots one
# as a process (Debian unstable's User-Mode Linux, fetched once into
# GPUWARDEN_UML_CACHE) and runs those there, with the CUDA conformance
# suite over a handed-over session, required to take the kernel's path.
DEPS_KTLS := patchelf busybox-static iproute2
DEPS_TEST += $(DEPS_KTLS)

KTLS_TESTS := $(abspath $(BIN))/interposer/handover.test -test.run '^TestKernelTLS$$' -test.v -test.count=1 && \
	$(abspath $(BIN))/interposer/interposer.test -test.run '^TestTLSRecordLayer$$/^kernel$$' -test.v -test.count=1 && \
	$(abspath $(BIN))/interposer/interposer.test -test.run '^TestRemoteCUDAConformance$$/^tls$$' -test.v -test.count=1

.PHONY: ktls-test
ktls-test: build ## Run only the kernel TLS tests, under a kernel that has kernel TLS (root the first time)
	@.ci/deps.sh $(DEPS_KTLS)
	$(GO) test -c -o $(abspath $(BIN))/interposer/interposer.test ./$(GW_DIR)
	$(GO) test -c -o $(abspath $(BIN))/interposer/handover.test ./enforcer/remote/handover
	cd $(GW_DIR) && GPUWARDEN_REQUIRE_KERNEL_TLS=1 tests/uml.sh run sh -c "$(KTLS_TESTS)"

TEST_EXTRA += ktls-test
