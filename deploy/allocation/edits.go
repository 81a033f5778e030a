package allocation

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// Edits is what a container is given for a grant, whichever API hands it
// over: the device plugin's Allocate answer or a DRA driver's CDI device.
type Edits struct {
	Env     map[string]string
	Mounts  []Mount
	Devices []Mount // device nodes (read-write; ReadOnly is unused)
}

// Mount is one host path shown at a path inside the container.
type Mount struct {
	ContainerPath, HostPath string
	ReadOnly                bool
}

// Node is where a node keeps what a local grant needs.
type Node struct {
	ControlDir     string // the control directory, a host path
	InterposerPath string // libgpuwarden.so on the host
	DeviceRoot     string // where the GPU device nodes are: /dev
	LdSoPreload    bool   // preload through a file mounted over /etc/ld.so.preload, not LD_PRELOAD
}

// Local writes g's control block under n.ControlDir (WriteControlBlock)
// and says what its container gets (Edits).
func (n Node) Local(g Grant) (Edits, error) {
	if _, err := os.Stat(n.InterposerPath); err != nil {
		return Edits{}, fmt.Errorf("interposer: %w", err)
	}
	if _, err := n.WriteControlBlock(g); err != nil {
		return Edits{}, err
	}
	return n.Edits(g), nil
}

// Edits is what the container of g gets once its control block is written:
// the interposer, its limits and usage files, the environment and the GPU's
// device nodes that exist.
func (n Node) Edits(g Grant) Edits {
	dir := filepath.Join(n.ControlDir, g.Dir)
	ctrDir := filepath.Join(ContainerControlDir, ContainerKey)
	e := Edits{
		Env: g.Env(!n.LdSoPreload),
		Mounts: []Mount{
			{ContainerPath: ContainerInterposer, HostPath: n.InterposerPath, ReadOnly: true},
			{ContainerPath: filepath.Join(ctrDir, "limits"), HostPath: filepath.Join(dir, "limits"), ReadOnly: true},
			{ContainerPath: filepath.Join(ctrDir, "usage"), HostPath: filepath.Join(dir, "usage")},
		},
	}
	if n.LdSoPreload {
		e.Mounts = append(e.Mounts, Mount{ContainerPath: LdSoPreload, HostPath: filepath.Join(dir, "ld.so.preload"), ReadOnly: true})
	}
	for _, name := range []string{fmt.Sprintf("nvidia%d", g.GPU.Index), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
		host := filepath.Join(n.DeviceRoot, name)
		if _, err := os.Stat(host); err == nil {
			e.Devices = append(e.Devices, Mount{ContainerPath: "/dev/" + name, HostPath: host})
		}
	}
	return e
}

// WriteControlBlock makes <ControlDir>/<g.Dir>/ with a new limits file (the
// memory limit for ordinal 0, the container's only GPU) and a new, empty
// usage file that the container's first process lays out. Both are new
// inodes (written aside and renamed in), so a container that held the same
// devices before keeps its own mappings untouched. The directory is the
// agent's, mode 0755 (CreateLimits adopts it, whoever made it): only
// `usage` (0666) is the container's to write. It returns the directory.
func (n Node) WriteControlBlock(g Grant) (string, error) {
	dir := filepath.Join(n.ControlDir, g.Dir)
	var cfg controlblock.LimitsConfig
	cfg.MemLimit[0] = g.MemoryLimitBytes
	cfg.NDev = 1
	lf, err := controlblock.CreateLimits(filepath.Join(dir, "limits"), cfg)
	if err != nil {
		return "", fmt.Errorf("control block: %w", err)
	}
	lf.Close()
	if err := ReplaceFile(filepath.Join(dir, "usage"), nil, 0o666); err != nil {
		return "", fmt.Errorf("control block: %w", err)
	}
	if n.LdSoPreload {
		if err := ReplaceFile(filepath.Join(dir, "ld.so.preload"), []byte(ContainerInterposer+"\n"), 0o644); err != nil {
			return "", fmt.Errorf("control block: %w", err)
		}
	}
	return dir, nil
}

// ReplaceFile writes a new file aside and renames it over path.
func ReplaceFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil { // not the umask's mode: the container's user may not be root
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
