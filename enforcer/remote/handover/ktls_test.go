package handover

import (
	"os"
	"strings"
	"testing"
)

func TestRekeys(t *testing.T) {
	for release, want := range map[string]bool{
		"6.14.0": true, "6.18.44-fc-v1252": true, "7.2.7": true, "7.0-rc1": true, "10.1": true,
		"6.13.9": false, "6.8.0-45-generic": false, "5.15.0": false, "": false, "x.y": false, "6": false,
	} {
		if got := rekeys(release); got != want {
			t.Errorf("rekeys(%q) = %v, want %v", release, got, want)
		}
	}
}

// TestKernelTLS: KernelTLS's answer is the kernel's. Once it says yes, the
// kernel lists the tls protocol among those a connection may take; where
// the kernel is new enough and it says no, the kernel lists none. Under
// GPUWARDEN_REQUIRE_KERNEL_TLS=1 (a kernel that has it, tests/uml.sh of
// the interposer) it must say yes.
func TestKernelTLS(t *testing.T) {
	err := KernelTLS()
	t.Logf("KernelTLS: %v", err)
	if os.Getenv("GPUWARDEN_REQUIRE_KERNEL_TLS") == "1" && err != nil {
		t.Fatalf("GPUWARDEN_REQUIRE_KERNEL_TLS=1: %v", err)
	}
	ulps, rerr := os.ReadFile("/proc/sys/net/ipv4/tcp_available_ulp")
	if rerr != nil {
		t.Skipf("the kernel does not list its upper-layer protocols: %v", rerr)
	}
	listed := strings.Contains(" "+strings.TrimSpace(string(ulps))+" ", " tls ")
	if err == nil && !listed {
		t.Fatalf("KernelTLS says yes, but the kernel lists %q", ulps)
	}
	if err != nil && strings.HasPrefix(err.Error(), "attaching") && listed {
		t.Fatalf("KernelTLS says %v, but the kernel lists %q", err, ulps)
	}
}
