package simgpu_test

import (
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestCUDAVisibleDevices runs bin/simgpu/visible-check (simgpu/tests/
// visible_check.c) on a fresh 4-GPU machine per case: CUDA sees the devices
// CUDA_VISIBLE_DEVICES names, renumbered from 0 in its order, and each
// ordinal's memory, kernels and UUID are those of the NVML device it names.
func TestCUDAVisibleDevices(t *testing.T) {
	bin := simtest.Bin(t, "simgpu/visible-check")
	uuids := machineUUIDs(t, bin)
	cases := []struct {
		name, value string // value "-" leaves the variable unset
		want        string // the machine's devices CUDA sees, in order
	}{
		{"unset", "-", "0,1,2,3"},
		{"one index", "2", "2"},
		{"reordered", "3,1,2", "3,1,2"},
		{"uuid", uuids[3], "3"},
		{"uuids and an index", uuids[2] + ",0," + uuids[1], "2,0,1"},
		{"uuid prefix", uuids[2][:6], "2"},
		{"ambiguous prefix ends the list", "1,GPU-,2", "1"},
		{"unknown uuid ends the list", "1,GPU-ffff,2", "1"},
		{"invalid index ends the list", "0,2,-1,1", "0,2"},
		{"index past the last device ends the list", "1,4,2", "1"},
		{"not a number ends the list", "1,x,2", "1"},
		{"empty entry ends the list", "3,,0", "3"},
		{"a duplicate ends the list", "1,2,1,3", "1,2"},
		{"a uuid naming a listed index ends the list", "2," + uuids[2] + ",1", "2"},
		{"empty hides every device", "", ""},
		{"nothing valid hides every device", "-1,0", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := simtest.NewMachine(t, 4, "8Gi")
			cmd := m.Command(bin, c.want)
			cmd.Env = withoutVisible(cmd.Env)
			if c.value != "-" {
				cmd.Env = append(cmd.Env, "CUDA_VISIBLE_DEVICES="+c.value)
			}
			out, err := cmd.CombinedOutput()
			results, plan, stray := parseCUDACheck(string(out))
			for _, r := range results {
				if !r.ok {
					t.Errorf("CUDA_VISIBLE_DEVICES=%q: %s: %s", c.value, r.name, r.detail)
				}
			}
			if err != nil || plan != len(results) || len(results) < 3 || len(stray) > 0 {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: visible-check %s: %v\n%s", c.value, c.want, err, out)
			}
		})
	}
}

// machineUUIDs lists a 4-GPU machine's UUIDs as NVML reports them.
func machineUUIDs(t *testing.T, bin string) []string {
	t.Helper()
	out, err := simtest.NewMachine(t, 4, "8Gi").Command(bin, "--list").Output()
	if err != nil {
		t.Fatalf("visible-check --list: %v", err)
	}
	uuids := strings.Fields(string(out))
	if len(uuids) != 4 {
		t.Fatalf("visible-check --list: %q, want 4 UUIDs", out)
	}
	return uuids
}

func withoutVisible(env []string) []string {
	var kept []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			kept = append(kept, kv)
		}
	}
	return kept
}
