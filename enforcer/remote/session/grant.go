package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// A remote allocation's control directory holds what the device plugin
// granted it and the node relay's socket: the plugin writes them, the
// relay (enforcer/remote/relay) reads and serves them.
const (
	// GrantFile is the grant the node's relay opens the container's
	// sessions with (Grant).
	GrantFile = "remote.json"
	// RelayDir holds the relay's socket; the device plugin mounts it into
	// the container.
	RelayDir = "relay"
	// RelaySocket is the relay's socket in RelayDir.
	RelaySocket = "driver.sock"
)

// Grant is what a container allocated remote GPU slots may open sessions
// for: the server, its GPU, the memory and the weight. The pod never
// chooses them.
type Grant struct {
	Server      string `json:"server"` // HOST[:PORT], as configured
	GPU         string `json:"gpu"`    // UUID
	MemoryBytes uint64 `json:"memoryBytes"`
	Weight      uint32 `json:"weight"`
	Priority    string `json:"priority,omitempty"` // high or normal; "": normal
}

// ReadGrant reads a grant file; one that does not read back whole is an
// error (the relay opens no session on it).
func ReadGrant(path string) (Grant, error) {
	var g Grant
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
