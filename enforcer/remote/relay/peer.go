package relay

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// soPeerPIDFD is SO_PEERPIDFD (Linux 6.5): a pidfd of the process that
// connected. golang.org/x/sys does not name it yet; 77 on every
// architecture the agent is built for.
const soPeerPIDFD = 77

// peerCgroup is the connecting process, as the kernel recorded it at
// connect, and its cgroup v2 path. Where the kernel hands out the peer's
// pidfd, the process is held by it while its cgroup is read and must still
// be alive after: a process that connected and exited cannot have its pid
// taken by another pod's process and pass for it.
func peerCgroup(procRoot string, c *net.UnixConn) (int, string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, "", err
	}
	var cred *unix.Ucred
	pidfd := -1
	var credErr, fdErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		pidfd, fdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, soPeerPIDFD)
	}); err != nil {
		return 0, "", err
	}
	if credErr != nil {
		return 0, "", fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if cred.Pid <= 0 {
		return 0, "", errors.New("SO_PEERCRED: no pid (a peer in another pid namespace the agent cannot see)")
	}
	pid := int(cred.Pid)
	switch {
	case fdErr == nil:
		defer unix.Close(pidfd)
	case errors.Is(fdErr, unix.ENOPROTOOPT): // before Linux 6.5: the pid alone
	default:
		return pid, "", fmt.Errorf("SO_PEERPIDFD: %w (the peer is gone)", fdErr)
	}
	cg, err := hostcgroup.Of(procRoot, pid)
	if err != nil {
		return pid, "", err
	}
	if pidfd >= 0 {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			return pid, "", fmt.Errorf("the peer exited while it was identified: %w", err)
		}
	}
	return pid, cg, nil
}
