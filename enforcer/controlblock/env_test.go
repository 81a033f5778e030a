package controlblock

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseEnv(t *testing.T) {
	const gi, mi = 1 << 30, 1 << 20
	cases := []struct {
		env    map[string]string
		mem    []uint64 // first values; the rest repeat the last
		weight uint32
		limit  uint32
		high   bool
		errVar string
	}{
		{env: map[string]string{}, mem: []uint64{0}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "6Gi"}, mem: []uint64{6 * gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "512Mi"}, mem: []uint64{512 * mi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "3Gi,4Gi,5Gi"}, mem: []uint64{3 * gi, 4 * gi, 5 * gi, 5 * gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "2"}, mem: []uint64{2 * gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "0,1Gi"}, mem: []uint64{0, gi, gi}, weight: 1},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_MEM_DEV": "16"}, mem: []uint64{3 * gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "1Gi", "ALIYUN_COM_GPU_MEM_CONTAINER": "3"}, mem: []uint64{gi}, weight: 1},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"}, mem: []uint64{3 * gi, gi}, weight: 1},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,4,5,6"}, mem: []uint64{3 * gi, 4 * gi, 5 * gi, 6 * gi}, weight: 1},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "0,2"}, mem: []uint64{0, 2 * gi}, weight: 1},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,16", "ALIYUN_COM_GPU_MEM_DEV": "16"}, mem: []uint64{3 * gi, 16 * gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "1Gi", "ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"}, mem: []uint64{gi}, weight: 1},
		{env: map[string]string{"GPUWARDEN_COMPUTE_WEIGHT": "3", "ALIYUN_COM_GPU_SCHD_WEIGHT": "5"}, mem: []uint64{0}, weight: 3},
		{env: map[string]string{"ALIYUN_COM_GPU_SCHD_WEIGHT": "5"}, mem: []uint64{0}, weight: 5},
		{env: map[string]string{"GPUWARDEN_COMPUTE_LIMIT": "30%", "GPUWARDEN_PRIORITY": "high"}, mem: []uint64{0}, weight: 1, limit: 30, high: true},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "6GB"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": ""}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "1Gi,"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "-1"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "99999999999999999999"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": "17179869184Gi"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"GPUWARDEN_MEMORY_LIMIT": strings.Repeat("1,", 16) + "1"}, errVar: "GPUWARDEN_MEMORY_LIMIT"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "x"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "20", "ALIYUN_COM_GPU_MEM_DEV": "16"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,20", "ALIYUN_COM_GPU_MEM_DEV": "16"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": ",1"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3Gi,1"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "3, 1"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": "1048577"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": strings.Repeat("1,", 16) + "1"}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_CONTAINER": ""}, errVar: "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{env: map[string]string{"ALIYUN_COM_GPU_MEM_DEV": "0"}, errVar: "ALIYUN_COM_GPU_MEM_DEV"},
		{env: map[string]string{"GPUWARDEN_COMPUTE_WEIGHT": "0"}, errVar: "GPUWARDEN_COMPUTE_WEIGHT"},
		{env: map[string]string{"ALIYUN_COM_GPU_SCHD_WEIGHT": "1001"}, errVar: "ALIYUN_COM_GPU_SCHD_WEIGHT"},
		{env: map[string]string{"GPUWARDEN_COMPUTE_LIMIT": "101"}, errVar: "GPUWARDEN_COMPUTE_LIMIT"},
		{env: map[string]string{"GPUWARDEN_COMPUTE_LIMIT": "%"}, errVar: "GPUWARDEN_COMPUTE_LIMIT"},
		{env: map[string]string{"GPUWARDEN_PRIORITY": "urgent"}, errVar: "GPUWARDEN_PRIORITY"},
		{env: map[string]string{"GPUWARDEN_CONTROL_DIR": "relative/dir"}, errVar: "GPUWARDEN_CONTROL_DIR"},
	}
	for _, c := range cases {
		e, err := ParseEnv(lookupMap(c.env))
		if c.errVar != "" {
			if err == nil || !strings.HasPrefix(err.Error(), c.errVar+"=") {
				t.Errorf("%v: error %v, want one naming %s", c.env, err, c.errVar)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", c.env, err)
			continue
		}
		for d := 0; d < MaxDevices; d++ {
			w := c.mem[len(c.mem)-1]
			if d < len(c.mem) {
				w = c.mem[d]
			}
			if e.MemLimit[d] != w {
				t.Errorf("%v: device %d limit %d, want %d", c.env, d, e.MemLimit[d], w)
			}
		}
		if e.Weight != c.weight || e.ComputeLimit != c.limit || (e.Priority == PriorityHigh) != c.high || e.ControlDir != DefaultControlDir {
			t.Errorf("%v: got %+v", c.env, e)
		}
	}
}

// cParse runs the interposer's own parser (bin/interposer/gw-envcheck) on env.
func cParse(t testing.TB, bin string, env map[string]string) string {
	cmd := exec.Command(bin)
	cmd.Env = []string{}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gw-envcheck: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// goParse formats ParseEnv's answer as gw-envcheck does.
func goParse(env map[string]string) string {
	e, err := ParseEnv(lookupMap(env))
	if err != nil {
		return "error " + err.(*EnvError).Var
	}
	mem := make([]string, MaxDevices)
	for i, v := range e.MemLimit {
		mem[i] = fmt.Sprint(v)
	}
	set := 0
	if e.MemSet {
		set = 1
	}
	return fmt.Sprintf("ok mem=%s set=%d weight=%d limit=%d priority=%d dir=%s", strings.Join(mem, ","), set, e.Weight,
		e.ComputeLimit, e.Priority, e.ControlDir)
}

// normalize keeps what both parsers must agree on: the values, or the
// variable an error names.
func normalize(s string) string {
	if rest, ok := strings.CutPrefix(s, "error "); ok {
		v, _, _ := strings.Cut(rest, "=")
		return "error " + v
	}
	return s
}

var differential = []map[string]string{
	{}, {"GPUWARDEN_MEMORY_LIMIT": "3Gi,1Gi"}, {"GPUWARDEN_MEMORY_LIMIT": "7"}, {"GPUWARDEN_MEMORY_LIMIT": "1Ti,0"},
	{"GPUWARDEN_MEMORY_LIMIT": "1gi"}, {"GPUWARDEN_MEMORY_LIMIT": " 1Gi"}, {"GPUWARDEN_MEMORY_LIMIT": "18446744073709551615Ki"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_MEM_DEV": "8", "ALIYUN_COM_GPU_SCHD_WEIGHT": "2"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "0"}, {"ALIYUN_COM_GPU_MEM_DEV": "x", "ALIYUN_COM_GPU_MEM_CONTAINER": "y"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"}, {"ALIYUN_COM_GPU_MEM_CONTAINER": "3,4,5,6"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "3,9", "ALIYUN_COM_GPU_MEM_DEV": "8"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "8,0,8", "ALIYUN_COM_GPU_MEM_DEV": "8"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "1048576,1048577"}, {"ALIYUN_COM_GPU_MEM_CONTAINER": strings.Repeat("2,", 15) + "2"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": strings.Repeat("2,", 16) + "2"}, {"ALIYUN_COM_GPU_MEM_CONTAINER": "1,,2"},
	{"ALIYUN_COM_GPU_MEM_CONTAINER": "4Gi"}, {"GPUWARDEN_MEMORY_LIMIT": "2Gi", "ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"},
	{"GPUWARDEN_COMPUTE_LIMIT": "100"}, {"GPUWARDEN_COMPUTE_LIMIT": "50%%"}, {"GPUWARDEN_PRIORITY": "normal"},
	{"GPUWARDEN_CONTROL_DIR": "/tmp/x y"}, {"GPUWARDEN_CONTROL_DIR": "/" + strings.Repeat("a", 254)},
	{"GPUWARDEN_CONTROL_DIR": "/" + strings.Repeat("a", 253)}, {"GPUWARDEN_COMPUTE_WEIGHT": "01000"},
	{"GPUWARDEN_COMPUTE_WEIGHT": "1001"}, {"ALIYUN_COM_GPU_SCHD_WEIGHT": "1000"}, {"GPUWARDEN_COMPUTE_LIMIT": "101%"},
	{"GPUWARDEN_COMPUTE_LIMIT": "00000000000000000000050%"}, {"GPUWARDEN_PRIORITY": "High"}, {"GPUWARDEN_MEMORY_LIMIT": "1Pi"},
	{"GPUWARDEN_MEMORY_LIMIT": "3Ki,2Mi,1Ti,4"}, {"ALIYUN_COM_GPU_MEM_DEV": "1048577"},
}

// TestEnvMatchesC checks that the Go twin and the interposer's parser agree.
func TestEnvMatchesC(t *testing.T) {
	bin := simtest.Bin(t, "interposer/gw-envcheck")
	for _, env := range differential {
		if c, g := normalize(cParse(t, bin, env)), goParse(env); c != g {
			t.Errorf("%v:\n C: %s\nGo: %s", env, c, g)
		}
	}
}

// FuzzParseEnv: the Go parser never panics, errors name their variable, and
// what it accepts holds its promises.
func FuzzParseEnv(f *testing.F) {
	for _, env := range differential {
		f.Add(env["GPUWARDEN_MEMORY_LIMIT"], env["ALIYUN_COM_GPU_MEM_CONTAINER"], env["GPUWARDEN_COMPUTE_LIMIT"], env["GPUWARDEN_CONTROL_DIR"])
	}
	f.Fuzz(func(t *testing.T, mem, cont, limit, dir string) {
		env := map[string]string{"GPUWARDEN_MEMORY_LIMIT": mem, "ALIYUN_COM_GPU_MEM_CONTAINER": cont,
			"GPUWARDEN_COMPUTE_LIMIT": limit, "GPUWARDEN_CONTROL_DIR": dir}
		e, err := ParseEnv(lookupMap(env))
		if err != nil {
			if _, ok := err.(*EnvError); !ok {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		if e.Weight < 1 || e.ComputeLimit > 100 || !strings.HasPrefix(e.ControlDir, "/") || !e.MemSet {
			t.Fatalf("accepted %v as %+v", env, e)
		}
	})
}

// FuzzContainerKey: every cgroup path gives one safe, bounded directory name.
func FuzzContainerKey(f *testing.F) {
	for _, s := range []string{"/", "", "/kubepods.slice/pod-1/cri-containerd-abc.scope", "/.hidden", "/a/b", "/a+b", strings.Repeat("/x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		k := ContainerKey(path)
		if k == "" || len(k) > 200 || k[0] == '.' || strings.ContainsAny(k, "/\x00") || !utf8.ValidString(k) {
			t.Fatalf("ContainerKey(%q) = %q", path, k)
		}
	})
}
