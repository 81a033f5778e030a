package interposer_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestDlsymNextUnchanged: hooking dlsym must not change what
// dlsym(RTLD_NEXT, ...) finds for names we do not manage: glibc decides by
// its caller, which our hook keeps by passing such calls on as a tail call.
// liba's next_probe asks for the "probe" after liba, which is libb's.
func TestDlsymNextUnchanged(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.c":    "#define _GNU_SOURCE\n#include <dlfcn.h>\nint probe(void) { return 1; }\nint next_probe(void) { int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, \"probe\"); return f ? f() : -1; }\n",
		"b.c":    "int probe(void) { return 2; }\n",
		"main.c": "#include <stdio.h>\nint next_probe(void);\nint main(void) { printf(\"%d\\n\", next_probe()); return 0; }\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range [][]string{
		{"-shared", "-fPIC", "-o", "liba.so", "a.c", "-ldl"},
		{"-shared", "-fPIC", "-o", "libb.so", "b.c"},
		{"-o", "main", "main.c", "-L.", "-Wl,--no-as-needed", "-la", "-lb", "-Wl,-rpath," + dir},
	} {
		cmd := exec.Command("gcc", c...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", c, err, out)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "main"))
	cmd.Env = append(cleanEnv(), "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "2" {
		t.Fatalf("dlsym(RTLD_NEXT) under the interposer: %q, %v; want libb's probe (2)", out, err)
	}
}
