package settings

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// TestSavedGPUsByUUID: GPU settings are kept by UUID; a file from before
// keys them by NVML index, read as the GPUs NVML lists now, and an index
// NVML does not list is reported, not guessed.
func TestSavedGPUsByUUID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "settings.json")
	old := `{"containers":{},"gpus":{"1":{"policy":2,"policySet":true,"maxInst":6},"7":{"policy":0,"maxInst":3},
		"GPU-b":{"policy":1,"policySet":true,"maxInst":0}}}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got, unknown := s.GPUSettings([]string{"GPU-a", "GPU-b"})
	want := map[string]scheduler.GPUSettings{
		"GPU-b": {Policy: policy.Policy(1), PolicySet: true}, // saved by UUID since: it wins over index 1
	}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(unknown, []string{"7"}) {
		t.Errorf("gpus = %v, unknown %v; want %v, [7]", got, unknown, want)
	}
	got, _ = s.GPUSettings([]string{"GPU-a", "GPU-c"})
	if g := got["GPU-c"]; g.MaxInst != 6 || g.Policy != policy.Policy(2) {
		t.Errorf("index 1 on a node whose GPU 1 is GPU-c: %v, want its saved settings", got)
	}
}

// What ctl set wins over a pod's annotations, which win over the
// container's environment.
func TestResolvePrecedence(t *testing.T) {
	ctl := &scheduler.Settings{Weight: 5}
	ann := &scheduler.Settings{Weight: 2, CapPercent: 30}
	env := scheduler.Settings{FromClaims: true}
	for _, tt := range []struct {
		name     string
		ctl, ann *scheduler.Settings
		want     scheduler.Settings
	}{
		{"ctl over annotations", ctl, ann, *ctl},
		{"ctl alone", ctl, nil, *ctl},
		{"annotations over the environment", nil, ann, *ann},
		{"the environment", nil, nil, env},
	} {
		if got := Resolve(tt.ctl, tt.ann); got != tt.want {
			t.Errorf("%s: Resolve = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// What ctl set is kept in the file and read back; a container ctl did
// not touch has none.
func TestComputeSaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "settings.json")
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	set := scheduler.Settings{Weight: 3, High: true}
	if err := s.Update(func(s *Store) { s.Containers["a"] = Container{Compute: &set} }); err != nil {
		t.Fatal(err)
	}
	again, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Compute("a"); got == nil || *got != set {
		t.Errorf("Compute(a) after a reload = %v, want %+v", got, set)
	}
	if got := again.Compute("b"); got != nil {
		t.Errorf("Compute(b) = %+v, want none", *got)
	}
}
