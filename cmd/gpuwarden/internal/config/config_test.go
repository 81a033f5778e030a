package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func load(t *testing.T, yaml string, env []string, args ...string) (Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	Flags(fs)
	if yaml != "" {
		f := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", f)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return Load(fs, env)
}

func TestDefaults(t *testing.T) {
	c, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Listen != ":9477" || c.ControlDir != "/run/gpuwarden" || !c.EBPF.Enabled || !c.Enforcement.Enabled ||
		c.EBPF.LaunchPeriod != 30*time.Second || c.BreachAction() != "report" || c.ControlDirGrace != 5*time.Minute {
		t.Errorf("defaults = %+v", c)
	}
	if dp := c.DevicePlugin; dp.Enabled || dp.MaxInst != 4 || dp.KubeletDir != "/var/lib/kubelet/device-plugins" ||
		dp.InterposerPath != "/usr/local/gpuwarden/lib/libgpuwarden.so" || dp.Preload != "env" || dp.HealthInterval != 5*time.Second {
		t.Errorf("devicePlugin defaults = %+v", dp)
	}
	if h, r := c.HTTP, c.Remote; h.Pprof || h.MaxConnections != 512 || h.MaxConnectionsPerSource != 64 ||
		r.MaxConnections != 512 || r.MaxConnectionsPerSource != 128 {
		t.Errorf("connection caps and pprof defaults = %+v, remote %d/%d", h, r.MaxConnections, r.MaxConnectionsPerSource)
	}
	c, err = load(t, "devicePlugin:\n  enabled: true\n  maxInst: 8\n", []string{"GPUWARDEN_DEVICE_PLUGIN_PRELOAD=ld.so.preload"})
	if err != nil || !c.DevicePlugin.Enabled || c.DevicePlugin.MaxInst != 8 || c.DevicePlugin.Preload != "ld.so.preload" {
		t.Errorf("devicePlugin from file and environment = %+v, %v", c.DevicePlugin, err)
	}
}

// Defaults, then the file, then the environment, then flags.
func TestPrecedence(t *testing.T) {
	yaml := "http:\n  listen: \"127.0.0.1:1000\"\nebpf:\n  launchWindow: 100ms\n  libraries: [/a/libcuda.so.1]\ncontrolDir: /file\n"
	env := []string{"GPUWARDEN_HTTP_LISTEN=127.0.0.1:2000", "GPUWARDEN_CONTROL_DIR=/env", "GPUWARDEN_EBPF_LIBRARIES=/b,/c"}
	c, err := load(t, yaml, env, "--listen", "127.0.0.1:3000")
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Listen != "127.0.0.1:3000" {
		t.Errorf("listen %q: the flag should win", c.HTTP.Listen)
	}
	if c.ControlDir != "/env" {
		t.Errorf("controlDir %q: the environment should win over the file", c.ControlDir)
	}
	if c.EBPF.LaunchWindow != 100*time.Millisecond {
		t.Errorf("launchWindow %v: the file should win over the default", c.EBPF.LaunchWindow)
	}
	if strings.Join(c.EBPF.Libraries, ",") != "/b,/c" {
		t.Errorf("libraries %v from the environment", c.EBPF.Libraries)
	}
}

func TestRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		env        []string
		want       string
	}{
		{"unknown key", "ebpf:\n  pinDirr: /x\n", nil, "unknown keys: ebpf.pindirr"},
		{"unknown section", "metrics:\n  port: 1\n", nil, "unknown keys: metrics"},
		{"bad duration", "ebpf:\n  launchWindow: soon\n", nil, "launchWindow"},
		{"window over period", "ebpf:\n  launchWindow: 1m\n", nil, "ebpf.launchWindow"},
		{"bad bypass action", "enforcement:\n  onBypass: kill\n", nil, `enforcement.onBypass "kill"`},
		{"bad breach action", "enforcement:\n  onBreach: explode\n", nil, `enforcement.onBreach "explode"`},
		{"relative breach scope", "enforcement:\n  breachScope: [kubepods.slice]\n", nil, `enforcement.breachScope "kubepods.slice"`},
		{"unclean breach scope", "", []string{"GPUWARDEN_ENFORCEMENT_BREACH_SCOPE=/kubepods/../system.slice"}, `enforcement.breachScope "/kubepods/../system.slice"`},
		{"grace period 0", "enforcement:\n  gracePeriod: 0s\n", nil, "enforcement.gracePeriod 0s"},
		{"grace period too long", "", []string{"GPUWARDEN_ENFORCEMENT_GRACE_PERIOD=2h"}, "enforcement.gracePeriod 2h0m0s"},
		{"time slice too short", "enforcement:\n  timeSlice: 1ms\n", nil, "enforcement.timeSlice 1ms"},
		{"time slice too long", "", []string{"GPUWARDEN_ENFORCEMENT_TIME_SLICE=2s"}, "enforcement.timeSlice 2s"},
		{"negative controlDirGrace", "", []string{"GPUWARDEN_CONTROL_DIR_GRACE=-1s"}, "controlDirGrace -1s is negative"},
		{"bad listen", "", []string{"GPUWARDEN_HTTP_LISTEN=9477"}, "http.listen"},
		{"bad log level", "", []string{"GPUWARDEN_LOG_LEVEL=loud"}, "log.level"},
		{"bad bool", "", []string{"GPUWARDEN_EBPF_ENABLED=maybe"}, "ebpf.enabled"},
		{"not yaml", "ebpf: [", nil, "config"},
		{"maxInst 0", "devicePlugin:\n  maxInst: 0\n", nil, "devicePlugin.maxInst 0"},
		{"a negative context allowance", "nvml:\n  contextMemory: -1\n", nil, "nvml.contextMemory -1: want 0-65536"},
		{"a context allowance not a number", "", []string{"GPUWARDEN_NVML_CONTEXT_MEMORY=512Mi"}, "contextMemory"},
		{"maxInst not a number", "", []string{"GPUWARDEN_DEVICE_PLUGIN_MAX_INST=four"}, "maxInst"},
		{"relative kubeletDir", "devicePlugin:\n  kubeletDir: kubelet\n", nil, "devicePlugin.kubeletDir"},
		{"bad preload", "devicePlugin:\n  preload: LD_PRELOAD\n", nil, `devicePlugin.preload "LD_PRELOAD"`},
		{"zero health interval", "devicePlugin:\n  healthInterval: 0s\n", nil, "devicePlugin.healthInterval"},
		{"unknown devicePlugin key", "devicePlugin:\n  maxinstances: 3\n", nil, "unknown keys: deviceplugin.maxinstances"},
		{"remote bad listen", "remote:\n  enabled: true\n  listen: \"7070\"\n", nil, "remote.listen"},
		{"remote no CA", "remote:\n  enabled: true\n  ca: \"\"\n", nil, "remote.ca is empty"},
		{"remote timeout 0", "", []string{"GPUWARDEN_REMOTE_ENABLED=true", "GPUWARDEN_REMOTE_TIMEOUT=0s"}, "remote.timeout 0s"},
		{"remote relative worker", "remote:\n  enabled: true\n  worker: bin/w\n", nil, "remote.worker"},
		{"remote cgroup parent above the root", "remote:\n  enabled: true\n  cgroupParent: a/../..\n", nil, "remote.cgroupParent"},
		{"remote bad server", "", []string{"GPUWARDEN_REMOTE_SERVERS=gpu-1,host:http"}, "remote.servers"},
		{"remote servers without a CA", "devicePlugin:\n  enabled: true\nremote:\n  servers: [gpu-1]\n  ca: \"\"\n", nil, "remote.servers needs remote.cert"},
		{"remote relative library dir", "remote:\n  servers: [gpu-1]\n  libraryDir: lib\n", nil, "remote.libraryDir"},
		{"remote servers without the device plugin", "remote:\n  servers: [gpu-1]\n", nil, "remote.servers needs devicePlugin.enabled"},
		{"DRA beside the device plugin", "dra:\n  enabled: true\ndevicePlugin:\n  enabled: true\n", nil, "dra.enabled with devicePlugin.enabled"},
		{"remote pool without DRA", "dra:\n  remotePool: rack-1\n", nil, "dra.remotePool needs dra.enabled"},
		{"remote pool not a label value", "dra:\n  enabled: true\n  remotePool: rack/1\n", nil, `dra.remotePool "rack/1": want a label value`},
		{"remote pool without a CA", "dra:\n  enabled: true\n  remotePool: rack-1\nremote:\n  ca: \"\"\n", nil, "dra.remotePool needs remote.cert"},
		{"bad advertised address", "remote:\n  enabled: true\n  advertise: \"gpu-1:99999\"\n", nil, "remote.advertise"},
		{"DRA relative CDI directory", "dra:\n  enabled: true\n  cdiDir: cdi\n", nil, `dra.cdiDir "cdi": want an absolute path`},
		{"DRA unknown key", "dra:\n  enable: true\n", nil, "unknown keys: dra.enable"},
		{"remote root cgroup parent", "remote:\n  enabled: true\n  cgroupParent: /\n", nil, "remote.cgroupParent"},
		{"remote no sessions per client", "remote:\n  enabled: true\n  maxSessionsPerClient: 0\n", nil, "remote.maxSessionsPerClient 0"},
		{"remote data path unknown", "", []string{"GPUWARDEN_REMOTE_ENABLED=true", "GPUWARDEN_REMOTE_DATA_PATH=kernel"}, `remote.dataPath: data path "kernel"`},
		{"remote bad high-priority pattern", "", []string{"GPUWARDEN_REMOTE_ENABLED=true", "GPUWARDEN_REMOTE_HIGH_PRIORITY=ml/train-[0"}, `remote.highPriority: pattern "ml/train-[0"`},
		{"remote high priority too deep", "remote:\n  enabled: true\n  highPriority: [a/b/c/d]\n", nil, `pattern "a/b/c/d"`},
		{"http no connections", "http:\n  maxConnections: 0\n", nil, "http.maxConnections 0: want 1-65536"},
		{"http connections not a number", "", []string{"GPUWARDEN_HTTP_MAX_CONNECTIONS=many"}, "maxConnections"},
		{"http per source over the total", "", []string{"GPUWARDEN_HTTP_MAX_CONNECTIONS_PER_SOURCE=1000"}, "http.maxConnectionsPerSource 1000: want 1 to http.maxConnections (512)"},
		{"bad pprof", "", []string{"GPUWARDEN_HTTP_PPROF=sometimes"}, "http.pprof"},
		{"remote per source 0", "remote:\n  enabled: true\n  maxConnectionsPerSource: 0\n", nil, "remote.maxConnectionsPerSource 0"},
		{"remote too many connections", "", []string{"GPUWARDEN_REMOTE_ENABLED=true", "GPUWARDEN_REMOTE_MAX_CONNECTIONS=100000"}, "remote.maxConnections 100000: want 1-65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.yaml, tt.env)
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tt.want)) {
				t.Errorf("error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"controlDir":                 "GPUWARDEN_CONTROL_DIR",
		"ebpf.pinDir":                "GPUWARDEN_EBPF_PIN_DIR",
		"kubelet.podResourcesSocket": "GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET",
		"http.listen":                "GPUWARDEN_HTTP_LISTEN",
		"remote.timeout":             "GPUWARDEN_REMOTE_TIMEOUT",
		"remote.cgroupParent":        "GPUWARDEN_REMOTE_CGROUP_PARENT",
		"remote.servers":             "GPUWARDEN_REMOTE_SERVERS",
		"remote.libraryDir":          "GPUWARDEN_REMOTE_LIBRARY_DIR",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
}

// docs/agent.md's reference table is the one these definitions generate.
func TestReadmeReferenceIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/agent.md has no %q ... %q section", begin, end)
	}
	if got := s[i+len(begin) : j]; got != Reference() {
		t.Errorf("docs/agent.md's configuration table is stale; run `go run ./cmd/gpuwarden agent --print-config-reference` and paste:\n%s", Reference())
	}
}

// TestBreachAction: onBypass, deprecated, still freezes where onBreach is
// left at report; onBreach set otherwise wins.
func TestBreachAction(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"", "report"},
		{"enforcement:\n  onBypass: freeze\n", "freeze"},
		{"enforcement:\n  onBreach: kill\n", "kill"},
		{"enforcement:\n  onBreach: kill\n  onBypass: freeze\n", "kill"},
	} {
		c, err := load(t, tc.file, nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		if got := c.BreachAction(); got != tc.want {
			t.Errorf("%q: BreachAction() = %q, want %q", tc.file, got, tc.want)
		}
	}
}

// TestRemoteAdmissionKeys: by default a client holds at most 16 sessions
// and nobody runs at high priority; both are set from the file or the
// environment.
func TestRemoteAdmissionKeys(t *testing.T) {
	c, err := load(t, "", nil)
	if err != nil || c.Remote.MaxSessionsPerClient != 16 || len(c.Remote.HighPriority) != 0 {
		t.Errorf("defaults: %d sessions per client, high priority %v, %v", c.Remote.MaxSessionsPerClient, c.Remote.HighPriority, err)
	}
	c, err = load(t, "remote:\n  enabled: true\n  maxSessionsPerClient: 4\n", []string{"GPUWARDEN_REMOTE_HIGH_PRIORITY=ml, infra/serve-*/main"})
	if err != nil || c.Remote.MaxSessionsPerClient != 4 || strings.Join(c.Remote.HighPriority, ",") != "ml,infra/serve-*/main" {
		t.Errorf("set: %d sessions per client, high priority %v, %v", c.Remote.MaxSessionsPerClient, c.Remote.HighPriority, err)
	}
}
