package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Remote is the node's part in a remote pool (RemotePoolLabel): it offers
// its GPUs to the pool's nodes where it serves sessions, and prepares
// claims allocated another node's GPU of the pool as remote sessions,
// relayed with the node's certificate as the device plugin's
// gpuwarden.io/remote-gpu allocations are.
type Remote struct {
	Pool string // the node's RemotePoolLabel value
	// Server is where this node serves remote sessions (HOST:PORT, as its
	// certificate names it), offered with its GPUs; "": it serves none, and
	// its GPUs stay its own pods'.
	Server string
	LibDir string // the remote client library's directory on the host
	// Relay serves a remote claim's relay socket, in its control
	// directory, before its container starts; Release stops serving it and
	// removes it.
	Relay, Release func(dir string) error
}

// poolNameRe is a label value, not empty.
var poolNameRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// CheckPoolName checks a remote pool's name (dra.remotePool): the value of
// the pool's nodes' RemotePoolLabel.
func CheckPoolName(s string) error {
	if !poolNameRe.MatchString(s) {
		return fmt.Errorf("dra.remotePool %q: want a label value: 1-63 letters, digits, '-', '_' or '.', a letter or digit at each end", s)
	}
	return nil
}

// offer is to whom the node's GPUs are offered.
func (d *Driver) offer() Offer {
	if r := d.cfg.Remote; r != nil && r.Server != "" {
		return Offer{Pool: r.Pool, Server: r.Server}
	}
	return Offer{}
}

// remoteGPU is device of another node's pool, as the pool's newest slice
// offers it to this node's remote pool: the GPU and the server that holds
// it. Devices the slice does not offer to the node's pool are refused.
func (d *Driver) remoteGPU(ctx context.Context, pool, device string) (GPU, string, error) {
	r := d.cfg.Remote
	if r == nil || r.Relay == nil {
		return GPU{}, "", fmt.Errorf("device %s/%s: not of this node's pool %s, and this node takes no remote GPUs (dra.remotePool)",
			pool, device, d.cfg.NodeName)
	}
	if d.api == nil {
		return GPU{}, "", errors.New("no API server client: remote devices are read from their slices")
	}
	slices, err := poolSlices(ctx, d.api, pool)
	if err != nil {
		return GPU{}, "", err
	}
	var found *Device
	var gen int64 = -1
	for _, s := range slices {
		if !reflect.DeepEqual(s.Spec.NodeSelector, poolSelector(r.Pool)) || s.Spec.Pool.Generation < gen {
			continue
		}
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == device {
				found, gen = &s.Spec.Devices[i], s.Spec.Pool.Generation
			}
		}
	}
	if found == nil {
		return GPU{}, "", fmt.Errorf("device %s/%s: no slice offers it to remote pool %s now", pool, device, r.Pool)
	}
	return remoteDeviceGPU(pool, *found)
}

// remoteDeviceGPU reads a remote device's GPU and server from its
// attributes and capacity; one that lacks any is refused.
func remoteDeviceGPU(pool string, dev Device) (GPU, string, error) {
	str := func(k string) string {
		if a, ok := dev.Attributes[k]; ok && a.String != nil {
			return *a.String
		}
		return ""
	}
	num := func(k string) int64 {
		if a, ok := dev.Attributes[k]; ok && a.Int != nil {
			return *a.Int
		}
		return -1
	}
	server, uuid, maxInst, index := str(AttributeServer), str("uuid"), num("maxInst"), num("index")
	mem := dev.Capacity[CapacityMemory].Value
	if _, _, err := client.SplitServer(server); err != nil {
		return GPU{}, "", fmt.Errorf("device %s/%s: attribute %s: %w", pool, dev.Name, AttributeServer, err)
	}
	if uuid == "" || vocab.CheckMaxInst(int(maxInst)) != nil || index < 0 || mem <= 0 {
		return GPU{}, "", fmt.Errorf("device %s/%s: want attributes uuid, index and maxInst (1-128) and a memory capacity", pool, dev.Name)
	}
	return GPU{GPU: allocation.GPU{UUID: uuid, Index: int(index), MemoryBytes: uint64(mem), MaxInst: int(maxInst)}, Model: str("model")}, server, nil
}

// prepareRemote writes a remote claim device's grant and has the relay
// serve its socket; asked again (the kubelet restarted), it keeps the
// grant the relay already serves.
func (d *Driver) prepareRemote(g claimGrant) (allocation.Edits, error) {
	r, n := d.cfg.Remote, d.cfg.Node
	var e allocation.Edits
	if _, err := os.Stat(filepath.Join(n.ControlDir, g.grant.Dir, session.GrantFile)); err == nil {
		e = n.RemoteEdits(g.grant.Dir, r.LibDir)
	} else {
		var err error
		if e, err = n.Remote(g.grant, g.server, r.LibDir); err != nil {
			return e, err
		}
	}
	if err := r.Relay(g.grant.Dir); err != nil {
		return e, fmt.Errorf("relay: %w", err)
	}
	return e, nil
}

// releaseRemote stops relaying a claim's directory, where it is a remote
// claim's.
func (d *Driver) releaseRemote(dir string) error {
	r := d.cfg.Remote
	if r == nil || r.Release == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(d.cfg.Node.ControlDir, dir, session.GrantFile)); err != nil {
		return nil
	}
	return r.Release(dir)
}
