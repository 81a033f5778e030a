package allocation

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Where a remote allocation's things are: in its control directory on the
// node, and inside its container.
const (
	// RemoteGrantFile, in the allocation's control directory, is the grant
	// the node's relay opens the container's sessions with (RemoteGrant).
	RemoteGrantFile = "remote.json"
	// RelayDir, in the allocation's control directory, holds the relay's
	// socket; it is mounted at ContainerRemoteDir.
	RelayDir = "relay"
	// RelaySocket is the relay's socket in RelayDir.
	RelaySocket = "driver.sock"
	// ContainerRemoteDir is where the relay's directory appears.
	ContainerRemoteDir = "/run/gpuwarden/remote"
	// ContainerRemoteLib is where the remote client library's directory
	// (libcuda.so.1, libnvidia-ml.so.1) appears, read-only.
	ContainerRemoteLib = "/usr/local/gpuwarden/remote"
)

// RemoteGrant is what a container allocated remote GPU slots may open
// sessions for: the server, its GPU, the memory and the weight. The pod
// never chooses them.
type RemoteGrant struct {
	Server      string `json:"server"` // HOST[:PORT], as configured
	GPU         string `json:"gpu"`    // UUID
	MemoryBytes uint64 `json:"memoryBytes"`
	Weight      uint32 `json:"weight"`
}

// RemoteEnv is the environment of a container with remote GPU slots: the
// relay's socket, and the client library first on the library path.
func RemoteEnv() map[string]string {
	return map[string]string{
		"GPUWARDEN_REMOTE": "unix:" + ContainerRemoteDir + "/" + RelaySocket,
		"LD_LIBRARY_PATH":  ContainerRemoteLib,
	}
}

// ReadRemoteGrant reads a grant file; one that does not read back whole is
// an error (the relay opens no session on it).
func ReadRemoteGrant(path string) (RemoteGrant, error) {
	var g RemoteGrant
	b, err := os.ReadFile(path)
	if err != nil {
		return g, fmt.Errorf("read the remote grant: %w", err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("remote grant %s: %w", path, err)
	}
	if g.Server == "" || g.GPU == "" || g.MemoryBytes == 0 || g.Weight == 0 {
		return g, errors.New("remote grant " + path + ": incomplete")
	}
	return g, nil
}
