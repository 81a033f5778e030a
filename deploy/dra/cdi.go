package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
)

// CDI names: the kubelet hands the runtime "<cdiKind>=<device>", and the
// runtime applies the edits of that device from the spec files in its CDI
// directories. A device is named as its control directory
// (allocation.ClaimDirName: unique per claim, never reused, as runtimes may
// cache specs). One spec file per claim, named by the claim's UID, so that
// unprepare (which gets the UID alone) finds it again.
const (
	cdiVersion = "0.6.0"
	cdiKind    = allocation.ClaimCDIKind
	specPrefix = DriverName + "-claim_"
)

type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string   `json:"env,omitempty"`
	DeviceNodes []cdiNode  `json:"deviceNodes,omitempty"`
	Mounts      []cdiMount `json:"mounts,omitempty"`
}

type cdiNode struct {
	Path        string `json:"path"`
	HostPath    string `json:"hostPath"`
	Permissions string `json:"permissions"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

// cdiEditsOf renders allocation.Edits, what the device plugin's Allocate
// answer carries too, as CDI container edits.
func cdiEditsOf(e allocation.Edits) cdiEdits {
	var out cdiEdits
	for k, v := range e.Env {
		out.Env = append(out.Env, k+"="+v)
	}
	sort.Strings(out.Env)
	for _, d := range e.Devices {
		out.DeviceNodes = append(out.DeviceNodes, cdiNode{Path: d.ContainerPath, HostPath: d.HostPath, Permissions: "rw"})
	}
	for _, m := range e.Mounts {
		opts := []string{"bind", "rw"}
		if m.ReadOnly {
			opts[1] = "ro"
		}
		out.Mounts = append(out.Mounts, cdiMount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: opts})
	}
	return out
}

// specPath is a claim's spec file in dir (the UID checked by validUID).
func specPath(dir string, claim string) string {
	return filepath.Join(dir, specPrefix+claim+".json")
}

// writeSpec writes a claim's spec file (aside, then renamed in).
func writeSpec(dir string, claim string, devs []cdiDevice) error {
	b, err := json.MarshalIndent(cdiSpec{Version: cdiVersion, Kind: cdiKind, Devices: devs}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("CDI directory: %w", err)
	}
	return allocation.ReplaceFile(specPath(dir, claim), b, 0o644)
}

// validUID checks that a claim's UID, which names files, is a plain one.
func validUID(uid string) error {
	if len(uid) == 0 || len(uid) > 64 || strings.Trim(uid, "abcdefABCDEF0123456789-") != "" {
		return fmt.Errorf("claim UID %q: want a UUID", uid)
	}
	return nil
}

// removeSpec removes a claim's spec file; one that is not there is no error.
func removeSpec(dir string, claim string) error {
	if err := os.Remove(specPath(dir, claim)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// preparedDirs are the control directories the spec files in dir name: the
// claims prepared, whoever prepared them (an agent before a restart too).
func preparedDirs(dir string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), specPrefix)
		if !ok || !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var s cdiSpec
		if err := json.Unmarshal(b, &s); err != nil {
			continue // not ours to judge; it names no directory
		}
		for _, d := range s.Devices {
			out[d.Name] = true
		}
	}
	return out, nil
}
