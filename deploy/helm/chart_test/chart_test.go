// Package chart_test lints and renders the gpuwarden chart with Helm's own
// Go packages and decodes every object it renders strictly into its
// Kubernetes API type. It is a module of its own so Helm's dependency tree
// stays out of the agent's.
package chart_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../gpuwarden"
	namespace = "gpu-system"
	release   = "gpuwarden"
)

// Helm logs every symlink it follows (files/alerts, files/grafana) to the
// standard logger: keep test output readable.
func init() { log.SetOutput(io.Discard) }

var kubeVersion = &chartutil.KubeVersion{Version: "v1.34.0", Major: "1", Minor: "34"}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render is `helm template` with values, returning the manifests and NOTES.
func render(t *testing.T, vals map[string]any) (map[string]string, string, error) {
	t.Helper()
	cfg := &action.Configuration{
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Releases:     storage.Init(driver.NewMemory()),
		Capabilities: chartutil.DefaultCapabilities,
		Log:          func(string, ...any) {},
	}
	in := action.NewInstall(cfg)
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.ReleaseName, in.Namespace = release, namespace
	in.KubeVersion = kubeVersion
	in.APIVersions = chartutil.VersionSet{"monitoring.coreos.com/v1"}
	rel, err := in.Run(loadChart(t), vals)
	if err != nil {
		return nil, "", err
	}
	return releaseutil.SplitManifests(rel.Manifest), rel.Info.Notes, nil
}

// objects decodes every rendered document strictly: a field its type does
// not have is an error.
type objects struct {
	DaemonSets          []appsv1.DaemonSet
	ConfigMaps          []corev1.ConfigMap
	Services            []corev1.Service
	ServiceAccounts     []corev1.ServiceAccount
	ClusterRoles        []rbacv1.ClusterRole
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
	DeviceClasses       []resourcev1.DeviceClass
	Custom              map[string]map[string]any // kind -> object (CRDs)
}

func decode(t *testing.T, manifests map[string]string) objects {
	t.Helper()
	o := objects{Custom: map[string]map[string]any{}}
	strict := func(doc string, into any) {
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("strict decode into %T: %v\n%s", into, err, doc)
		}
	}
	names := make([]string, 0, len(manifests))
	for n := range manifests {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		doc := manifests[n]
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if strings.TrimSpace(doc) == "" || head.Kind == "" {
			continue
		}
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 DaemonSet":
			var x appsv1.DaemonSet
			strict(doc, &x)
			o.DaemonSets = append(o.DaemonSets, x)
		case "v1 ConfigMap":
			var x corev1.ConfigMap
			strict(doc, &x)
			o.ConfigMaps = append(o.ConfigMaps, x)
		case "v1 Service":
			var x corev1.Service
			strict(doc, &x)
			o.Services = append(o.Services, x)
		case "v1 ServiceAccount":
			var x corev1.ServiceAccount
			strict(doc, &x)
			o.ServiceAccounts = append(o.ServiceAccounts, x)
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			var x rbacv1.ClusterRole
			strict(doc, &x)
			o.ClusterRoles = append(o.ClusterRoles, x)
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			var x rbacv1.ClusterRoleBinding
			strict(doc, &x)
			o.ClusterRoleBindings = append(o.ClusterRoleBindings, x)
		case "resource.k8s.io/v1 DeviceClass":
			var x resourcev1.DeviceClass
			strict(doc, &x)
			o.DeviceClasses = append(o.DeviceClasses, x)
		case "monitoring.coreos.com/v1 ServiceMonitor", "monitoring.coreos.com/v1 PrometheusRule":
			var x map[string]any
			strict(doc, &x)
			if _, dup := o.Custom[head.Kind]; dup {
				t.Fatalf("two %s", head.Kind)
			}
			o.Custom[head.Kind] = x
		default:
			t.Fatalf("%s: unexpected object %s %s", n, head.APIVersion, head.Kind)
		}
	}
	return o
}

// get walks a decoded object: get(o, "spec", "endpoints", 0, "port").
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func TestLint(t *testing.T) {
	for _, vals := range []map[string]any{nil, allOn()} {
		l := lint.AllWithKubeVersion(chartDir, vals, namespace, kubeVersion)
		for _, m := range l.Messages {
			t.Log(m)
			if m.Severity >= support.WarningSev {
				t.Errorf("lint: %v", m)
			}
		}
	}
}

func allOn() map[string]any {
	return map[string]any{
		"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
		"prometheusRule": map[string]any{"enabled": true},
		"dashboards":     map[string]any{"enabled": true},
	}
}

func TestDefaults(t *testing.T) {
	m, notes, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	if len(o.DaemonSets) != 1 || len(o.ConfigMaps) != 1 || len(o.Services) != 1 || len(o.ServiceAccounts) != 1 ||
		len(o.ClusterRoles) != 1 || len(o.ClusterRoleBindings) != 1 || len(o.Custom) != 0 {
		t.Fatalf("objects: %d DaemonSets, %d ConfigMaps, %d Services, %d ServiceAccounts, %d ClusterRoles, %d bindings, %d custom",
			len(o.DaemonSets), len(o.ConfigMaps), len(o.Services), len(o.ServiceAccounts), len(o.ClusterRoles), len(o.ClusterRoleBindings), len(o.Custom))
	}
	ds := o.DaemonSets[0]
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || spec.PriorityClassName != "system-node-critical" || spec.NodeSelector["nvidia.com/gpu.present"] != "true" ||
		spec.ServiceAccountName != o.ServiceAccounts[0].Name || ds.Namespace != namespace {
		t.Errorf("pod spec: hostPID %v priority %q nodeSelector %v sa %q", spec.HostPID, spec.PriorityClassName, spec.NodeSelector, spec.ServiceAccountName)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("update strategy %+v", ds.Spec.UpdateStrategy)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 1 {
		t.Fatalf("containers %d, init containers %d", len(spec.Containers), len(spec.InitContainers))
	}
	agent := spec.Containers[0]
	if strings.Join(agent.Args, " ") != "agent --config /etc/gpuwarden/config.yaml" || agent.SecurityContext == nil ||
		agent.SecurityContext.Privileged == nil || !*agent.SecurityContext.Privileged {
		t.Errorf("agent: args %v, security %+v", agent.Args, agent.SecurityContext)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 9477 || agent.Ports[0].Name != "metrics" {
		t.Errorf("ports %+v", agent.Ports)
	}
	if agent.Image != "ghcr.io/gpuwarden/gpuwarden:0.1.0" {
		t.Errorf("image %q", agent.Image)
	}
	var nodeName bool
	for _, e := range agent.Env {
		nodeName = nodeName || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeName {
		t.Errorf("no NODE_NAME from the downward API: %+v", agent.Env)
	}

	// Every mount has its volume, and the host paths are the ones the agent needs.
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{}
	for _, vm := range agent.VolumeMounts {
		mounts[vm.MountPath] = hostPaths[vm.Name]
		if vm.Name == "config" {
			mounts[vm.MountPath] = "configmap"
		}
	}
	want := map[string]string{
		"/etc/gpuwarden/config.yaml": "configmap", "/sys/fs/bpf": "/sys/fs/bpf", "/sys/kernel/tracing": "/sys/kernel/tracing",
		"/host/proc": "/proc", "/host/sys/fs/cgroup": "/sys/fs/cgroup", "/run/gpuwarden": "/run/gpuwarden",
		"/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
		"/var/lib/kubelet/pod-resources":  "/var/lib/kubelet/pod-resources",
		"/usr/local/gpuwarden/lib":        "/usr/local/gpuwarden/lib",
		"/var/lib/gpuwarden":              "/var/lib/gpuwarden", // enforcement.stateFile
	}
	if !reflect.DeepEqual(mounts, want) {
		t.Errorf("mounts (container path: host path)\n got %v\nwant %v", mounts, want)
	}
	init := spec.InitContainers[0]
	if len(init.VolumeMounts) != 1 || hostPaths[init.VolumeMounts[0].Name] != "/usr/local/gpuwarden/lib" {
		t.Errorf("install-interposer mounts %+v", init.VolumeMounts)
	}

	// The Service selects the agent's pods, on its port.
	svc := o.Services[0]
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("service selector %v does not select the pods (%v)", svc.Spec.Selector, ds.Spec.Template.Labels)
		}
	}
	if svc.Name != "gpuwarden-agent" || svc.Spec.Ports[0].Port != 9477 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("service %s %+v", svc.Name, svc.Spec.Ports)
	}
	// RBAC: reading pods, nothing more.
	if r := o.ClusterRoles[0].Rules; len(r) != 1 || strings.Join(r[0].Resources, ",") != "pods" ||
		strings.Join(r[0].Verbs, ",") != "get,list,watch" {
		t.Errorf("rules %+v", r)
	}
	if s := o.ClusterRoleBindings[0].Subjects; len(s) != 1 || s[0].Name != spec.ServiceAccountName || s[0].Namespace != namespace {
		t.Errorf("binding subjects %+v", s)
	}

	checkConfig(t, o.ConfigMaps[0].Data["config.yaml"])
	for _, s := range []string{"kubectl -n gpu-system get ds gpuwarden", "port-forward", "curl", "gpuwarden smi", "gpuwarden.io/gpu-memory"} {
		if !strings.Contains(notes, s) {
			t.Errorf("NOTES.txt lacks %q:\n%s", s, notes)
		}
	}
}

// checkConfig has the agent itself validate the rendered configuration.
func checkConfig(t *testing.T, cfg string) {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(cfg), &m); err != nil || get(m, "devicePlugin", "maxInst") == nil {
		t.Fatalf("config.yaml: %v\n%s", err, cfg)
	}
	bin, err := filepath.Abs("../../../bin/gpuwarden")
	if err != nil {
		t.Fatal(err)
	}
	if b := os.Getenv("GPUWARDEN_BIN"); b != "" {
		bin = b
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("%s is missing (make build): the agent's own check of config.yaml is skipped", bin)
	}
	f := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(f, []byte(cfg), 0o644)
	out, err := exec.Command(bin, "agent", "--config", f, "--check-config").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "unknown flag: --check-config") {
			t.Skipf("%s has no --check-config: %s", bin, out)
		}
		t.Errorf("gpuwarden agent --check-config refuses the chart's config: %v\n%s\n%s", err, out, cfg)
	}
}

func TestOptionalPartsOn(t *testing.T) {
	m, _, err := render(t, allOn())
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)

	sm := o.Custom["ServiceMonitor"]
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	if get(sm, "spec", "endpoints", 0, "honorLabels") != true || get(sm, "spec", "endpoints", 0, "port") != "metrics" ||
		get(sm, "metadata", "labels", "release") != "prometheus" || get(sm, "spec", "namespaceSelector", "matchNames", 0) != namespace {
		t.Errorf("ServiceMonitor %v", sm)
	}
	for k, v := range get(sm, "spec", "selector", "matchLabels").(map[string]any) {
		if o.Services[0].Labels[k] != v {
			t.Errorf("ServiceMonitor selector %s=%v does not select the Service (%v)", k, v, o.Services[0].Labels)
		}
	}

	// The PrometheusRule's spec is the rules file, unchanged.
	pr := o.Custom["PrometheusRule"]
	b, err := os.ReadFile("../../../dashboards/alerts/gpuwarden.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	if pr == nil || !reflect.DeepEqual(pr["spec"], rules) {
		t.Errorf("PrometheusRule spec differs from dashboards/alerts/gpuwarden.rules.yml")
	}

	// One dashboard ConfigMap per dashboards/grafana/*.json, its bytes unchanged.
	files, _ := filepath.Glob("../../../dashboards/grafana/*.json")
	if len(files) == 0 {
		t.Fatal("no dashboards/grafana/*.json")
	}
	dash := map[string]string{}
	for _, cm := range o.ConfigMaps {
		if cm.Labels["grafana_dashboard"] != "" {
			if cm.Labels["grafana_dashboard"] != "1" || len(cm.Data) != 1 {
				t.Errorf("dashboard ConfigMap %s: labels %v, %d keys", cm.Name, cm.Labels, len(cm.Data))
			}
			for k, v := range cm.Data {
				dash[k] = v
			}
		}
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		got, ok := dash[filepath.Base(f)]
		if !ok || got != strings.TrimRight(string(b), "\n") || !json.Valid([]byte(got)) {
			t.Errorf("dashboard %s: missing or changed in its ConfigMap", filepath.Base(f))
		}
	}
	if len(dash) != len(files) {
		t.Errorf("%d dashboard ConfigMaps for %d files", len(dash), len(files))
	}
}

func TestEverythingOff(t *testing.T) {
	m, _, err := render(t, map[string]any{
		"serviceAccount": map[string]any{"create": false},
		"rbac":           map[string]any{"create": false},
		"tracefs":        false,
		"interposer":     map[string]any{"install": false},
		"config": map[string]any{
			"http":         map[string]any{"enabled": false},
			"devicePlugin": map[string]any{"enabled": false},
			"ebpf":         map[string]any{"enabled": false},
			"enforcement":  map[string]any{"enabled": false},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	if len(o.ServiceAccounts)+len(o.ClusterRoles)+len(o.ClusterRoleBindings)+len(o.Custom) != 0 || len(o.ConfigMaps) != 1 {
		t.Errorf("objects left: %+v", o)
	}
	spec := o.DaemonSets[0].Spec.Template.Spec
	agent := spec.Containers[0]
	if spec.ServiceAccountName != "default" || len(spec.InitContainers) != 0 || len(agent.Ports) != 0 || agent.LivenessProbe != nil {
		t.Errorf("pod spec %+v", spec)
	}
	for _, vm := range agent.VolumeMounts {
		if vm.MountPath == "/sys/kernel/tracing" {
			t.Error("tracefs mounted")
		}
	}
	checkConfig(t, o.ConfigMaps[0].Data["config.yaml"])
}

func TestCustomPlacementAndConfig(t *testing.T) {
	m, _, err := render(t, map[string]any{
		"nodeSelector":      map[string]any{"gpu": "a100", "nvidia.com/gpu.present": nil}, // null drops a default key
		"tolerations":       []any{map[string]any{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}},
		"resources":         map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "128Mi"}, "limits": map[string]any{"memory": "512Mi"}},
		"priorityClassName": "gpu-infra",
		"runtimeClassName":  "nvidia",
		"updateStrategy":    map[string]any{"type": "OnDelete"},
		"image":             map[string]any{"tag": "v9"},
		"config": map[string]any{
			"controlDir":      "/var/run/gw",
			"controlDirGrace": "90s",
			"http":            map[string]any{"listen": "0.0.0.0:9100"},
			"devicePlugin":    map[string]any{"maxInst": 8, "preload": "ld.so.preload", "interposerPath": "/opt/gw/lib64/libgpuwarden.so"},
			"log":             map[string]any{"format": "json"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	spec := o.DaemonSets[0].Spec.Template.Spec
	agent := spec.Containers[0]
	if fmt.Sprint(spec.NodeSelector) != "map[gpu:a100]" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "gpu" ||
		spec.PriorityClassName != "gpu-infra" || *spec.RuntimeClassName != "nvidia" ||
		o.DaemonSets[0].Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("placement: %v %+v %q", spec.NodeSelector, spec.Tolerations, spec.PriorityClassName)
	}
	if agent.Resources.Requests.Cpu().String() != "100m" || agent.Resources.Limits.Memory().String() != "512Mi" {
		t.Errorf("resources %+v", agent.Resources)
	}
	if agent.Image != "ghcr.io/gpuwarden/gpuwarden:v9" || agent.Ports[0].ContainerPort != 9100 {
		t.Errorf("image %q, ports %+v", agent.Image, agent.Ports)
	}
	paths := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			paths[v.HostPath.Path] = true
		}
	}
	if !paths["/var/run/gw"] || !paths["/opt/gw/lib64"] {
		t.Errorf("host paths %v: the control dir and the interposer's directory follow the config", paths)
	}
	cfg := o.ConfigMaps[0].Data["config.yaml"]
	for _, s := range []string{"maxInst: 8", "preload: ld.so.preload", "controlDir: /var/run/gw", "controlDirGrace: 90s", "format: json"} {
		if !strings.Contains(cfg, s) {
			t.Errorf("config.yaml lacks %q:\n%s", s, cfg)
		}
	}
	checkConfig(t, cfg)
}

func TestSchemaRejectsBadValues(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]any
		want string
	}{
		{"unknown top-level key", map[string]any{"replicas": 3}, "replicas"},
		{"misspelt config key", map[string]any{"config": map[string]any{"devicePlugin": map[string]any{"maxInstances": 4}}}, "maxInstances"},
		{"maxInst out of range", map[string]any{"config": map[string]any{"devicePlugin": map[string]any{"maxInst": 0}}}, "maxInst"},
		{"maxInst a string", map[string]any{"config": map[string]any{"devicePlugin": map[string]any{"maxInst": "4"}}}, "maxInst"},
		{"bad preload", map[string]any{"config": map[string]any{"devicePlugin": map[string]any{"preload": "LD_PRELOAD"}}}, "preload"},
		{"bad bypass action", map[string]any{"config": map[string]any{"enforcement": map[string]any{"onBypass": "kill"}}}, "onBypass"},
		{"bad breach action", map[string]any{"config": map[string]any{"enforcement": map[string]any{"onBreach": "explode"}}}, "onBreach"},
		{"grace period not a duration", map[string]any{"config": map[string]any{"enforcement": map[string]any{"gracePeriod": "ten seconds"}}}, "gracePeriod"},
		{"relative control dir", map[string]any{"config": map[string]any{"controlDir": "run/gpuwarden"}}, "controlDir"},
		{"control dir grace not a duration", map[string]any{"config": map[string]any{"controlDirGrace": "-5m"}}, "controlDirGrace"},
		{"listen without port", map[string]any{"config": map[string]any{"http": map[string]any{"listen": "9477"}}}, "listen"},
		{"bad duration", map[string]any{"config": map[string]any{"ebpf": map[string]any{"scanInterval": "soon"}}}, "scanInterval"},
		{"bad log level", map[string]any{"config": map[string]any{"log": map[string]any{"level": "loud"}}}, "level"},
		{"bad pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
		{"nodeSelector value not a string", map[string]any{"nodeSelector": map[string]any{"gpu": true}}, "nodeSelector"},
		{"serviceMonitor.enabled not a bool", map[string]any{"serviceMonitor": map[string]any{"enabled": "yes"}}, "enabled"},
		{"service port too big", map[string]any{"service": map[string]any{"port": 70000}}, "port"},
		{"bad toleration operator", map[string]any{"tolerations": []any{map[string]any{"operator": "Maybe"}}}, "operator"},
		{"bad update strategy", map[string]any{"updateStrategy": map[string]any{"type": "Recreate"}}, "type"},
		{"remote servers not a list", map[string]any{"config": map[string]any{"remote": map[string]any{"servers": "gpu-1"}}}, "servers"},
		{"remote listen without port", map[string]any{"config": map[string]any{"remote": map[string]any{"listen": "7070"}}}, "listen"},
		{"no connections", map[string]any{"config": map[string]any{"http": map[string]any{"maxConnections": 0}}}, "maxConnections"},
		{"negative context memory", map[string]any{"config": map[string]any{"nvml": map[string]any{"contextMemory": -1}}}, "contextMemory"},
		{"pprof not a bool", map[string]any{"config": map[string]any{"http": map[string]any{"pprof": "on"}}}, "pprof"},
		{"remote connections per source a string", map[string]any{"config": map[string]any{"remote": map[string]any{"maxConnectionsPerSource": "128"}}}, "maxConnectionsPerSource"},
		{"misspelt remote key", map[string]any{"remote": map[string]any{"secret": "x"}}, "secret"},
		{"remote high priority not a list", map[string]any{"config": map[string]any{"remote": map[string]any{"highPriority": "ml"}}}, "highPriority"},
		{"remote high priority too deep", map[string]any{"config": map[string]any{"remote": map[string]any{"highPriority": []any{"a/b/c/d"}}}}, "highPriority"},
		{"remote no sessions per client", map[string]any{"config": map[string]any{"remote": map[string]any{"maxSessionsPerClient": 0}}}, "maxSessionsPerClient"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := render(t, tt.vals)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error does not name the schema and %q: %v", tt.want, err)
			}
		})
	}
}

// TestRemoteServer: a GPU node serving remote sessions exposes the port
// on the node, mounts the user's Secret where the config reads it, and
// takes its own certificate by node name.
func TestRemoteServer(t *testing.T) {
	m, _, err := render(t, map[string]any{
		"config": map[string]any{"remote": map[string]any{"enabled": true, "listen": ":7443", "maxSessionsPerClient": 4,
			"highPriority": []any{"ml", "infra/serve-*/main"}}},
		"remote": map[string]any{"secretName": "gpuwarden-remote"},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	spec := o.DaemonSets[0].Spec.Template.Spec
	agent := spec.Containers[0]
	var port *corev1.ContainerPort
	for i, p := range agent.Ports {
		if p.Name == "remote" {
			port = &agent.Ports[i]
		}
	}
	if port == nil || port.ContainerPort != 7443 || port.HostPort != 7443 || agent.Ports[0].Name != "metrics" {
		t.Errorf("ports %+v: want metrics and remote 7443 on the node", agent.Ports)
	}
	secret := ""
	for _, v := range spec.Volumes {
		if v.Name == "remote-credentials" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	mounted := false
	for _, vm := range agent.VolumeMounts {
		mounted = mounted || vm.Name == "remote-credentials" && vm.MountPath == "/etc/gpuwarden/remote" && vm.ReadOnly
	}
	if secret != "gpuwarden-remote" || !mounted {
		t.Errorf("Secret %q mounted %v: want gpuwarden-remote at /etc/gpuwarden/remote", secret, mounted)
	}
	env := map[string]string{}
	for _, e := range agent.Env {
		env[e.Name] = e.Value
	}
	if env["GPUWARDEN_REMOTE_CERT"] != "/etc/gpuwarden/remote/$(NODE_NAME).crt" || env["GPUWARDEN_REMOTE_KEY"] != "/etc/gpuwarden/remote/$(NODE_NAME).key" {
		t.Errorf("env %v: want the node's own certificate", env)
	}
	cfg := o.ConfigMaps[0].Data["config.yaml"]
	if !strings.Contains(cfg, "listen: :7443") {
		t.Errorf("config.yaml lacks the remote listener:\n%s", cfg)
	}
	if !strings.Contains(cfg, "maxSessionsPerClient: 4") || !strings.Contains(cfg, "- infra/serve-*/main") {
		t.Errorf("config.yaml lacks the remote admission rules:\n%s", cfg)
	}
	checkConfig(t, cfg)

	// Shared credentials: tls.crt and tls.key, no per-node variables; no hostPort.
	m, _, err = render(t, map[string]any{
		"config": map[string]any{"remote": map[string]any{"enabled": true}},
		"remote": map[string]any{"secretName": "gpuwarden-remote", "perNodeCertificates": false, "hostPort": false},
	})
	if err != nil {
		t.Fatal(err)
	}
	agent = decode(t, m).DaemonSets[0].Spec.Template.Spec.Containers[0]
	for _, e := range agent.Env {
		if strings.HasPrefix(e.Name, "GPUWARDEN_REMOTE_") {
			t.Errorf("env %s=%s without per-node certificates", e.Name, e.Value)
		}
	}
	if len(agent.Ports) != 1 {
		t.Errorf("ports %+v: want metrics alone", agent.Ports)
	}
}

// TestRemoteClientNode: a release for nodes without GPUs installs the
// client library on the host, mounts it at the path the device plugin
// names, and reads the node's certificate; its config passes the agent's
// own check.
func TestRemoteClientNode(t *testing.T) {
	m, _, err := render(t, map[string]any{
		"nodeSelector": map[string]any{"nvidia.com/gpu.present": nil, "gpuwarden.io/remote-client": "true"},
		"config": map[string]any{"remote": map[string]any{"servers": []any{"gpu-node-1", "gpu-node-2:7443"}},
			"nvml": map[string]any{"enabled": false}, "ebpf": map[string]any{"enabled": false}},
		"remote": map[string]any{"secretName": "gpuwarden-remote"},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	spec := o.DaemonSets[0].Spec.Template.Spec
	agent, init := spec.Containers[0], spec.InitContainers[0]
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{}
	for _, vm := range agent.VolumeMounts {
		mounts[vm.MountPath] = vm.Name
	}
	if hostPaths[mounts["/usr/local/gpuwarden/remote"]] != "/usr/local/gpuwarden/remote" || mounts["/etc/gpuwarden/remote"] != "remote-credentials" {
		t.Errorf("mounts %v, host paths %v", mounts, hostPaths)
	}
	var installs bool
	for _, vm := range init.VolumeMounts {
		installs = installs || vm.MountPath == "/host-remote" && hostPaths[vm.Name] == "/usr/local/gpuwarden/remote"
	}
	if !installs || !strings.Contains(strings.Join(init.Args, " "), "REMOTE_SRC") {
		t.Errorf("the init container does not install the client library: %+v %v", init.VolumeMounts, init.Args)
	}
	for _, p := range agent.Ports {
		if p.HostPort != 0 {
			t.Errorf("a client node exposes port %+v", p)
		}
	}
	cfg := o.ConfigMaps[0].Data["config.yaml"]
	if !strings.Contains(cfg, "- gpu-node-2:7443") {
		t.Errorf("config.yaml lacks the servers:\n%s", cfg)
	}
	checkConfig(t, cfg)
}

// The DRA driver: its DeviceClass, the RBAC it needs, the kubelet's and the
// runtime's directories at the agent's paths; never beside the device plugin.
func TestDRA(t *testing.T) {
	m, _, err := render(t, map[string]any{"config": map[string]any{
		"dra": map[string]any{"enabled": true}, "devicePlugin": map[string]any{"enabled": false}}})
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	if len(o.DeviceClasses) != 1 || o.DeviceClasses[0].Name != "gpu.gpuwarden.io" ||
		o.DeviceClasses[0].Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.gpuwarden.io"` {
		t.Errorf("device classes %+v", o.DeviceClasses)
	}
	var slices, claims bool
	for _, r := range o.ClusterRoles[0].Rules {
		for _, res := range r.Resources {
			slices = slices || res == "resourceslices" && strings.Contains(strings.Join(r.Verbs, ","), "create")
			claims = claims || res == "resourceclaims" && strings.Join(r.Verbs, ",") == "get"
		}
	}
	if !slices || !claims {
		t.Errorf("RBAC rules %+v lack resourceslices or resourceclaims", o.ClusterRoles[0].Rules)
	}
	spec := o.DaemonSets[0].Spec.Template.Spec
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{}
	for _, vm := range spec.Containers[0].VolumeMounts {
		mounts[vm.Name] = vm.MountPath
	}
	// The agent names these paths to the kubelet and the runtime: the same on both sides.
	for name, want := range map[string]string{"dra-registrar": "/var/lib/kubelet/plugins_registry",
		"dra-plugin": "/var/lib/kubelet/plugins/gpu.gpuwarden.io", "cdi": "/var/run/cdi"} {
		if hostPaths[name] != want || mounts[name] != want {
			t.Errorf("volume %s: host path %q mounted at %q, want %q", name, hostPaths[name], mounts[name], want)
		}
	}
	checkConfig(t, o.ConfigMaps[0].Data["config.yaml"])

	// Defaults: no DeviceClass, no DRA rules or volumes.
	m, _, err = render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := decode(t, m); len(o.DeviceClasses) != 0 || strings.Contains(fmt.Sprint(o.ClusterRoles[0].Rules), "resourceslices") {
		t.Errorf("the DRA driver's objects without config.dra.enabled: %+v", o.DeviceClasses)
	}

	_, _, err = render(t, map[string]any{"config": map[string]any{"dra": map[string]any{"enabled": true}}})
	if err == nil || !strings.Contains(err.Error(), "set config.devicePlugin.enabled false") {
		t.Errorf("DRA beside the device plugin: %v, want a refusal that says what to change", err)
	}
}

// The chart reads the rules and dashboards through links into dashboards/,
// never copies.
func TestRulesAndDashboardsAreLinks(t *testing.T) {
	for _, l := range []string{"files/alerts", "files/grafana"} {
		fi, err := os.Lstat(filepath.Join(chartDir, l))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: want a symlink into dashboards/ (%v)", l, err)
		}
	}
	c := loadChart(t)
	var n int
	for _, f := range c.Files {
		if strings.HasSuffix(f.Name, ".test.yml") {
			t.Errorf("%s is in the chart (.helmignore)", f.Name)
		}
		n++
	}
	if n == 0 {
		t.Error("the chart loaded no files through the links")
	}
	if _, err := os.Stat(filepath.Join(chartDir, "files/alerts/gpuwarden.rules.yml")); errors.Is(err, os.ErrNotExist) {
		t.Error("dashboards/alerts/gpuwarden.rules.yml is missing")
	}
}

// TestRemoteClientsInOneRelease: one release serves both kinds of node. GPU
// nodes keep the agent as configured; nodes without GPUs get a second
// DaemonSet, with its own ConfigMap (remoteClients.config merged over
// config), node selector and pod labels, which neither DaemonSet's selector
// shares; both configurations pass the agent's own check; the metrics
// Service takes both kinds of agent.
func TestRemoteClientsInOneRelease(t *testing.T) {
	vals := map[string]any{
		"config": map[string]any{"remote": map[string]any{"enabled": true}},
		"remote": map[string]any{"secretName": "gpuwarden-remote"},
		"remoteClients": map[string]any{"enabled": true,
			"config": map[string]any{"remote": map[string]any{"servers": []any{"gpu-node-1:7070"}}}},
	}
	m, _, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	if len(o.DaemonSets) != 2 || len(o.ConfigMaps) != 2 {
		t.Fatalf("%d DaemonSets, %d ConfigMaps; want 2 of each", len(o.DaemonSets), len(o.ConfigMaps))
	}
	byName := map[string]appsv1.DaemonSet{}
	for _, ds := range o.DaemonSets {
		byName[ds.Name] = ds
	}
	gpu, client := byName[release], byName[release+"-remote-client"]
	if gpu.Name == "" || client.Name == "" {
		t.Fatalf("DaemonSets %v", byName)
	}
	if gpu.Spec.Template.Spec.NodeSelector["nvidia.com/gpu.present"] != "true" ||
		client.Spec.Template.Spec.NodeSelector["gpuwarden.io/remote-client"] != "true" ||
		client.Spec.Template.Spec.NodeSelector["nvidia.com/gpu.present"] != "" {
		t.Errorf("node selectors: GPU nodes %v, clients %v", gpu.Spec.Template.Spec.NodeSelector, client.Spec.Template.Spec.NodeSelector)
	}
	for _, p := range []struct{ sel, pods appsv1.DaemonSet }{{gpu, client}, {client, gpu}} {
		sel, err := metav1.LabelSelectorAsSelector(p.sel.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(p.pods.Spec.Template.Labels)) {
			t.Errorf("%s's selector %v takes %s's pods (%v)", p.sel.Name, sel, p.pods.Name, p.pods.Spec.Template.Labels)
		}
		if !sel.Matches(labels.Set(p.sel.Spec.Template.Labels)) {
			t.Errorf("%s's selector %v does not take its own pods", p.sel.Name, sel)
		}
	}
	configs := map[string]string{}
	for _, cm := range o.ConfigMaps {
		configs[cm.Name] = cm.Data["config.yaml"]
	}
	for _, ds := range []appsv1.DaemonSet{gpu, client} {
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == "config" && v.ConfigMap.Name != ds.Name {
				t.Errorf("%s reads ConfigMap %s", ds.Name, v.ConfigMap.Name)
			}
		}
	}
	var gpuCfg, clientCfg map[string]any
	if err := yaml.Unmarshal([]byte(configs[gpu.Name]), &gpuCfg); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(configs[client.Name]), &clientCfg); err != nil {
		t.Fatal(err)
	}
	if get(gpuCfg, "remote", "enabled") != true || get(gpuCfg, "nvml", "enabled") != true || len(get(gpuCfg, "remote", "servers").([]any)) != 0 {
		t.Errorf("GPU nodes' config changed: %s", configs[gpu.Name])
	}
	if get(clientCfg, "remote", "enabled") != false || get(clientCfg, "nvml", "enabled") != false ||
		get(clientCfg, "devicePlugin", "enabled") != true || fmt.Sprint(get(clientCfg, "remote", "servers")) != "[gpu-node-1:7070]" ||
		get(clientCfg, "devicePlugin", "maxInst") != get(gpuCfg, "devicePlugin", "maxInst") {
		t.Errorf("clients' config is not remoteClients.config over config: %s", configs[client.Name])
	}
	var mountsLibrary bool
	for _, vm := range client.Spec.Template.Spec.Containers[0].VolumeMounts {
		mountsLibrary = mountsLibrary || vm.Name == "remote-library"
	}
	if !mountsLibrary || len(gpu.Spec.Template.Spec.Containers[0].Ports) != 2 || len(client.Spec.Template.Spec.Containers[0].Ports) != 1 {
		t.Errorf("the client DaemonSet installs no client library, or ports differ from each kind's: GPU %+v, client %+v",
			gpu.Spec.Template.Spec.Containers[0].Ports, client.Spec.Template.Spec.Containers[0].Ports)
	}
	svc := labels.SelectorFromSet(o.Services[0].Spec.Selector)
	if !svc.Matches(labels.Set(gpu.Spec.Template.Labels)) || !svc.Matches(labels.Set(client.Spec.Template.Labels)) {
		t.Errorf("the metrics Service %v does not take both kinds of agent", svc)
	}
	checkConfig(t, configs[gpu.Name])
	checkConfig(t, configs[client.Name])

	// Without servers the second DaemonSet would serve nothing.
	vals["remoteClients"] = map[string]any{"enabled": true}
	if _, _, err := render(t, vals); err == nil || !strings.Contains(err.Error(), "remoteClients.config.remote.servers") {
		t.Errorf("remoteClients without servers: %v", err)
	}
}

// A DRA remote pool in one release: the GPU nodes serve sessions and offer
// their GPUs to the pool, the nodes without GPUs run the DRA driver (no
// device plugin, no server list) with the client library installed; both
// DeviceClasses exist and both configurations pass the agent's own check.
func TestDRARemotePool(t *testing.T) {
	vals := map[string]any{
		"config": map[string]any{"remote": map[string]any{"enabled": true},
			"dra": map[string]any{"enabled": true, "remotePool": "rack-1"}, "devicePlugin": map[string]any{"enabled": false}},
		"remote":        map[string]any{"secretName": "gpuwarden-remote"},
		"remoteClients": map[string]any{"enabled": true},
	}
	m, _, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, m)
	classes := map[string]string{}
	for _, dc := range o.DeviceClasses {
		classes[dc.Name] = dc.Spec.Selectors[0].CEL.Expression
	}
	if len(classes) != 2 || classes["remote.gpu.gpuwarden.io"] != `device.driver == "gpu.gpuwarden.io" && "server" in device.attributes["gpu.gpuwarden.io"]` {
		t.Errorf("device classes %v", classes)
	}
	configs := map[string]map[string]any{}
	for _, cm := range o.ConfigMaps {
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
			t.Fatal(err)
		}
		configs[cm.Name] = cfg
		checkConfig(t, cm.Data["config.yaml"])
	}
	client := configs[release+"-remote-client"]
	if get(client, "dra", "enabled") != true || get(client, "dra", "remotePool") != "rack-1" ||
		get(client, "devicePlugin", "enabled") != false || get(client, "remote", "enabled") != false {
		t.Errorf("clients' config: %v", client)
	}
	for _, ds := range o.DaemonSets {
		var creds, library bool
		for _, vm := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
			creds = creds || vm.Name == "remote-credentials"
			library = library || vm.Name == "remote-library"
		}
		if !creds || !library {
			t.Errorf("%s: credentials %v, client library %v; want both on every node of the pool", ds.Name, creds, library)
		}
	}
}
