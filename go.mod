module github.com/gpuwarden/gpuwarden

go 1.26

require github.com/NVIDIA/go-nvml v0.13.4-1

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
