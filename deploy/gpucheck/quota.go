package gpucheck

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	gib        = uint64(1) << 30
	quotaBytes = 8 * gib
	quotaEnv   = "GPUWARDEN_MEMORY_LIMIT=8Gi"
)

// allocKinds are cuda-alloc's allocation paths: the driver API's plain,
// managed, stream-ordered, pool and VMM allocations.
var allocKinds = []string{"linear", "managed", "async", "pool", "vmm"}

// checkQuota is part 2: an 8 GiB quota through every allocation path, the
// driver API's here and everywhere, the CUDA runtime's, PyTorch's and
// nvidia-smi's view on NVIDIA's driver.
func checkQuota(ctx context.Context, e *env, r *Result) {
	e.quotaDriverAPI(ctx, r)
	if e.o.Simulate {
		why := "simulation mode: needs NVIDIA's driver"
		r.Skip("CUDA runtime paths (nvcc)", "%s and nvcc", why)
		r.Skip("PyTorch", "%s and PyTorch", why)
		r.Skip("nvidia-smi", "%s and nvidia-smi", why)
		return
	}
	e.quotaRuntime(ctx, r)
	e.quotaTorch(ctx, r)
	e.quotaSMI(ctx, r)
}

// quotaDriverAPI holds cuda-alloc to the quota on each driver-API path:
// 7 GiB fits, 2 GiB more is refused; without the interposer the same 9 GiB
// fit, so the refusal is the quota's.
func (e *env) quotaDriverAPI(ctx context.Context, r *Result) {
	p, err := e.startSteered(ctx, e.preloaded(e.newDir("quota"), quotaEnv), nil)
	if err != nil {
		r.Fail("driver API: cuMemGetInfo", "%v", err)
		return
	}
	_ = p.do("ctx 0")
	info := strings.Fields(p.do("meminfo"))
	p.quit()
	if len(info) == 3 && info[0] == "ok" {
		free, _ := strconv.ParseUint(info[1], 10, 64)
		total, _ := strconv.ParseUint(info[2], 10, 64)
		r.Expect(total == quotaBytes && free <= total, "driver API: cuMemGetInfo", "total %s, free %s (want total 8 GiB)", bytesText(total), bytesText(free))
	} else {
		r.Fail("driver API: cuMemGetInfo", "answered %q", strings.Join(info, " "))
	}
	for _, kind := range allocKinds {
		first, second, err := e.allocPair(ctx, e.preloaded(e.newDir("quota"), quotaEnv), kind)
		name := "driver API: " + kind
		if err != nil {
			r.Fail(name, "%v", err)
			continue
		}
		r.Expect(strings.HasPrefix(first, "ok") && second == "err 2", name,
			"7 GiB: %s; 2 GiB more: %s (want ok, then err 2: CUDA_ERROR_OUT_OF_MEMORY)", first, second)
	}
	first, second, err := e.allocPair(ctx, e.baseEnv(), "linear")
	if err != nil {
		r.Fail("driver API without the interposer", "%v", err)
	} else {
		r.Expect(strings.HasPrefix(first, "ok") && strings.HasPrefix(second, "ok"), "driver API without the interposer",
			"7 GiB: %s; 2 GiB more: %s (the device has room: a refusal above is the quota's)", first, second)
	}
	p, err = e.startSteered(ctx, e.preloaded(e.newDir("quota"), quotaEnv), nil)
	if err != nil {
		r.Fail("driver API: graph launch", "%v", err)
		return
	}
	_ = p.do("ctx 0")
	got := p.do("launch 100 graph")
	p.quit()
	r.Expect(got == "ok", "driver API: graph launch", "100 launches of a captured graph: %s", got)
}

// allocPair runs cuda-alloc with env: 7 GiB, then 2 GiB more, by one path.
func (e *env) allocPair(ctx context.Context, env []string, kind string) (string, string, error) {
	p, err := e.startSteered(ctx, env, nil)
	if err != nil {
		return "", "", err
	}
	defer p.quit()
	if got := p.do("ctx 0"); got != "ok" {
		return "", "", fmt.Errorf("ctx 0: %s", got)
	}
	first := p.do(fmt.Sprintf("alloc %s %d", kind, 7*gib))
	second := p.do(fmt.Sprintf("alloc %s %d", kind, 2*gib))
	return first, second, nil
}

// quotaRuntime builds cuda_paths.cu with nvcc and runs it under the quota:
// each CUDA runtime path (and cuMemCreate, and a graph's allocation node)
// must take 7 GiB and refuse 2 GiB more.
func (e *env) quotaRuntime(ctx context.Context, r *Result) {
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		r.Fail("CUDA runtime paths (nvcc)", "nvcc is not on PATH")
		return
	}
	exe := filepath.Join(e.work, "cuda-paths")
	if out, err := exec.CommandContext(ctx, nvcc, "-O2", "-o", exe, e.bundlePath("src", "cuda_paths.cu"), "-lcuda").CombinedOutput(); err != nil {
		r.Fail("CUDA runtime paths (nvcc)", "nvcc: %v: %s", err, out)
		return
	}
	out, err := e.command(ctx, e.preloaded(e.newDir("quota"), quotaEnv), exe).CombinedOutput()
	if err != nil {
		r.Fail("CUDA runtime paths (nvcc)", "cuda-paths: %v: %s", err, out)
		return
	}
	seen := 0
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 4 && f[0] == "meminfo":
			total, _ := strconv.ParseUint(f[3], 10, 64)
			r.Expect(f[1] == "ok" && total == quotaBytes, "runtime: cudaMemGetInfo", "%s, total %s (want 8 GiB)", f[1], bytesText(total))
		case len(f) == 4 && f[0] == "path":
			seen++
			refused := f[3] == "cudaErrorMemoryAllocation" || f[3] == "CUDA_ERROR_OUT_OF_MEMORY"
			r.Expect(f[2] == "ok" && refused, "runtime: "+f[1], "7 GiB: %s; 2 GiB more: %s (want ok, then refused)", f[2], f[3])
		}
	}
	if seen == 0 {
		r.Fail("CUDA runtime paths (nvcc)", "cuda-paths printed no result: %s", out)
	}
}

// torchQuota is what torch_quota.py prints.
type torchQuota struct {
	Total   uint64 `json:"total"`
	Free    uint64 `json:"free"`
	Fit7    string `json:"fit7"`
	Over    string `json:"over"`
	OverMsg string `json:"over_msg"`
}

// quotaTorch runs torch_quota.py under the quota with PyTorch's caching
// allocator, its cudaMallocAsync backend and expandable segments (VMM).
func (e *env) quotaTorch(ctx context.Context, r *Result) {
	for _, conf := range []string{"", "backend:cudaMallocAsync", "expandable_segments:True"} {
		name := "PyTorch, caching allocator"
		if conf != "" {
			name = "PyTorch, " + conf
		}
		env := e.preloaded(e.newDir("quota"), quotaEnv)
		if conf != "" {
			env = append(env, "PYTORCH_CUDA_ALLOC_CONF="+conf)
		}
		out, err := e.command(ctx, env, e.python(), e.bundlePath("src", "torch_quota.py")).Output()
		var q torchQuota
		if err != nil || json.Unmarshal(lastLine(out), &q) != nil {
			r.Fail(name, "torch_quota.py: %v: %s", err, out)
			continue
		}
		r.Expect(q.Total == quotaBytes && q.Fit7 == "ok" && q.Over == "OutOfMemoryError", name,
			"mem_get_info total %s; 7 GiB tensor: %s; 2 GiB more: %s (want 8 GiB, ok, OutOfMemoryError)", bytesText(q.Total), q.Fit7, q.Over)
	}
}

// quotaSMI asks nvidia-smi for the device's memory under the interposer.
func (e *env) quotaSMI(ctx context.Context, r *Result) {
	args := []string{"--query-gpu=memory.total", "--format=csv,noheader,nounits"}
	plain, err1 := e.command(ctx, e.baseEnv(), "nvidia-smi", args...).Output()
	under, err2 := e.command(ctx, e.preloaded(e.newDir("quota"), quotaEnv), "nvidia-smi", args...).Output()
	if err1 != nil || err2 != nil {
		r.Fail("nvidia-smi", "without: %v; with the interposer: %v: %s", err1, err2, under)
		return
	}
	first := strings.SplitN(strings.TrimSpace(string(under)), "\n", 2)[0]
	r.Expect(first == "8192", "nvidia-smi", "memory.total under the interposer: %s MiB (without: %s MiB; want 8192)",
		first, strings.TrimSpace(string(plain)))
}

func lastLine(b []byte) []byte {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return []byte(lines[len(lines)-1])
}

func bytesText(b uint64) string {
	switch {
	case b >= gib && b%(gib/8) == 0:
		return fmt.Sprintf("%g GiB", float64(b)/float64(gib))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", b)
}
