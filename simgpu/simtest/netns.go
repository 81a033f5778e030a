package simtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace made for one test: held by a sleeping
// process, gone when the test ends. Nothing in it is named globally, so
// tests running at once do not collide.
type NetNS struct {
	Path string // /proc/<pid>/ns/net
	hold *exec.Cmd
}

// NewNetNS makes a network namespace with its loopback up. It needs root.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	RequirePrivileged(t, "network namespaces")
	hold := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity")
	out, err := hold.StdoutPipe()
	if err == nil {
		err = hold.Start()
	}
	if err != nil {
		t.Fatalf("unshare --net: %v", err)
	}
	t.Cleanup(func() { _ = hold.Process.Kill(); _ = hold.Wait() })
	// The namespace is ready once the holder says so, from inside it.
	line := make(chan string, 1)
	go func() {
		b := make([]byte, 3)
		n, _ := io.ReadFull(out, b)
		line <- string(b[:n])
	}()
	select {
	case l := <-line:
		if l != "up" && l != "up\n" {
			t.Fatalf("unshare --net: the namespace's loopback did not come up (%q)", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unshare --net: no namespace within 10s")
	}
	return &NetNS{Path: "/proc/" + strconv.Itoa(hold.Process.Pid) + "/ns/net", hold: hold}
}

// Command is a command run in the namespace (through nsenter, which only
// changes the network namespace: the cgroup and /sys mounts stay the
// host's).
func (n *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + n.Path, "--", name}, args...)...)
}

// Wrap makes cmd run in the namespace.
func (n *NetNS) Wrap(cmd *exec.Cmd) *exec.Cmd {
	cmd.Args = append([]string{"nsenter", "--net=" + n.Path, "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path, _ = exec.LookPath("nsenter")
	return cmd
}

// Run runs a command in the namespace, failing the test if it fails.
func (n *NetNS) Run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := n.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v in %s: %v: %s", name, args, n.Path, err, out)
	}
}

// Veth joins two namespaces with a veth pair, made inside a so no name
// ever exists in the host's namespace; the addresses are CIDRs
// ("10.231.0.1/24").
func Veth(t testing.TB, a, b *NetNS, addrA, addrB string) {
	t.Helper()
	a.Run(t, "ip", "link", "add", "gw0", "type", "veth", "peer", "name", "gw1", "netns", b.Path)
	a.Run(t, "ip", "addr", "add", addrA, "dev", "gw0")
	a.Run(t, "ip", "link", "set", "gw0", "up")
	b.Run(t, "ip", "addr", "add", addrB, "dev", "gw1")
	b.Run(t, "ip", "link", "set", "gw1", "up")
}

// Dial connects from inside the namespace: on its own thread, moved into
// the namespace and back; the socket stays in the namespace.
func (n *NetNS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
	return c, err
}

// Listen listens inside the namespace, as Dial connects.
func (n *NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) { l, err = net.Listen(network, addr); return err })
	return l, err
}

// Do runs f on a thread of its own moved into the namespace and back:
// the sockets f makes are the namespace's.
func (n *NetNS) Do(f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer unix.Close(back)
		fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("setns: %w", err)
			return
		}
		err = f()
		// Back to where the thread was; a thread that cannot go back stays
		// locked, and ends with this goroutine.
		if unix.Setns(back, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- err
	}()
	return <-ch
}

// HTTPClient is a client whose connections are made in the namespace.
func (n *NetNS) HTTPClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: n.Dial, DisableKeepAlives: true}}
}
