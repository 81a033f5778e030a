package remotepool

import (
	"errors"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// TestDevices: answering servers' GPUs become devices in order; a silent
// server's do not; a UUID claimed twice stays with the first server.
func TestDevices(t *testing.T) {
	devs, where := Devices([]Answer{
		{Server: "a", List: session.GPUList{GPUs: []session.GPU{{Index: 1, UUID: "GPU-a1", TotalBytes: 8 << 30}, {Index: 0, UUID: "GPU-a0", TotalBytes: 16 << 30}}}},
		{Server: "down", Err: errors.New("no answer")},
		{Server: "b", List: session.GPUList{GPUs: []session.GPU{{Index: 0, UUID: "GPU-a0"}, {Index: 1, UUID: "GPU-b1", TotalBytes: 4 << 30},
			{Index: 2, UUID: "GPU-b2", Unavailable: "lost"}}}},
	})
	if len(devs) != 3 || devs[0].UUID != "GPU-a0" || devs[0].MemoryTotalBytes != 16<<30 || devs[1].UUID != "GPU-a1" ||
		devs[2].UUID != "GPU-b1" || devs[2].Index != 2 {
		t.Fatalf("devices %+v", devs)
	}
	if where["GPU-a0"] != "a" || where["GPU-b1"] != "b" || len(where) != 3 {
		t.Fatalf("where %v", where)
	}
}
