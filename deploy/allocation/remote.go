package allocation

import "github.com/gpuwarden/gpuwarden/enforcer/remote/session"

// Where a remote allocation's things appear inside its container; in its
// control directory on the node they are session.GrantFile and
// session.RelayDir.
const (
	// ContainerRemoteDir is where the relay's directory appears.
	ContainerRemoteDir = "/run/gpuwarden/remote"
	// ContainerRemoteLib is where the remote client library's directory
	// (libcuda.so.1, libnvidia-ml.so.1) appears, read-only.
	ContainerRemoteLib = "/usr/local/gpuwarden/remote"
)

// ControlFiles are the files a control directory may hold: the agent's
// limits, the container's usage, the ld.so.preload a grant writes, a
// remote allocation's grant. Nothing else is removed with a directory.
var ControlFiles = []string{"limits", "usage", "ld.so.preload", session.GrantFile}

// RemoteEnv is the environment of a container with remote GPU slots: the
// relay's socket, and the client library first on the library path.
func RemoteEnv() map[string]string {
	return map[string]string{
		"GPUWARDEN_REMOTE": "unix:" + ContainerRemoteDir + "/" + session.RelaySocket,
		"LD_LIBRARY_PATH":  ContainerRemoteLib,
	}
}
