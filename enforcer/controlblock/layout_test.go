package controlblock

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestLayoutMatchesHeader compiles a C program that prints offsetof and
// sizeof of every field of the control-block structs, as gpuwarden_abi.h
// lays them out, and compares each with the Go mirror (alignchecker-style).
func TestLayoutMatchesHeader(t *testing.T) {
	structs := []struct {
		c   string
		go_ reflect.Type
	}{
		{"struct gw_gate", reflect.TypeOf(Gate{})},
		{"struct gw_limits", reflect.TypeOf(Limits{})},
		{"struct gw_slot", reflect.TypeOf(Slot{})},
		{"struct gw_usage", reflect.TypeOf(Usage{})},
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include \"gpuwarden_abi.h\"\nint main(void) {\n")
	want := map[string][2]uintptr{}
	for _, s := range structs {
		src.WriteString(fmt.Sprintf("    printf(\"%s - 0 %%zu\\n\", sizeof(%s));\n", s.c, s.c))
		want[s.c+" -"] = [2]uintptr{0, s.go_.Size()}
		for i := 0; i < s.go_.NumField(); i++ {
			f := s.go_.Field(i)
			c := f.Tag.Get("c")
			if c == "" {
				t.Fatalf("%s.%s has no c tag", s.go_.Name(), f.Name)
			}
			src.WriteString(fmt.Sprintf("    printf(\"%s %s %%zu %%zu\\n\", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n",
				s.c, c, s.c, c, s.c, c))
			want[s.c+" "+c] = [2]uintptr{f.Offset, f.Type.Size()}
		}
	}
	src.WriteString("    return 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "layout.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	inc := filepath.Join(simtest.Root(t), "enforcer", "interposer")
	bin := filepath.Join(dir, "layout")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I", inc, "-o", bin, filepath.Join(dir, "layout.c")).CombinedOutput(); err != nil {
		t.Fatalf("compile layout program: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 {
			t.Fatalf("bad line %q", sc.Text())
		}
		name := f[0] + " " + f[1] + " " + f[2]
		off, _ := strconv.ParseUint(f[3], 10, 64)
		size, _ := strconv.ParseUint(f[4], 10, 64)
		w, ok := want[name]
		if !ok {
			t.Errorf("C field %s has no Go twin", name)
			continue
		}
		seen++
		if uintptr(off) != w[0] || uintptr(size) != w[1] {
			t.Errorf("%s: C offset %d size %d, Go offset %d size %d", name, off, size, w[0], w[1])
		}
	}
	if seen != len(want) {
		t.Errorf("compared %d fields, want %d", seen, len(want))
	}
	if LimitsSize != 2048 || UsageSize != 4096+MaxSlots*256 {
		t.Errorf("sizes %d %d", LimitsSize, UsageSize)
	}
}
