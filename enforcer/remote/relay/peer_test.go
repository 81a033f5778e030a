package relay

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// A process started with this variable connects to the socket it names
// and exits.
const connectEnv = "GPUWARDEN_RELAY_TEST_CONNECT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(connectEnv); sock != "" {
		c, err := net.Dial("unix", sock)
		if err != nil {
			os.Exit(2)
		}
		c.(*net.UnixConn).CloseWrite()
		os.Exit(0) // the connection stays queued, its process gone
	}
	os.Exit(m.Run())
}

func listenUnix(t *testing.T) *net.UnixListener {
	t.Helper()
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis
}

// A live peer is named by its pid and cgroup, as the kernel knows them.
func TestPeerCgroupOfLivePeer(t *testing.T) {
	lis := listenUnix(t)
	c, err := net.Dial("unix", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := lis.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pid, cg, err := peerCgroup("/proc", s)
	want, werr := hostcgroup.Of("/proc", os.Getpid())
	if err != nil || werr != nil || pid != os.Getpid() || cg != want {
		t.Fatalf("peerCgroup = %d %q %v; want %d %q (%v)", pid, cg, err, os.Getpid(), want, werr)
	}
	// This kernel hands out the peer's pidfd (Linux 6.5 and later).
	rc, _ := s.SyscallConn()
	var fdErr error
	rc.Control(func(fd uintptr) {
		var pidfd int
		if pidfd, fdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, soPeerPIDFD); fdErr == nil {
			unix.Close(pidfd)
		}
	})
	if release, ok := linuxAtLeast(6, 5); ok && fdErr != nil {
		t.Errorf("SO_PEERPIDFD refused on Linux %s: %v", release, fdErr)
	}
}

// linuxAtLeast says whether the running kernel is major.minor or later.
func linuxAtLeast(major, minor int) (string, bool) {
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return "", false
	}
	release := unix.ByteSliceToString(uts.Release[:])
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return release, false
	}
	return release, ma > major || ma == major && mi >= minor
}

// A peer that connected and exited is not identified: its pid may belong
// to another process by now. The second look sees its pid taken by a
// process of another pod (a /proc where that pid lives in another cgroup):
// the pidfd the kernel kept of the peer tells them apart.
func TestPeerCgroupOfGonePeer(t *testing.T) {
	lis := listenUnix(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), connectEnv+"="+lis.Addr().String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the connecting process: %v %s", err, out)
	}
	s, err := lis.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pid, cg, err := peerCgroup("/proc", s)
	if err == nil {
		t.Fatalf("a gone peer was identified as %d in %q", pid, cg)
	}
	reused := t.TempDir()
	if err := os.MkdirAll(filepath.Join(reused, fmt.Sprint(pid)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(reused, fmt.Sprint(pid), "cgroup"), []byte("0::/kubepods/pod-other/c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if release, ok := linuxAtLeast(6, 5); ok {
		if _, cg, err := peerCgroup(reused, s); err == nil {
			t.Errorf("Linux %s: a gone peer whose pid was taken passed as %q", release, cg)
		}
	}
}
