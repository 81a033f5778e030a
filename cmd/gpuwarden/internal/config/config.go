// Package config is the agent's configuration: defaults, then a YAML file,
// then GPUWARDEN_* environment variables, then flags. Every key is defined
// once, in options, from which the defaults, the environment names and the
// reference table in docs/agent.md come.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
	"github.com/gpuwarden/gpuwarden/enforcer/onbreach"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/admission"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Config is the agent's whole configuration.
type Config struct {
	NodeName        string        `mapstructure:"nodeName"`
	ControlDir      string        `mapstructure:"controlDir"`
	ControlDirGrace time.Duration `mapstructure:"controlDirGrace"`
	HTTP            struct {
		Enabled                 bool   `mapstructure:"enabled"`
		Listen                  string `mapstructure:"listen"`
		Pprof                   bool   `mapstructure:"pprof"`
		MaxConnections          int    `mapstructure:"maxConnections"`
		MaxConnectionsPerSource int    `mapstructure:"maxConnectionsPerSource"`
	} `mapstructure:"http"`
	EBPF struct {
		Enabled        bool          `mapstructure:"enabled"`
		PinDir         string        `mapstructure:"pinDir"`
		Libraries      []string      `mapstructure:"libraries"`
		LdconfigSoname string        `mapstructure:"ldconfigSoname"`
		ScanInterval   time.Duration `mapstructure:"scanInterval"`
		LaunchWindow   time.Duration `mapstructure:"launchWindow"`
		LaunchPeriod   time.Duration `mapstructure:"launchPeriod"`
	} `mapstructure:"ebpf"`
	NVML struct {
		Enabled       bool   `mapstructure:"enabled"`
		Library       string `mapstructure:"library"`
		ContextMemory int    `mapstructure:"contextMemory"`
	} `mapstructure:"nvml"`
	Enforcement struct {
		Enabled      bool          `mapstructure:"enabled"`
		OnBreach     string        `mapstructure:"onBreach"`
		OnBypass     string        `mapstructure:"onBypass"` // deprecated: OnBreach
		BreachScope  []string      `mapstructure:"breachScope"`
		APITokenFile string        `mapstructure:"apiTokenFile"`
		StateFile    string        `mapstructure:"stateFile"`
		GracePeriod  time.Duration `mapstructure:"gracePeriod"`
		TimeSlice    time.Duration `mapstructure:"timeSlice"`
	} `mapstructure:"enforcement"`
	Kubelet struct {
		PodResourcesSocket string `mapstructure:"podResourcesSocket"`
	} `mapstructure:"kubelet"`
	Kubernetes struct {
		APIServer string `mapstructure:"apiServer"`
		TokenFile string `mapstructure:"tokenFile"`
		CAFile    string `mapstructure:"caFile"`
	} `mapstructure:"kubernetes"`
	DevicePlugin struct {
		Enabled        bool          `mapstructure:"enabled"`
		MaxInst        int           `mapstructure:"maxInst"`
		KubeletDir     string        `mapstructure:"kubeletDir"`
		InterposerPath string        `mapstructure:"interposerPath"`
		DeviceRoot     string        `mapstructure:"deviceRoot"`
		Preload        string        `mapstructure:"preload"`
		HealthInterval time.Duration `mapstructure:"healthInterval"`
	} `mapstructure:"devicePlugin"`
	DRA struct {
		Enabled      bool   `mapstructure:"enabled"`
		CDIDir       string `mapstructure:"cdiDir"`
		RegistrarDir string `mapstructure:"registrarDir"`
		PluginDir    string `mapstructure:"pluginDir"`
		RemotePool   string `mapstructure:"remotePool"`
	} `mapstructure:"dra"`
	Remote struct {
		Enabled      bool          `mapstructure:"enabled"`
		Listen       string        `mapstructure:"listen"`
		Advertise    string        `mapstructure:"advertise"`
		Cert         string        `mapstructure:"cert"`
		Key          string        `mapstructure:"key"`
		CA           string        `mapstructure:"ca"`
		Worker       string        `mapstructure:"worker"`
		Interposer   string        `mapstructure:"interposer"`
		Timeout      time.Duration `mapstructure:"timeout"`
		DataPath     string        `mapstructure:"dataPath"`
		CgroupParent string        `mapstructure:"cgroupParent"`
		Servers      []string      `mapstructure:"servers"`
		LibraryDir   string        `mapstructure:"libraryDir"`

		MaxSessionsPerClient int      `mapstructure:"maxSessionsPerClient"`
		HighPriority         []string `mapstructure:"highPriority"`

		MaxConnections          int `mapstructure:"maxConnections"`
		MaxConnectionsPerSource int `mapstructure:"maxConnectionsPerSource"`
	} `mapstructure:"remote"`
	Paths struct {
		Proc   string `mapstructure:"proc"`
		Cgroup string `mapstructure:"cgroup"`
	} `mapstructure:"paths"`
	Profiling struct {
		PyroscopeServer string `mapstructure:"pyroscopeServer"`
	} `mapstructure:"profiling"`
	Log struct {
		Level  string `mapstructure:"level"`
		Format string `mapstructure:"format"`
	} `mapstructure:"log"`
}

// option is one configuration key.
type option struct {
	key  string
	def  any
	flag string // a flag of its own, or ""
	help string
}

var options = []option{
	{"nodeName", "", "node-name", "the node's name in metric labels; empty: $NODE_NAME, else the host name"},
	{"controlDir", "/run/gpuwarden", "control-dir", "where containers' control blocks live (the interposer reads the same GPUWARDEN_CONTROL_DIR)"},
	{"controlDirGrace", allocation.DefaultCollectGrace, "", "how long a container's control directory stays once nothing claims it (the kubelet's pod-resources no longer lists its allocation, or the cgroup it was made for is gone) and no live process maps it; then the agent removes it and the settings saved for it (enforcement.stateFile). 0 keeps every one"},
	{"http.enabled", true, "", "serve /metrics, /healthz, /readyz and the API"},
	{"http.listen", ":9477", "listen", "the HTTP server's address"},
	{"http.pprof", false, "", "also serve Go's profiles at /debug/pprof/, to anyone who reaches the port (a profile or trace of at most 30 seconds)"},
	{"http.maxConnections", 512, "", "connections the HTTP server holds open at most; more are closed at once (1-65536)"},
	{"http.maxConnectionsPerSource", 64, "", "connections from one IP address the HTTP server holds open at most (1 to http.maxConnections)"},
	{"ebpf.enabled", true, "", "observe every libcuda with eBPF uprobes"},
	{"ebpf.pinDir", "/sys/fs/bpf/gpuwarden", "", "bpffs directory the eBPF maps are pinned in, so their state outlives an agent restart; empty pins nothing"},
	{"ebpf.libraries", []string{}, "", "libcuda paths attached at start, besides the one ldconfig knows"},
	{"ebpf.ldconfigSoname", "libcuda.so.1", "", "the driver library looked up with `ldconfig -p` and attached at start; empty skips it"},
	{"ebpf.scanInterval", 500 * time.Millisecond, "", "how often /proc/*/maps is scanned for other copies of libcuda; 0 turns scanning off"},
	{"ebpf.launchWindow", 50 * time.Millisecond, "", "how long launch probes stay attached, at a random moment of each launch period, on processes whose ledger counts their launches (a probe hit costs microseconds; a process without a ledger has every launch counted); 0: no launch probes"},
	{"ebpf.launchPeriod", 30 * time.Second, "", "the period of the launch probes' window (each attach and detach costs the observed processes about as much as the window itself)"},
	{"nvml.enabled", true, "", "read devices, per-process memory and utilization through NVML"},
	{"nvml.library", "", "", "path of libnvidia-ml.so.1; empty: the system's"},
	{"nvml.contextMemory", 1024, "", "device memory, in MiB, that NVML may show for a process beyond what its ledger and the eBPF probes count: a context's own memory with the modules it loaded (64 MiB on simgpu; on an H200 with driver 580, 518 MiB for a driver-API program and 766 MiB for PyTorch training ResNet-50, whose ledger counts 64 MiB of it). The judge holds the larger of the two meters against a container's quota and ledger: NVML's, less this per process, catches memory the probes missed (a copy of libcuda used before the scan attached to it). 0-65536"},
	{"enforcement.enabled", true, "", "run the enforcer: budgets, limits and bypass detection"},
	{"enforcement.onBreach", "report", "", "what to do with a container in breach (a bypass, more memory seen than its quota or ledger, a GPU process without a ledger slot, a forged ledger): report, freeze its cgroup (cgroup.freeze; never the agent's own or an ancestor of it), or kill the offending processes (SIGKILL)"},
	{"enforcement.onBypass", "", "", "deprecated, read as enforcement.onBreach when that is left at report: report or freeze"},
	{"enforcement.breachScope", []string{}, "", "the cgroups (paths as in /proc/PID/cgroup, each with everything below it) whose containers onBreach may freeze or kill; a breach elsewhere is reported only. Empty: every cgroup. On Kubernetes, the pods' (/kubepods.slice, /kubepods) keep the node's own GPU processes (monitoring daemons, jobs run outside Kubernetes) from being stopped as bypasses"},
	{"enforcement.apiTokenFile", "/run/gpuwarden-agent/token", "", "the token `gpuwarden ctl` must present to change limits (made at start, mode 0600); changes are taken only from loopback"},
	{"enforcement.stateFile", "/var/lib/gpuwarden/settings.json", "", "where changes made with `gpuwarden ctl` are kept, so they outlive an agent restart"},
	{"enforcement.gracePeriod", 10 * time.Second, "", "how long the interposer keeps the last launch budgets after the agent stops answering, before it runs ungated (1s-1h; memory limits hold regardless)"},
	{"enforcement.timeSlice", 50 * time.Millisecond, "", "how long a container holds a GPU before the next one waiting gets it (10ms-1s; longer where kernels are long, so that a slice holds several): shorter slices make a waiting container wait less, longer ones switch the GPU less often, and every switch costs a little of the device and of a host-bound training's pace. A share is held over many slices: at 1s a container can wait seconds for the GPU, and its share shows only over a minute or more"},
	{"kubelet.podResourcesSocket", "/var/lib/kubelet/pod-resources/kubelet.sock", "", "the kubelet's pod-resources socket, for pod and container labels; a missing socket means no Kubernetes labels"},
	{"devicePlugin.enabled", false, "", "serve the kubelet device plugin: gpuwarden.io/gpu (slots) and gpuwarden.io/gpu-memory (GiB) on each GPU"},
	{"devicePlugin.maxInst", policy.DefaultMaxInst, "", "each GPU's max_inst, 1-128, on and off Kubernetes: the device plugin's slots (gpuwarden.io/gpu devices) on it, a slot's memory quota being the GPU's memory / maxInst, and the 1/maxInst that policies fair-share and fixed give; `gpuwarden ctl gpu N --max-inst` changes one GPU's"},
	{"devicePlugin.kubeletDir", "/var/lib/kubelet/device-plugins", "", "the kubelet's device-plugins directory: its kubelet.sock and the plugin's sockets"},
	{"devicePlugin.interposerPath", "/usr/local/gpuwarden/lib/libgpuwarden.so", "", "libgpuwarden.so on the host, mounted read-only into every allocated container"},
	{"devicePlugin.deviceRoot", "/dev", "", "where the GPU device nodes (nvidiaN, nvidiactl, nvidia-uvm, nvidia-uvm-tools) are; those that exist are passed to containers"},
	{"devicePlugin.preload", "env", "", "how the interposer is preloaded: env (LD_PRELOAD) or ld.so.preload (a file mounted over /etc/ld.so.preload)"},
	{"devicePlugin.healthInterval", 5 * time.Second, "", "how often the GPUs are read again through NVML; a GPU that is gone goes unhealthy"},
	{"dra.enabled", false, "", "serve the DRA driver gpu.gpuwarden.io (Kubernetes 1.36 or later, DRAConsumableCapacity on): each GPU a shareable device with memory and compute capacities, claims prepared as CDI devices with what the device plugin gives a container. It shares devicePlugin.maxInst, interposerPath, deviceRoot, preload and healthInterval, and reaches the API server as kubernetes.* say; never with devicePlugin.enabled"},
	{"dra.cdiDir", "/var/run/cdi", "", "where the container runtime reads CDI specs: one file per prepared claim"},
	{"dra.registrarDir", "/var/lib/kubelet/plugins_registry", "", "the kubelet's plugin registration directory"},
	{"dra.pluginDir", "/var/lib/kubelet/plugins/gpu.gpuwarden.io", "", "the driver's socket directory under the kubelet's plugins directory"},
	{"dra.remotePool", "", "", "the remote pool this node is of: the value of its label gpu.gpuwarden.io/remote-pool, which every node of the pool carries. A node of the pool that serves remote sessions (remote.enabled) offers its GPUs to all of them, itself included, each GPU with the attribute server (remote.advertise), so local and remote claims of a GPU consume one device's capacities; a node of the pool prepares a claim of another node's GPU as a remote session relayed with its certificate (remote.cert, remote.key, remote.ca; remote.libraryDir). Empty: the node's GPUs are its own"},
	{"kubernetes.apiServer", "", "", "the API server the agent reads pod annotations from (gpuwarden.io/weight, compute-limit, priority); empty: the in-cluster address, none off Kubernetes"},
	{"kubernetes.tokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token", "", "the service-account token for the API server"},
	{"kubernetes.caFile", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "", "the API server's CA certificate"},
	{"remote.enabled", false, "", "serve remote GPU sessions: clients on nodes without a GPU run on a slice of this node's GPUs (`gpuwarden run --remote`), each in a worker process of its own under the interposer"},
	{"remote.listen", ":7070", "", "the remote sessions' mutual-TLS listener"},
	{"remote.advertise", "", "", "where clients dial this node's sessions (HOST[:PORT], as its certificate names it), offered to dra.remotePool's nodes with its GPUs; empty: the node's name and remote.listen's port"},
	{"remote.cert", "/etc/gpuwarden/remote/tls.crt", "", "this node's certificate for remote sessions (PEM); clients use the same variable for theirs"},
	{"remote.key", "/etc/gpuwarden/remote/tls.key", "", "the certificate's key (PEM)"},
	{"remote.ca", "/etc/gpuwarden/remote/ca.crt", "", "the CA that signs both ends' certificates; a client's certificate names its namespace, pod and container (spiffe://gpuwarden/ns/NS/pod/POD/container/C)"},
	{"remote.worker", "", "", "the session worker program; empty: gpuwarden-worker beside the gpuwarden binary"},
	{"remote.interposer", "", "", "libgpuwarden.so, preloaded into every session's worker; empty: the one beside the gpuwarden binary"},
	{"remote.timeout", 5 * time.Second, "", "how long a remote link may stay silent before it counts as dead (relayed, both ends send heartbeats; direct, the kernel's keepalive probes and TCP user timeout): the client's calls then fail and the server ends the session (100ms-10m)"},
	{"remote.dataPath", session.PathDirect, "", "where a remote session's bytes go once admitted: direct (the agents hand the authenticated connection, its socket and TLS keys, to the client library and the worker, so no process sits between them) or relayed (both agents relay every byte, as the fallback does where a node's CPU lacks AES-NI or a library is older); relayed on either end keeps a session relayed"},
	{"remote.cgroupParent", "gpuwarden-remote", "", "the cgroup, under the cgroup v2 tree's root, in which each session gets a cgroup of its own"},
	{"remote.servers", []string{}, "", "GPU nodes (HOST[:PORT]) whose agents serve remote sessions to this node's pods: on a node without GPUs the device plugin (devicePlugin.enabled) then advertises gpuwarden.io/remote-gpu, maxInst slots per server GPU, healthy while its server answers, and the agent relays each allocated container's sessions with this node's certificate (remote.cert: `gpuwarden certs node`)"},
	{"remote.libraryDir", "/usr/local/gpuwarden/remote", "", "the remote client library's directory on the host (libcuda.so.1, libnvidia-ml.so.1), mounted read-only into containers allocated gpuwarden.io/remote-gpu"},
	{"remote.maxSessionsPerClient", admission.DefaultSessionsPerClient, "", "remote sessions one client (a certificate's container, or the pod a node's relay names) may hold at once on this server; more are refused, so one client cannot take every session"},
	{"remote.highPriority", []string{}, "", "the clients that may ask for priority high (NAMESPACE[/POD[/CONTAINER]], each part a glob such as * or train-*); a request for high from any other is refused. Empty: none"},
	{"remote.maxConnections", 512, "", "connections the remote listener holds open at most, sessions and handshakes together; more are closed at once (1-65536)"},
	{"remote.maxConnectionsPerSource", 128, "", "connections from one IP address the remote listener holds open at most (1 to remote.maxConnections): a node relaying its pods' sessions opens one per session"},
	{"paths.proc", "/proc", "", "the proc filesystem (the host's, under hostPID)"},
	{"paths.cgroup", "", "", "the host's cgroup directory as the agent sees it: the cgroup v2 mount at it or below it (a hybrid host's unified directory), read from the agent's mountinfo (paths.proc/self/mountinfo), is the tree; empty: the agent's own cgroup v2 mount"},
	{"profiling.pyroscopeServer", "", "", "Pyroscope server address for continuous profiling of the agent; empty: off"},
	{"log.level", "info", "log-level", "debug, info, warn or error"},
	{"log.format", "text", "", "text or json"},
}

// EnvName is the environment variable that sets a key: GPUWARDEN_ and the
// key in upper snake case ("ebpf.pinDir" -> GPUWARDEN_EBPF_PIN_DIR).
func EnvName(key string) string {
	var b strings.Builder
	b.WriteString("GPUWARDEN_")
	for i, r := range key {
		switch {
		case r == '.':
			b.WriteByte('_')
		case r >= 'A' && r <= 'Z':
			if i > 0 && key[i-1] != '.' {
				b.WriteByte('_')
			}
			b.WriteRune(r)
		default:
			b.WriteRune(r - 'a' + 'A')
		}
	}
	return b.String()
}

// Flags registers the flags that set keys, plus --config.
func Flags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML configuration file")
	for _, o := range options {
		if o.flag == "" {
			continue
		}
		switch d := o.def.(type) {
		case string:
			fs.String(o.flag, d, o.help)
		}
	}
}

// Load builds the configuration from the defaults, the file named by
// --config, the environment and the flags, and validates it. Unknown keys
// in the file and bad values are errors.
func Load(fs *pflag.FlagSet, environ []string) (Config, error) {
	v := viper.New()
	for _, o := range options {
		v.SetDefault(o.key, o.def)
		if o.flag != "" {
			if f := fs.Lookup(o.flag); f != nil && f.Changed {
				v.Set(o.key, f.Value.String())
			}
		}
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok {
			env[k] = val
		}
	}
	if file, _ := fs.GetString("config"); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return Config{}, fmt.Errorf("read config: %w", err)
		}
		v.SetConfigType("yaml")
		if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", file, err)
		}
		if err := unknownKeys(v.AllSettings(), ""); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", file, err)
		}
	}
	// Environment over the file, flags over both.
	for _, o := range options {
		val, ok := env[EnvName(o.key)]
		flagSet := o.flag != "" && fs.Lookup(o.flag) != nil && fs.Lookup(o.flag).Changed
		if ok && !flagSet {
			if _, isList := o.def.([]string); isList {
				v.Set(o.key, splitList(val))
			} else {
				v.Set(o.key, val)
			}
		}
	}
	var c Config
	if err := v.UnmarshalExact(&c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// unknownKeys names every key in the file that no option defines.
func unknownKeys(m map[string]any, prefix string) error {
	known := map[string]bool{}
	for _, o := range options {
		k := strings.ToLower(o.key)
		known[k] = true
		for i := strings.IndexByte(k, '.'); i >= 0; i = strings.IndexByte(k[i+1:], '.') + i + 1 {
			known[k[:i]] = true
			if strings.IndexByte(k[i+1:], '.') < 0 {
				break
			}
		}
	}
	var bad []string
	var walk func(m map[string]any, prefix string)
	walk = func(m map[string]any, prefix string) {
		for k, val := range m {
			full := prefix + strings.ToLower(k)
			if !known[full] {
				bad = append(bad, full)
				continue
			}
			if sub, ok := val.(map[string]any); ok {
				walk(sub, full+".")
			}
		}
	}
	walk(m, prefix)
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("unknown keys: %s", strings.Join(bad, ", "))
}

// Validate checks values; it changes nothing.
func (c Config) Validate() error {
	var errs []error
	if c.ControlDir == "" {
		errs = append(errs, errors.New("controlDir is empty"))
	}
	if c.ControlDirGrace < 0 {
		errs = append(errs, fmt.Errorf("controlDirGrace %v is negative", c.ControlDirGrace))
	}
	if c.HTTP.Enabled {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			errs = append(errs, fmt.Errorf("http.listen %q: %w", c.HTTP.Listen, err))
		}
		errs = append(errs, validateConnCaps("http", c.HTTP.MaxConnections, c.HTTP.MaxConnectionsPerSource)...)
	}
	if c.EBPF.ScanInterval < 0 {
		errs = append(errs, fmt.Errorf("ebpf.scanInterval %v is negative", c.EBPF.ScanInterval))
	}
	if c.EBPF.LaunchWindow < 0 || c.EBPF.LaunchPeriod <= 0 || c.EBPF.LaunchWindow > c.EBPF.LaunchPeriod {
		errs = append(errs, fmt.Errorf("ebpf.launchWindow %v must be from 0 to ebpf.launchPeriod %v (positive)",
			c.EBPF.LaunchWindow, c.EBPF.LaunchPeriod))
	}
	if c.Enforcement.Enabled && (c.Enforcement.APITokenFile == "" || c.Enforcement.StateFile == "") {
		errs = append(errs, errors.New("enforcement.apiTokenFile and enforcement.stateFile must be set"))
	}
	if g := c.Enforcement.GracePeriod; g < time.Second || g > time.Hour {
		errs = append(errs, fmt.Errorf("enforcement.gracePeriod %v: want 1s-1h (a dead agent must not stop the workloads for long)", g))
	}
	if s := c.Enforcement.TimeSlice; s < 10*time.Millisecond || s > time.Second {
		errs = append(errs, fmt.Errorf("enforcement.timeSlice %v: want 10ms-1s (shorter switches the GPU faster than a hand-over takes; longer keeps a waiting container from the GPU for seconds)", s))
	}
	switch c.Enforcement.OnBreach {
	case onbreach.Report, onbreach.Freeze, onbreach.Kill:
	default:
		errs = append(errs, fmt.Errorf("enforcement.onBreach %q: want report, freeze or kill", c.Enforcement.OnBreach))
	}
	for _, p := range c.Enforcement.BreachScope {
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
			errs = append(errs, fmt.Errorf("enforcement.breachScope %q: want a clean absolute cgroup path, say /kubepods.slice", p))
		}
	}
	if b := c.Enforcement.OnBypass; b != "" && b != onbreach.Report && b != onbreach.Freeze {
		errs = append(errs, fmt.Errorf("enforcement.onBypass %q: want report or freeze", b))
	}
	if m := c.NVML.ContextMemory; m < 0 || m > 65536 {
		errs = append(errs, fmt.Errorf("nvml.contextMemory %d: want 0-65536 (MiB)", m))
	}
	if c.Paths.Proc == "" {
		errs = append(errs, errors.New("paths.proc is empty"))
	}
	dp := c.DevicePlugin
	var bad *vocab.Error
	if err := vocab.CheckMaxInst(dp.MaxInst); errors.As(err, &bad) {
		errs = append(errs, fmt.Errorf("devicePlugin.maxInst %d: want %s", dp.MaxInst, bad.Want))
	}
	for _, p := range []struct{ key, v string }{{"devicePlugin.kubeletDir", dp.KubeletDir},
		{"devicePlugin.interposerPath", dp.InterposerPath}, {"devicePlugin.deviceRoot", dp.DeviceRoot}} {
		if !strings.HasPrefix(p.v, "/") {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute path", p.key, p.v))
		}
	}
	if dp.Preload != "env" && dp.Preload != "ld.so.preload" {
		errs = append(errs, fmt.Errorf("devicePlugin.preload %q: want env or ld.so.preload", dp.Preload))
	}
	if dp.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("devicePlugin.healthInterval %v: want a positive duration", dp.HealthInterval))
	}
	if err := c.validateRemote(); err != nil {
		errs = append(errs, err)
	}
	if d := c.DRA; d.Enabled {
		if dp.Enabled {
			errs = append(errs, errors.New("dra.enabled with devicePlugin.enabled: one GPU would be offered twice, as extended resources and as DRA devices; enable one"))
		}
		for _, p := range []struct{ key, v string }{{"dra.cdiDir", d.CDIDir}, {"dra.registrarDir", d.RegistrarDir}, {"dra.pluginDir", d.PluginDir}} {
			if !strings.HasPrefix(p.v, "/") {
				errs = append(errs, fmt.Errorf("%s %q: want an absolute path", p.key, p.v))
			}
		}
	}
	if d := c.DRA; d.RemotePool != "" {
		if err := dra.CheckPoolName(d.RemotePool); err != nil {
			errs = append(errs, err)
		}
		if !d.Enabled {
			errs = append(errs, errors.New("dra.remotePool needs dra.enabled: the pool's GPUs are DRA devices"))
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level %q: want debug, info, warn or error", c.Log.Level))
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format %q: want text or json", c.Log.Format))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

// BreachAction is enforcement.onBreach (onbreach.Report, Freeze or Kill),
// or the deprecated onBypass where onBreach is left at report.
func (c Config) BreachAction() string {
	if c.Enforcement.OnBreach == onbreach.Report && c.Enforcement.OnBypass != "" {
		return c.Enforcement.OnBypass
	}
	return c.Enforcement.OnBreach
}

// Reference renders the reference table of every key, for docs/agent.md.
func Reference() string {
	var b strings.Builder
	b.WriteString("| key | environment | flag | default | meaning |\n| --- | --- | --- | --- | --- |\n")
	for _, o := range options {
		flag := ""
		if o.flag != "" {
			flag = "`--" + o.flag + "`"
		}
		def := fmt.Sprint(o.def)
		if l, ok := o.def.([]string); ok {
			def = "[" + strings.Join(l, ", ") + "]"
		}
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | `%s` | %s |\n", o.key, EnvName(o.key), flag, def, o.help)
	}
	return b.String()
}

func (c Config) validateRemote() error {
	r := c.Remote
	var errs []error
	for _, s := range r.Servers {
		if _, _, err := client.SplitServer(s); err != nil {
			errs = append(errs, fmt.Errorf("remote.servers: %w", err))
		}
	}
	if len(r.Servers) > 0 && !c.DevicePlugin.Enabled {
		errs = append(errs, errors.New("remote.servers needs devicePlugin.enabled: the device plugin advertises the servers' GPUs to this node's pods"))
	}
	// What makes the node relay its pods' sessions: either needs the node's
	// certificate and the client library it mounts into them.
	var relays []string
	if len(r.Servers) > 0 {
		relays = append(relays, "remote.servers")
	}
	if c.DRA.RemotePool != "" {
		relays = append(relays, "dra.remotePool")
	}
	if len(relays) > 0 {
		if r.Cert == "" || r.Key == "" || r.CA == "" {
			errs = append(errs, fmt.Errorf("%s needs remote.cert, remote.key and remote.ca: the node's certificate, to relay its pods' sessions",
				strings.Join(relays, " and ")))
		}
		if !strings.HasPrefix(r.LibraryDir, "/") {
			errs = append(errs, fmt.Errorf("remote.libraryDir %q: want an absolute path", r.LibraryDir))
		}
	}
	if r.Advertise != "" {
		if _, _, err := client.SplitServer(r.Advertise); err != nil {
			errs = append(errs, fmt.Errorf("remote.advertise: %w", err))
		}
	}
	if (r.Enabled || len(relays) > 0) && (r.Timeout < 100*time.Millisecond || r.Timeout > 10*time.Minute) {
		errs = append(errs, fmt.Errorf("remote.timeout %v: want 100ms-10m", r.Timeout))
	}
	if _, err := session.ParseDataPath(r.DataPath); err != nil && (r.Enabled || len(relays) > 0) {
		errs = append(errs, fmt.Errorf("remote.dataPath: %w", err))
	}
	if !r.Enabled {
		return errors.Join(errs...)
	}
	if _, _, err := net.SplitHostPort(r.Listen); err != nil {
		errs = append(errs, fmt.Errorf("remote.listen %q: %w", r.Listen, err))
	}
	for _, p := range []struct{ key, v string }{{"remote.cert", r.Cert}, {"remote.key", r.Key}, {"remote.ca", r.CA}} {
		if p.v == "" {
			errs = append(errs, fmt.Errorf("%s is empty: remote sessions need mutual TLS", p.key))
		}
	}
	for _, p := range []struct{ key, v string }{{"remote.worker", r.Worker}, {"remote.interposer", r.Interposer}} {
		if p.v != "" && !strings.HasPrefix(p.v, "/") {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute path", p.key, p.v))
		}
	}
	errs = append(errs, validateConnCaps("remote", r.MaxConnections, r.MaxConnectionsPerSource)...)
	if p := strings.Trim(r.CgroupParent, "/"); p == "" || strings.Contains("/"+p+"/", "/../") || strings.Contains("/"+p+"/", "/./") {
		errs = append(errs, fmt.Errorf("remote.cgroupParent %q: want a cgroup below the root", r.CgroupParent))
	}
	if r.MaxSessionsPerClient < 1 {
		errs = append(errs, fmt.Errorf("remote.maxSessionsPerClient %d: want at least 1", r.MaxSessionsPerClient))
	}
	for _, p := range r.HighPriority {
		if err := admission.CheckPattern(p); err != nil {
			errs = append(errs, fmt.Errorf("remote.highPriority: %w", err))
		}
	}
	return errors.Join(errs...)
}

// maxConnCap bounds a listener's caps: beyond it a cap bounds nothing a
// node's file descriptors would not.
const maxConnCap = 65536

// validateConnCaps checks a listener's maxConnections and
// maxConnectionsPerSource.
func validateConnCaps(part string, total, perSource int) []error {
	var errs []error
	if total < 1 || total > maxConnCap {
		errs = append(errs, fmt.Errorf("%s.maxConnections %d: want 1-%d", part, total, maxConnCap))
	}
	if perSource < 1 || perSource > total {
		errs = append(errs, fmt.Errorf("%s.maxConnectionsPerSource %d: want 1 to %s.maxConnections (%d)", part, perSource, part, total))
	}
	return errs
}

// Advertised is where clients dial this node's remote sessions:
// remote.advertise, or the node's name and remote.listen's port.
func (c Config) Advertised(node string) string {
	if c.Remote.Advertise != "" {
		return c.Remote.Advertise
	}
	_, port, err := net.SplitHostPort(c.Remote.Listen)
	if err != nil || port == "" {
		return node
	}
	return net.JoinHostPort(node, port)
}
