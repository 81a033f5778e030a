module github.com/gpuwarden/gpuwarden

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.85.0
	k8s.io/kubelet v0.37.2
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
