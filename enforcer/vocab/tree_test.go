package vocab

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	// a function that reads or checks a setting by its own rule
	readerName = regexp.MustCompile(`(?i)^(parse|check)(weight|priority|policy|cap|computelimit|maxinst|memory|size|bytes|gib|fraction|annotations)`)
	// a limit defined again
	limitName = regexp.MustCompile(`(?i)^max(weight|cappercent|maxinst|gib)$`)
	// what a setting's own parser refers to: its limit or checker, or the
	// annotation or variable that carries it, named alone (a literal that
	// goes on, "GPUWARDEN_COMPUTE_WEIGHT=2", writes a value)
	settingName = regexp.MustCompile(`^(Max(Weight|CapPercent|MaxInst|GiB)|Annotation(Weight|ComputeLimit|Priority)|Check(Weight|CapPercent|MaxInst|Fraction))$`)
	settingKey  = regexp.MustCompile(`^"(GPUWARDEN_(MEMORY_LIMIT|COMPUTE_WEIGHT|COMPUTE_LIMIT|PRIORITY)|ALIYUN_COM_GPU_\w+|gpuwarden\.io/(weight|compute-limit|priority))"$`)
	sizeUnit    = map[string]bool{"Ki": true, "Mi": true, "Gi": true, "Ti": true}
	priority    = map[string]bool{PriorityHigh: true, PriorityNormal: true}
)

// ownParsers names what in one Go file reads a user setting by itself
// rather than through this package.
func ownParsers(fset *token.FileSet, f *ast.File) []string {
	var found []string
	at := func(n ast.Node, what string) {
		found = append(found, fset.Position(n.Pos()).String()+": "+what)
	}
	isLit := func(e ast.Expr, set map[string]bool) bool {
		l, ok := e.(*ast.BasicLit)
		if !ok || l.Kind != token.STRING {
			return false
		}
		s, err := strconv.Unquote(l.Value)
		return err == nil && set[s]
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Recv == nil && readerName.MatchString(n.Name.Name) {
				at(n, "func "+n.Name.Name+" reads a setting")
			}
			if n.Body != nil && parsesNumbers(n.Body) && mentionsSetting(n.Body) {
				at(n, "func "+n.Name.Name+" parses a number of a setting with strconv")
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				if limitName.MatchString(id.Name) {
					at(id, "defines "+id.Name)
				}
			}
		case *ast.BasicLit:
			if isLit(n, sizeUnit) {
				at(n, "size unit "+n.Value)
			}
		case *ast.BinaryExpr:
			if (n.Op == token.EQL || n.Op == token.NEQ) && (isLit(n.X, priority) || isLit(n.Y, priority)) {
				at(n, "compares a priority")
			}
		case *ast.CaseClause:
			for _, e := range n.List {
				if isLit(e, priority) {
					at(e, "a case of a priority")
				}
			}
		}
		return true
	})
	return found
}

func parsesNumbers(body ast.Node) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "strconv" &&
				(sel.Sel.Name == "Atoi" || strings.HasPrefix(sel.Sel.Name, "Parse")) {
				found = true
			}
		}
		return !found
	})
	return found
}

func mentionsSetting(body ast.Node) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			found = found || settingName.MatchString(n.Name)
		case *ast.BasicLit:
			found = found || n.Kind == token.STRING && settingKey.MatchString(n.Value)
		}
		return !found
	})
	return found
}

// TestNoOtherParser: outside this package, no Go code of the module reads a
// user setting by a rule of its own (tests aside, which write values on
// purpose).
func TestNoOtherParser(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	self, _ := filepath.Abs(".")
	fset := token.NewFileSet()
	var files int
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "testdata", "node_modules":
				return filepath.SkipDir
			}
			if path == self {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		found = append(found, ownParsers(fset, f)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files under %s: the walk is broken", files, root)
	}
	for _, f := range found {
		t.Errorf("%s: read it with enforcer/vocab", strings.TrimPrefix(f, root+"/"))
	}
}

// The check finds what it is for: a weight parsed by hand, a unit table,
// a priority compared and a limit defined again.
func TestOwnParsersFindsOne(t *testing.T) {
	src := `package p
import "strconv"
const MaxWeight = 1000
func weightOf(v string) int { n, _ := strconv.Atoi(v); if n > MaxWeight { n = 0 }; return n }
func annotated(a map[string]string) uint64 { n, _ := strconv.ParseUint(a["gpuwarden.io/compute-limit"], 10, 32); return n }
var units = map[string]int{"Gi": 30}
func high(p string) bool { return p == "high" }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := ownParsers(fset, f)
	for _, want := range []string{"defines MaxWeight", "func weightOf parses", "func annotated parses", `size unit "Gi"`, "compares a priority"} {
		if !strings.Contains(strings.Join(found, "\n"), want) {
			t.Errorf("ownParsers missed %q: %v", want, found)
		}
	}
}
