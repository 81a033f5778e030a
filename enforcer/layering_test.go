// The enforcer is the lower layer: the collector reads what it writes
// (ledgers, limits) and shares its device access and API types, so nothing
// in enforcer/ may depend on the collector.
package enforcer_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpuwarden/gpuwarden/"

// listed is what `go list -deps -json` says of one package.
type listed struct {
	ImportPath string
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

// importsOf names, for every package of the list that imports one under
// forbidden, the package and what it imports there.
func importsOf(pkgs []listed, forbidden string) []string {
	var found []string
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			if imp == strings.TrimSuffix(forbidden, "/") || strings.HasPrefix(imp, forbidden) {
				found = append(found, p.ImportPath+" imports "+imp)
			}
		}
	}
	slices.Sort(found)
	return found
}

func TestEnforcerDoesNotDependOnCollector(t *testing.T) {
	pkgs := depsOf(t, module+"enforcer/...")
	var names []string
	for _, p := range pkgs {
		names = append(names, p.ImportPath)
	}
	// The listing must hold the enforcer's packages, or an empty answer
	// would pass.
	for _, want := range []string{"enforcer/scheduler", "enforcer/membership", "enforcer/nvmldev"} {
		if !slices.Contains(names, module+want) {
			t.Fatalf("go list -deps lists no %s: %v", want, names)
		}
	}
	if found := importsOf(pkgs, module+"collector/"); len(found) > 0 {
		t.Errorf("enforcer/ depends on the collector; move what both need below both:\n%s", strings.Join(found, "\n"))
	}
}

// The check itself finds such an import where there is one: the collector
// imports its own packages.
func TestImportsOfFindsAnImport(t *testing.T) {
	found := importsOf(depsOf(t, module+"collector"), module+"collector/")
	if !slices.Contains(found, module+"collector imports "+module+"collector/cgroups") {
		t.Errorf("importsOf(collector) = %v, want collector's import of collector/cgroups", found)
	}
}
