// The layers of gpuwarden's packages (docs/architecture.md, "Layers"): every
// import points to a lower layer, or stays within its own; a package of a
// standalone layer imports only the standard library. The test lists every
// package of the module with `go list -deps` and fails on any import that
// crosses the layers, naming it.
package enforcer_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpuwarden/gpuwarden/"

// layer is a set of directories whose packages may import each other and
// any package of a lower rank.
type layer struct {
	name  string
	rank  int
	paths []string // directories relative to the module root, each with everything below it
	alone bool     // standard library only, even within the layer
}

// layers, lowest first. A package belongs to the layer of the longest path
// that holds it.
var layers = []layer{
	{name: "docs", rank: 0, paths: []string{"docs"}, alone: true},
	{name: "dashboards", rank: 0, paths: []string{"dashboards"}, alone: true},
	// What users set, host facts, pure rules and shared types; simgpu and
	// its test helpers, which every part's tests use.
	{name: "base", rank: 1, paths: []string{"enforcer/vocab", "enforcer/policy", "enforcer/hostcgroup",
		"enforcer/controlblock", "enforcer/agentapi", "simgpu"}},
	// bpf and the enforcer are side by side: neither imports the other.
	{name: "bpf", rank: 2, paths: []string{"bpf"}},
	{name: "enforcer", rank: 2, paths: []string{"enforcer"}},
	{name: "collector", rank: 3, paths: []string{"collector"}},
	{name: "deploy", rank: 4, paths: []string{"deploy"}},
	{name: "cmd", rank: 5, paths: []string{"cmd"}},
}

// layerOf is the layer of a package of the module, by its path.
func layerOf(pkg string) (layer, bool) {
	rel := strings.TrimPrefix(pkg, module)
	var best layer
	bestLen := -1
	for _, l := range layers {
		for _, p := range l.paths {
			if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > bestLen {
				best, bestLen = l, len(p)
			}
		}
	}
	return best, bestLen >= 0
}

// listed is what `go list -deps -json` says of one package.
type listed struct {
	ImportPath string
	Standard   bool
	Imports    []string
}

// depsOf lists the packages that pattern's packages build from, theirs
// included.
func depsOf(t *testing.T, pattern string) []listed {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list imports: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-json", pattern).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, exit.Stderr)
	}
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list -json: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// crossings names every import of the module's packages that crosses the
// layers, and every package of the module that has no layer.
func crossings(pkgs []listed) []string {
	standard := map[string]bool{}
	for _, p := range pkgs {
		standard[p.ImportPath] = p.Standard
	}
	var found []string
	for _, p := range pkgs {
		if !strings.HasPrefix(p.ImportPath, module) {
			continue
		}
		from, ok := layerOf(p.ImportPath)
		if !ok {
			found = append(found, fmt.Sprintf("%s is in no layer: add its directory to one", p.ImportPath))
			continue
		}
		for _, imp := range p.Imports {
			if from.alone {
				if !standard[imp] {
					found = append(found, fmt.Sprintf("%s (layer %s) imports %s: it may import only the standard library", p.ImportPath, from.name, imp))
				}
				continue
			}
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to, ok := layerOf(imp)
			if ok && (to.name == from.name || to.rank < from.rank) {
				continue
			}
			found = append(found, fmt.Sprintf("%s (layer %s, rank %d) imports %s (layer %s, rank %d): an import points only to a lower layer or within its own",
				p.ImportPath, from.name, from.rank, imp, to.name, to.rank))
		}
	}
	slices.Sort(found)
	return found
}

func TestLayers(t *testing.T) {
	pkgs := depsOf(t, module+"...")
	// The listing must hold packages of every layer, or an empty (or cut
	// short) answer would pass.
	seen := map[string]int{}
	for _, p := range pkgs {
		if l, ok := layerOf(p.ImportPath); ok && strings.HasPrefix(p.ImportPath, module) {
			seen[l.name]++
		}
	}
	for _, l := range layers {
		if seen[l.name] == 0 {
			t.Fatalf("go list -deps lists no package of layer %s (%v): the listing is broken", l.name, l.paths)
		}
	}
	for _, want := range []string{"enforcer/vocab", "enforcer/membership", "collector", "deploy/allocation", "cmd/gpuwarden"} {
		if !slices.ContainsFunc(pkgs, func(p listed) bool { return p.ImportPath == module+want }) {
			t.Fatalf("go list -deps lists no %s", want)
		}
	}
	if found := crossings(pkgs); len(found) > 0 {
		t.Errorf("imports that cross the layers (docs/architecture.md#layers); move what both sides need down:\n%s", strings.Join(found, "\n"))
	}
}

// The check finds a crossing where there is one: upward, sideways, out of
// a standalone layer, and from a package without a layer.
func TestCrossingsFindsOne(t *testing.T) {
	pkgs := []listed{
		{ImportPath: "fmt", Standard: true},
		{ImportPath: "example.com/x"},
		{ImportPath: module + "enforcer/membership", Imports: []string{"fmt", module + "deploy/allocation", module + "enforcer/vocab"}},
		{ImportPath: module + "bpf/observe", Imports: []string{module + "enforcer/scheduler"}},
		{ImportPath: module + "docs/diagram", Imports: []string{"fmt", "example.com/x"}},
		{ImportPath: module + "simgpu/simtest", Imports: []string{module + "collector/cgroups", module + "enforcer/hostcgroup"}},
		{ImportPath: module + "tools/x"},
		{ImportPath: module + "cmd/gpuwarden", Imports: []string{module + "collector", module + "enforcer/vocab", "example.com/x"}},
	}
	got := strings.Join(crossings(pkgs), "\n")
	for _, want := range []string{
		"enforcer/membership (layer enforcer, rank 2) imports " + module + "deploy/allocation (layer deploy, rank 4)",
		"bpf/observe (layer bpf, rank 2) imports " + module + "enforcer/scheduler (layer enforcer, rank 2)",
		"docs/diagram (layer docs) imports example.com/x",
		"simgpu/simtest (layer base, rank 1) imports " + module + "collector/cgroups",
		"tools/x is in no layer",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("crossings missed %q; found:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n") + 1; n != 5 {
		t.Errorf("crossings found %d, want 5 (the allowed imports pass):\n%s", n, got)
	}
}
