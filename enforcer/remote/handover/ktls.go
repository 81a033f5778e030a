package handover

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// KernelTLS says whether the kernel would carry a handed-over connection's
// records (kernel TLS: the tls module, and Linux 6.14 or later for key
// updates), as the client library and the worker decide for each session,
// and why not. It attaches the tls protocol to a loopback connection of
// its own, which loads the module where the caller may (CAP_NET_ADMIN): a
// tenant's client library cannot, so the agent asking first is what lets
// it. Where the kernel refuses, the records stay in user space.
func KernelTLS() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	if release := unix.ByteSliceToString(u.Release[:]); !rekeys(release) {
		return fmt.Errorf("Linux %s cannot update TLS 1.3 keys in kernel TLS (6.14 or later can)", release)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := lis.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if peer := <-accepted; peer != nil {
		defer peer.Close()
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var attach error
	if err := raw.Control(func(fd uintptr) {
		attach = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_ULP, "tls")
	}); err != nil {
		return err
	}
	if attach != nil {
		return fmt.Errorf("attaching the tls protocol: %w", attach)
	}
	return nil
}

// rekeys: release (uname's) is Linux 6.14 or later.
func rekeys(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 14
}
