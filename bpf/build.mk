# bpf/build.mk: the eBPF part's build outputs and Debian packages (included by the top Makefile).
# The eBPF object and its Go bindings are generated (`make generate`, needs clang)
# and committed, so building and testing need no clang.

BUILD_TARGETS += $(BIN)/bpf/cuda-alloc
DEPS_GENERATE += clang llvm libbpf-dev linux-libc-dev

# A driver-API program the eBPF tests steer on stdin (bpf/testdata/cuda_alloc.c).
# It finds libcuda.so.1 beside itself first, so a copy of both runs on the copy.
$(BIN)/bpf/cuda-alloc: bpf/testdata/cuda_alloc.c simgpu/include/cuda.h $(BIN)/simgpu/libcuda.so.1
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Isimgpu/include -o $@ $< \
		-L$(BIN)/simgpu -l:libcuda.so.1 -ldl -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../simgpu'

.PHONY: bpf-check-generated
bpf-check-generated: deps-generate ## Check that the committed eBPF object and bindings are current
	$(GO) generate ./bpf/...
	git diff --exit-code -- bpf/probes/
