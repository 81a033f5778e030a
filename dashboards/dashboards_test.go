package dashboards_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The alerts issue 8 asks for, and what each one's summary and description
// must name ($labels): container alerts the pod and the GPU, GPU alerts the
// GPU and its node, agent alerts the agent.
var alertScope = map[string][]string{
	"GPUMemoryNearQuota":              {"namespace", "pod", "container", "gpu", "node"},
	"GPUMemoryAllocationsDeniedQuota": {"namespace", "pod", "container", "gpu", "node"},
	"GPUComputeThrottledHeavily":      {"namespace", "pod", "container", "gpu", "node"},
	"GPUContainerUnenforced":          {"namespace", "pod", "container", "gpu", "node"},
	"GPUContainerBreach":              {"namespace", "pod", "container", "gpu", "node"},
	"GPUContainerDeviceMismatch":      {"namespace", "pod", "container", "gpu", "node"},
	"GPUMemoryQuotaOvercommitted":     {"gpu", "node"},
	"GPUWardenAgentDown":              {"instance"},
	"GPUWardenProbeEventsLost":        {"node"},
	"GPUWardenCollectorFailing":       {"node", "collector"},
}

var camelCase = regexp.MustCompile(`^[A-Z][a-z0-9]*(?:[A-Z]+[a-z0-9]*)*$`)

func TestPromtoolCheckAndTestRules(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", rulesTestFile},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every alert is tested by promtool both firing and not firing.
func TestEveryAlertHasPromtoolTests(t *testing.T) {
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	// exp_alerts: [] is a case where it must not fire; a list of alerts one where it fires.
	caseRe := regexp.MustCompile(`alertname: (\w+)\s+exp_alerts:(\s*\[\])?`)
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, m := range caseRe.FindAllStringSubmatch(string(b), -1) {
		if m[2] != "" {
			silent[m[1]] = true
		} else {
			firing[m[1]] = true
		}
	}
	for _, r := range readRules(t).rules() {
		if r.Alert == "" {
			continue
		}
		if !firing[r.Alert] {
			t.Errorf("%s has no promtool case where it fires", r.Alert)
		}
		if !silent[r.Alert] {
			t.Errorf("%s has no promtool case where it does not fire", r.Alert)
		}
	}
}

func TestAlertsLabelsAnnotationsRunbooks(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range readRules(t).rules() {
		if r.Alert == "" {
			if r.Record == "" {
				t.Errorf("a rule is neither an alert nor a recording rule: %+v", r)
			}
			continue
		}
		name := r.Alert
		if seen[name] {
			t.Errorf("%s is defined twice", name)
		}
		seen[name] = true
		if !camelCase.MatchString(name) {
			t.Errorf("%s is not CamelCase", name)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: severity %q, want critical, warning or info", name, s)
		}
		if r.For != "" {
			if _, err := time.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", name, r.For, err)
			}
		}
		scope, ok := alertScope[name]
		if !ok {
			t.Errorf("%s is not in alertScope: say what its annotations must name", name)
		}
		for _, a := range []string{"summary", "description"} {
			text := r.Annotations[a]
			if strings.TrimSpace(text) == "" {
				t.Errorf("%s has no %s", name, a)
				continue
			}
			for _, l := range scope {
				if a == "description" && !strings.Contains(text, "$labels."+l) {
					t.Errorf("%s: description does not name $labels.%s", name, l)
				}
			}
		}
		// The summary names at least the first thing of the alert's scope
		// (the pod, the GPU, the agent).
		if len(scope) > 0 && !strings.Contains(r.Annotations["summary"], "$labels."+scope[0]) &&
			!strings.Contains(r.Annotations["summary"], "$labels."+scope[len(scope)-1]) {
			t.Errorf("%s: summary names neither $labels.%s nor $labels.%s", name, scope[0], scope[len(scope)-1])
		}
		url := r.Annotations["runbook_url"]
		want := runbookPrefix + "dashboards/runbooks/" + name + ".md"
		if url != want {
			t.Errorf("%s: runbook_url %q, want %q", name, url, want)
			continue
		}
		b, err := os.ReadFile(filepath.Join("runbooks", name+".md"))
		if err != nil {
			t.Errorf("%s: runbook: %v", name, err)
			continue
		}
		for _, h := range []string{"# " + name + "\n", "## Meaning", "## Impact", "## Diagnosis", "## Mitigation"} {
			if !strings.Contains(string(b), h) {
				t.Errorf("runbooks/%s.md has no %q", name, strings.TrimSpace(h))
			}
		}
	}
	for name := range alertScope {
		if !seen[name] {
			t.Errorf("alert %s is missing from %s", name, rulesFile)
		}
	}
	// No runbook for an alert that is gone.
	files, _ := filepath.Glob("runbooks/*.md")
	for _, f := range files {
		n := strings.TrimSuffix(filepath.Base(f), ".md")
		if n != "README" && !seen[n] {
			t.Errorf("%s is the runbook of no alert", f)
		}
	}
}

func TestDashboardsAreWellFormed(t *testing.T) {
	ds := readDashboards(t)
	for _, want := range []string{"overview.json", "node.json", "pod.json"} {
		if _, ok := ds[want]; !ok {
			t.Errorf("grafana/%s is missing", want)
		}
	}
	uids := map[string]string{}
	for file, d := range ds {
		if d.UID == "" || d.Title == "" {
			t.Errorf("%s: no uid or title", file)
		}
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %q", file, other, d.UID)
		}
		uids[d.UID] = file
		vars := map[string]variable{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v
		}
		if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
			t.Errorf("%s: no datasource variable of Prometheus data sources: %+v", file, v)
		}
		for _, name := range []string{"node", "namespace", "pod"} {
			v, ok := vars[name]
			if !ok {
				t.Errorf("%s: no %s variable", file, name)
				continue
			}
			q := variableQuery(v)
			if v.Type != "query" || !strings.HasPrefix(q, "label_values(") || !strings.HasSuffix(q, ", "+name+")") {
				t.Errorf("%s: variable %s is not a label_values(..., %s) query: %q", file, name, name, q)
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("%s: variable %s does not use ${datasource}", file, name)
			}
			if v.IncludeAll && v.AllValue != ".*" {
				t.Errorf("%s: variable %s's All is %q, want .* (so it matches empty labels off Kubernetes)", file, name, v.AllValue)
			}
		}
		ids, titles := map[int]bool{}, map[string]bool{}
		for _, p := range d.panels() {
			where := file + ": " + p.Title
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", where, p.ID)
			}
			if titles[p.Title] {
				t.Errorf("%s: two panels have this title", where)
			}
			ids[p.ID], titles[p.Title] = true, true
			if p.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: no unit", where)
			}
			if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("%s: no gridPos", where)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel does not use ${datasource}", where)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no query", where)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s (%s): empty query", where, tg.RefID)
				}
				if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s (%s): query does not use ${datasource}", where, tg.RefID)
				}
				for _, m := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if _, ok := vars[m[1]]; !ok && !strings.HasPrefix(m[1], "__") {
						t.Errorf("%s (%s): uses $%s, which is no variable", where, tg.RefID, m[1])
					}
				}
			}
		}
	}
}

// Every metric name and label a dashboard or rule uses is one the agent
// exports (or a recording rule of ours defines); the end-to-end test checks
// the same against a real scrape.
func TestQueriesUseExportedMetrics(t *testing.T) {
	names, labels := exported(t)
	rules := readRules(t)
	recorded := map[string]bool{}
	for _, r := range rules.rules() {
		if r.Record != "" {
			recorded[r.Record] = true
		}
	}
	// Labels Prometheus adds on scrape (job, instance) or the build-info
	// series carries; "up" is Prometheus's own metric.
	for _, l := range []string{"job", "instance"} {
		labels[l] = true
	}
	qs := dashboardQueries(t)
	for _, r := range rules.rules() {
		qs = append(qs, query{Where: rulesFile + ": " + r.Alert + r.Record, Expr: r.Expr})
		for k, a := range r.Annotations {
			for _, m := range annotationRe.FindAllStringSubmatch(a, -1) {
				if !labels[m[1]] {
					t.Errorf("%s: annotation %s uses $labels.%s, which no exported metric has", r.Alert, k, m[1])
				}
			}
		}
	}
	used := map[string]bool{}
	for _, q := range qs {
		for _, n := range metricNames(q.Expr) {
			used[n] = true
			if !names[n] && !recorded[n] {
				t.Errorf("%s: %s is not a metric the agent exports", q.Where, n)
			}
		}
		for _, l := range labelNames(q.Expr) {
			if !labels[l] {
				t.Errorf("%s: label %s is not one the agent's metrics have", q.Where, l)
			}
		}
	}
	for _, d := range readDashboards(t) {
		for _, p := range d.panels() {
			for _, tg := range p.Targets {
				for _, m := range legendLabelRe.FindAllStringSubmatch(tg.LegendFormat, -1) {
					if !labels[m[1]] {
						t.Errorf("%s (%s): legend uses %s, which no exported metric has", p.Title, tg.RefID, m[1])
					}
				}
			}
		}
	}
	// The contract's container and device metrics all appear somewhere.
	for n := range names {
		if strings.HasPrefix(n, "gpuwarden_container_") || strings.HasPrefix(n, "gpuwarden_device_") {
			if !used[n] {
				t.Errorf("no dashboard or rule shows %s", n)
			}
		}
	}
	if !slices.Contains(metricNames(`sum(up{job=~".*gpuwarden.*"}) + gpuwarden_device_memory_total_bytes`), "gpuwarden_device_memory_total_bytes") ||
		len(metricNames(`up{job=~".*gpuwarden.*"}`)) != 0 {
		t.Error("metricNames reads names out of strings, or misses them")
	}
}
