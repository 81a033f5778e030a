package gpucheck

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func simHeader(t *testing.T, name string) headerDecls {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(simtest.Root(t), "simgpu", "include", name))
	if err != nil {
		t.Fatal(err)
	}
	return parseHeader(name, string(b))
}

func find(ds []decl, kind, key string) (decl, bool) {
	for _, d := range ds {
		if d.kind == kind && d.String() == key {
			return d, true
		}
	}
	return decl{}, false
}

// The parser finds what simgpu declares, whichever way the header writes it.
func TestParseSimgpuHeaders(t *testing.T) {
	cuda, nvml := simHeader(t, "cuda.h"), simHeader(t, "nvml.h")
	for _, c := range []struct {
		h          headerDecls
		kind, name string
		params     string
	}{
		{cuda, "function", "cuInit", "(unsigned int Flags)"},     // an X-macro entry
		{cuda, "function", "cuGraphInstantiate_v2", ""},          // a plain prototype after the list
		{cuda, "function", "cuGetProcAddress_v2", ""},            // an entry over several lines
		{nvml, "function", "nvmlInit_v2", "(void)"},              // NVML's plain prototypes
		{cuda, "value", "CU_MEM_LOCATION_TYPE_DEVICE", ""},       // an enum constant
		{cuda, "sizeof", "CUmemAllocationProp", ""},              // a struct
		{cuda, "offsetof", "CUmemAllocationProp.allocFlags", ""}, // a nested struct member
		{cuda, "offsetof", "CUlaunchConfig.blockDimZ", ""},       // one of a comma list
		{cuda, "offsetof", "CUlaunchConfig.hStream", ""},         // after it
		{nvml, "value", "NVML_DEVICE_UUID_BUFFER_SIZE", ""},      // a #define
	} {
		list := c.h.layout
		if c.kind == "function" {
			list = c.h.funcs
		}
		d, ok := find(list, c.kind, c.name)
		if !ok {
			t.Errorf("%s: no %s %s", c.h.header, c.kind, c.name)
		} else if c.params != "" && d.params != c.params {
			t.Errorf("%s params %q, want %q", c.name, d.params, c.params)
		}
	}
	if _, ok := find(cuda.layout, "value", "CUDA_VERSION"); ok {
		t.Error("CUDA_VERSION is simgpu's own and must not be compared")
	}
	if len(cuda.funcs) < 77 || len(nvml.funcs) < 27 {
		t.Errorf("found %d cuda.h and %d nvml.h functions", len(cuda.funcs), len(nvml.funcs))
	}
}

// A header that differs from simgpu's in a prototype, an enum value, a
// struct and a missing function fails part 1, naming each.
func TestDeclarationsFindMismatches(t *testing.T) {
	root := simtest.Root(t)
	bundle, nvidia := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "include", "simgpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cuda.h", "nvml.h"} {
		b, err := os.ReadFile(filepath.Join(root, "simgpu", "include", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bundle, "include", "simgpu", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, edit := range [][2]string{
			{"X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))", "X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, unsigned int bytesize))"},
			{"CU_MEM_LOCATION_TYPE_HOST = 0x2,", "CU_MEM_LOCATION_TYPE_HOST = 0x7,"},
			{"    CUmemLocationType type;\n    int id;", "    CUmemLocationType type;\n    long long id;"},
			{"    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size))                                        \\\n", ""},
			{"nvmlReturn_t nvmlShutdown(void);", "nvmlReturn_t nvmlShutdown(int now);"},
		} {
			s = strings.Replace(s, edit[0], edit[1], 1)
		}
		if err := os.WriteFile(filepath.Join(nvidia, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{o: Options{Bundle: bundle, CUDAInclude: nvidia, Out: t.TempDir()}, work: t.TempDir()}
	r := &Result{}
	checkDeclarations(context.Background(), e, r)
	if r.Status() != Fail {
		t.Fatalf("status %s, want a failure: %+v", r.Status(), r.Checks)
	}
	full, err := os.ReadFile(filepath.Join(e.o.Out, "declarations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"`cuMemAlloc_v2", "NVIDIA's is `CUresult (*)(CUdeviceptr *, unsigned int)`", "value CU_MEM_LOCATION_TYPE_HOST: NVIDIA's 7, simgpu's 2",
		"sizeof CUmemLocation: NVIDIA's 16, simgpu's 8", "`cuMemUnmap", "`nvmlShutdown"} {
		if !strings.Contains(string(full), want) {
			t.Errorf("declarations.md does not say %q:\n%s", want, full)
		}
	}
	if strings.Contains(string(full), "cuInit") {
		t.Errorf("cuInit is the same on both sides, yet reported:\n%s", full)
	}
}
