package probes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCapsError(t *testing.T) {
	for _, tc := range []struct {
		name string
		eff  uint64
		want string // "" for none
	}{
		{"root", 0x000001ffffffffff, ""},
		{"sys_admin alone", 1 << capSysAdmin, ""},
		{"bpf and perfmon", 1<<capBPF | 1<<capPerfmon, ""},
		{"bpf alone", 1 << capBPF, "missing CAP_PERFMON"},
		{"nothing", 0, "missing CAP_BPF and CAP_PERFMON"},
	} {
		err := capsError(tc.eff)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrPermission)):
			t.Errorf("%s: %v, want an ErrPermission saying %q", tc.name, err, tc.want)
		}
	}
}

func TestEffectiveCaps(t *testing.T) {
	status := filepath.Join(t.TempDir(), "status")
	os.WriteFile(status, []byte("Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n"), 0o644)
	got, err := effectiveCaps(status)
	if err != nil || got != 0x1ffffffffff {
		t.Errorf("effectiveCaps = %x, %v; want 1ffffffffff", got, err)
	}
	os.WriteFile(status, []byte("Name:\tagent\n"), 0o644)
	if _, err := effectiveCaps(status); err == nil {
		t.Error("a status without CapEff gave no error")
	}
}

// A pin directory that is not on bpffs is refused with ErrNoBPFFS.
func TestPreparePinDirNotBPFFS(t *testing.T) {
	err := preparePinDir(filepath.Join(t.TempDir(), "a", "b"))
	if !errors.Is(err, ErrNoBPFFS) {
		t.Errorf("preparePinDir on tmpfs/ext4 = %v, want ErrNoBPFFS", err)
	}
}
