package probes

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// layoutMap is pinned beside the state maps and holds a fingerprint of their
// key and value layouts. The kernel checks only sizes when it reuses a
// pinned map; the fingerprint also catches a field that moved.
const layoutMap = "gpuwarden_layout"

// fingerprint hashes each pinned map's name, type, sizes and the BTF layout
// (member names, offsets and sizes) of its key and value.
func fingerprint(spec *ebpf.CollectionSpec) uint64 {
	h := fnv.New64a()
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		m := spec.Maps[name]
		if m.Pinning != ebpf.PinByName {
			continue
		}
		fmt.Fprintf(h, "%s %s %d %d %d %d;", name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags)
		describe(h, m.Key)
		describe(h, m.Value)
	}
	return h.Sum64()
}

func describe(w interface{ Write([]byte) (int, error) }, t btf.Type) {
	if t == nil {
		return
	}
	switch t := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		fmt.Fprintf(w, "struct %s %d{", t.Name, t.Size)
		for _, m := range t.Members {
			fmt.Fprintf(w, "%s@%d:", m.Name, m.Offset)
			describe(w, m.Type)
		}
		fmt.Fprint(w, "}")
	case *btf.Array:
		fmt.Fprintf(w, "[%d]", t.Nelems)
		describe(w, t.Type)
	case *btf.Int:
		fmt.Fprintf(w, "int%d/%v", t.Size, t.Encoding)
	default:
		fmt.Fprintf(w, "%T", t)
	}
}

var layoutSpec = &ebpf.MapSpec{Name: "gw_layout", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}

// checkLayout unpins the state maps when the pinned fingerprint differs from
// this build's (or is missing while state maps are pinned).
func checkLayout(spec *ebpf.CollectionSpec, dir string, log *slog.Logger) error {
	want := fingerprint(spec)
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, layoutMap), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing pinned yet, or state maps from before the fingerprint: the kernel's size check decides
	}
	if err != nil {
		return fmt.Errorf("read pinned layout: %w", err)
	}
	defer m.Close()
	var got uint64
	if err := m.Lookup(uint32(0), &got); err != nil {
		return fmt.Errorf("read pinned layout: %w", err)
	}
	if got == want {
		return nil
	}
	log.Warn("pinned eBPF maps have another layout; replacing them", "dir", dir)
	return unpinAll(spec, dir)
}

// writeLayout pins this build's fingerprint.
func writeLayout(spec *ebpf.CollectionSpec, dir string) error {
	path := filepath.Join(dir, layoutMap)
	_ = os.Remove(path)
	m, err := ebpf.NewMap(layoutSpec)
	if err != nil {
		return fmt.Errorf("make layout map: %w", explainLoad(err))
	}
	defer m.Close()
	if err := m.Put(uint32(0), fingerprint(spec)); err != nil {
		return fmt.Errorf("write layout map: %w", err)
	}
	if err := m.Pin(path); err != nil {
		return fmt.Errorf("pin layout map: %w", err)
	}
	return nil
}

// unpinAll removes this collection's pinned maps from dir.
func unpinAll(spec *ebpf.CollectionSpec, dir string) error {
	for name, m := range spec.Maps {
		if m.Pinning != ebpf.PinByName {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin %s: %w", name, err)
		}
	}
	return nil
}
