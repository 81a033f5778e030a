package gpucheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// devtimeLib builds the bundle's devtime.c, part 4's device-time judge,
// against the CUPTI PyTorch ships (the copy its processes load) or else
// the CUDA toolkit's, into the run's work directory.
func (e *env) devtimeLib(ctx context.Context) (string, error) {
	include, lib, err := e.findCUPTI(ctx)
	if err != nil {
		return "", err
	}
	record, err := newestKernelRecord(filepath.Join(include, "cupti_activity.h"))
	if err != nil {
		return "", err
	}
	args := []string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared", "-I" + include}
	if cuda, err := e.nvidiaHeaders("cuda.h"); err == nil {
		args = append(args, "-I"+cuda) // cupti.h includes cuda.h
	}
	out := filepath.Join(e.work, "devtime.so")
	args = append(args, "-DGW_KERNEL_RECORD="+record, "-o", out, e.bundlePath("src", "devtime.c"),
		lib, "-Wl,-rpath,"+filepath.Dir(lib), "-pthread")
	if b, err := exec.CommandContext(ctx, "cc", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cc %s: %v: %s", strings.Join(args, " "), err, tailText(string(b), 600))
	}
	return out, nil
}

// findCUPTI is the directory of cupti_activity.h and the libcupti beside
// it: PyTorch's (nvidia/*/ in its site-packages) first, then the toolkit's.
func (e *env) findCUPTI(ctx context.Context) (include, lib string, err error) {
	var libs []string
	script := `import glob, nvidia
for p in nvidia.__path__:
    print("\n".join(sorted(glob.glob(p + "/*/lib/libcupti.so*"))))`
	if b, err := e.command(ctx, e.baseEnv(), e.python(), "-c", script).Output(); err == nil {
		libs = strings.Fields(string(b))
	}
	if d, err := e.nvidiaHeaders("cupti_activity.h"); err == nil {
		for _, l := range []string{"lib", "lib64"} {
			found, _ := filepath.Glob(filepath.Join(d, "..", l, "libcupti.so*"))
			libs = append(libs, found...)
		}
	}
	for _, l := range libs {
		inc := filepath.Join(filepath.Dir(l), "..", "include")
		if _, err := os.Stat(filepath.Join(inc, "cupti_activity.h")); err == nil {
			return filepath.Clean(inc), l, nil
		}
	}
	return "", "", fmt.Errorf("no libcupti with its headers beside it (looked at PyTorch's nvidia packages and the CUDA toolkit): %q", libs)
}

var kernelRecord = regexp.MustCompile(`\bCUpti_ActivityKernel([0-9]+)\b`)

// newestKernelRecord names the newest kernel record version the header
// declares: its layout is the one this CUPTI writes.
func newestKernelRecord(header string) (string, error) {
	b, err := os.ReadFile(header)
	if err != nil {
		return "", err
	}
	newest := -1
	for _, m := range kernelRecord.FindAllSubmatch(b, -1) {
		if n, err := strconv.Atoi(string(m[1])); err == nil && n > newest {
			newest = n
		}
	}
	if newest < 0 {
		return "", fmt.Errorf("%s declares no CUpti_ActivityKernelN record", header)
	}
	return fmt.Sprintf("CUpti_ActivityKernel%d", newest), nil
}
