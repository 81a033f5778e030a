package simgpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// bin/simgpu/cuda-check (simgpu/tests/cuda_check.c) is the conformance suite
// of simgpu's CUDA driver half: one process that runs many checks against
// libcuda.so.1 and prints a TAP-like line for each,
//
//	ok - <name>
//	not ok - <name>: <detail>
//	1..<checks run>
//
// TestCUDAConformance runs it on a fresh machine and reports every line as a
// subtest, so a failure names its check, and one check can be looked at with
// `go test ./simgpu -run 'CUDAConformance/memory/pitch' -v` (or, without Go,
// `bin/simgpu/cuda-check --only memory/pitch` with the machine's environment).

const (
	cudaCheckDevices   = 4
	cudaCheckMemory    = "8Gi"
	cudaCheckMinChecks = 40 // fewer means the suite did not really run
	cudaCheckTimeout   = 3 * time.Minute
)

var (
	cudaCheckResultLine = regexp.MustCompile(`^(ok|not ok) - ([^\s:]+)(?:: (.*))?$`)
	cudaCheckPlanLine   = regexp.MustCompile(`^1\.\.(\d+)$`)
)

type cudaCheckResult struct {
	name   string
	ok     bool
	detail string
}

// parseCUDACheck reads cuda-check's output: its results in order, the plan's
// count (-1 when missing) and any line that is neither.
func parseCUDACheck(out string) (results []cudaCheckResult, plan int, stray []string) {
	plan = -1
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if m := cudaCheckResultLine.FindStringSubmatch(line); m != nil {
			results = append(results, cudaCheckResult{name: m[2], ok: m[1] == "ok", detail: m[3]})
		} else if m := cudaCheckPlanLine.FindStringSubmatch(line); m != nil {
			plan, _ = strconv.Atoi(m[1])
		} else if line != "" && !strings.HasPrefix(line, "#") {
			stray = append(stray, line)
		}
	}
	return results, plan, stray
}

func TestCUDAConformance(t *testing.T) {
	bin := simtest.Bin(t, "simgpu/cuda-check")
	m := simtest.NewMachine(t, cudaCheckDevices, cudaCheckMemory)

	cmd := m.Command(bin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	timer := time.AfterFunc(cudaCheckTimeout, func() { _ = cmd.Process.Kill() })
	runErr := cmd.Wait()
	timer.Stop()

	results, plan, stray := parseCUDACheck(stdout.String())
	seen := make(map[string]bool, len(results))
	var failed []string
	for _, r := range results {
		if seen[r.name] {
			t.Errorf("cuda-check reported %q twice", r.name)
		}
		seen[r.name] = true
		if !r.ok {
			failed = append(failed, r.name)
		}
		t.Run(r.name, func(t *testing.T) {
			if !r.ok {
				t.Error(r.detail)
			}
		})
	}

	for _, line := range stray {
		t.Errorf("cuda-check printed an unexpected line: %q", line)
	}
	if plan != len(results) {
		t.Errorf("cuda-check reported %d checks but its plan says %d (-1: no plan; did it die mid-way?)",
			len(results), plan)
	}
	if len(results) < cudaCheckMinChecks {
		t.Errorf("cuda-check ran %d checks, want at least %d", len(results), cudaCheckMinChecks)
	}
	if runErr != nil {
		why := runErr.Error()
		var ee *exec.ExitError
		if errors.As(runErr, &ee) && ee.Exited() {
			why = fmt.Sprintf("exit status %d", ee.ExitCode())
		}
		t.Errorf("cuda-check: %s; failed checks: %s", why, strings.Join(failed, ", "))
	}
	if t.Failed() && stderr.Len() > 0 {
		t.Logf("cuda-check stderr:\n%s", stderr.String())
	}
}
