package allocation

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

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

// Remote writes g's remote grant in its control directory (the server that
// holds its GPU, its memory, weight and priority: the pod never chooses
// them) and says what its container gets (RemoteEdits). The relay must
// serve the directory's socket before the container starts.
func (n Node) Remote(g Grant, server, libDir string) (Edits, error) {
	if _, err := os.Stat(filepath.Join(libDir, "libcuda.so.1")); err != nil {
		return Edits{}, fmt.Errorf("remote client library: %w", err)
	}
	sg := session.Grant{Server: server, GPU: g.GPU.UUID, MemoryBytes: g.MemoryLimitBytes, Weight: max(g.Weight, 1)}
	if g.HighPriority {
		sg.Priority = vocab.PriorityHigh
	}
	b, err := json.Marshal(sg)
	if err != nil {
		return Edits{}, err
	}
	dir := filepath.Join(n.ControlDir, g.Dir)
	if err := os.MkdirAll(filepath.Join(dir, session.RelayDir), 0o755); err != nil {
		return Edits{}, fmt.Errorf("remote grant: %w", err)
	}
	if err := ReplaceFile(filepath.Join(dir, session.GrantFile), b, 0o644); err != nil {
		return Edits{}, fmt.Errorf("remote grant: %w", err)
	}
	return n.RemoteEdits(g.Dir, libDir), nil
}

// RemoteEdits is what the container of remote allocation dir gets: the
// relay's directory and the client library, read-only, and RemoteEnv.
func (n Node) RemoteEdits(dir, libDir string) Edits {
	return Edits{Env: RemoteEnv(), Mounts: []Mount{
		{ContainerPath: ContainerRemoteDir, HostPath: filepath.Join(n.ControlDir, dir, session.RelayDir), ReadOnly: true},
		{ContainerPath: ContainerRemoteLib, HostPath: libDir, ReadOnly: true},
	}}
}
