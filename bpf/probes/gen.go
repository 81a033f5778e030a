package probes

// The eBPF object and its Go bindings are generated and committed, so that
// `go build` needs no clang; `make generate` rebuilds them with these flags.
// The object is built for x86-64 registers (struct pt_regs from the UAPI
// headers), with no CO-RE, so it needs no BTF from the running kernel.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3 -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu" -target bpfel -type usage_key -type usage_val -type alloc_key -type alloc_val -type proc_key -type proc_val -type ctx_key -type ctx_val -type prim_key -type pool_val -type thread_val -type launch_val -type alloc_fail_event -type gw_stat -type gw_api gpuwarden ../c/gpuwarden.bpf.c
//
// The sources' hashes are recorded beside the object, so a test (needing no
// clang) can tell when a C change was not regenerated.
//go:generate sh -c "sha256sum ../c/gpuwarden.bpf.c ../c/gpuwarden.h > gpuwarden_bpfel.sha256"
