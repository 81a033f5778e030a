package dashboards_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.yaml.in/yaml/v3"

	"github.com/gpuwarden/gpuwarden/collector"
)

const (
	rulesFile     = "alerts/gpuwarden.rules.yml"
	rulesTestFile = "alerts/gpuwarden.rules.test.yml"
	runbookPrefix = "https://github.com/gpuwarden/gpuwarden/blob/main/"
)

// requireTool returns the path of a program from Debian's packages (`make
// test` installs them through DEPS_TEST); where it is missing the test
// skips, and fails instead when GPUWARDEN_REQUIRE_PRIVILEGED=1 (CI).
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("GPUWARDEN_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("%s is missing (Debian package %s; `make deps-test` installs it), and GPUWARDEN_REQUIRE_PRIVILEGED=1 forbids skipping", name, pkg)
	}
	t.Skipf("%s is missing: apt-get install %s", name, pkg)
	return ""
}

// ruleFile is a Prometheus rules file, as much of it as the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return f
}

func (f ruleFile) rules() []rule {
	var rs []rule
	for _, g := range f.Groups {
		rs = append(rs, g.Rules...)
	}
	return rs
}

// dashboard is a Grafana dashboard, as much of it as the tests read.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasource     `json:"datasource"`
	IncludeAll bool            `json:"includeAll"`
	Multi      bool            `json:"multi"`
	AllValue   string          `json:"allValue"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Datasource  *datasource `json:"datasource"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID        string      `json:"refId"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
		Datasource   *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// readDashboards decodes every dashboard, strictly, by file name.
func readDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob("grafana/*.json")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Fatalf("%s is not valid JSON", f)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = d
	}
	return out
}

// panels lists a dashboard's panels, those inside rows included, rows not.
func (d dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// query is one PromQL expression of a dashboard or the rules, and where it is.
type query struct {
	Where string
	Expr  string
}

func dashboardQueries(t *testing.T) []query {
	var qs []query
	names := []string{}
	ds := readDashboards(t)
	for n := range ds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, p := range ds[n].panels() {
			for _, tg := range p.Targets {
				qs = append(qs, query{Where: n + ": " + p.Title + " (" + tg.RefID + ")", Expr: tg.Expr})
			}
		}
	}
	return qs
}

// variableQueries gives each query variable's label_values(...) query.
func variableQuery(v variable) string {
	var q struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &q); err == nil && q.Query != "" {
		return q.Query
	}
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil && s != "" {
		return s
	}
	return v.Definition
}

var (
	fqNameRe   = regexp.MustCompile(`fqName: "([^"]+)"`)
	varLabelRe = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// exported returns the metric names the agent's /metrics describes (the
// collector's and the process collector's, as cmd/gpuwarden serves them)
// and every label name they carry.
func exported(t *testing.T) (names, labels map[string]bool) {
	t.Helper()
	names, labels = map[string]bool{}, map[string]bool{}
	ch := make(chan *prometheus.Desc, 256)
	c := collector.New("node", "test", collector.Sources{}, slog.New(slog.DiscardHandler))
	c.Describe(ch)
	collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "gpuwarden_agent"}).Describe(ch)
	close(ch)
	for d := range ch {
		m := fqNameRe.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read a name from %s", d)
		}
		names[m[1]] = true
		if l := varLabelRe.FindStringSubmatch(d.String()); l != nil && l[1] != "" {
			for _, n := range strings.Split(l[1], ",") {
				labels[strings.TrimSuffix(strings.TrimPrefix(n, "c("), ")")] = true
			}
		}
	}
	if !names["gpuwarden_container_gpu_memory_used_bytes"] {
		t.Fatalf("the collector describes no gpuwarden_container_gpu_memory_used_bytes: %v", names)
	}
	return names, labels
}

var (
	stringRe = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// An identifier; recording rules' names have colons.
	identRe       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	matcherRe     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	groupingRe    = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	legendLabelRe = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	annotationRe  = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	rangeVarRe    = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)
)

// metricNames lists the gpuwarden metric names an expression uses (string
// literals, such as job=~".*gpuwarden.*", are no names).
func metricNames(expr string) []string {
	var out []string
	for _, id := range identRe.FindAllString(stringRe.ReplaceAllString(expr, `""`), -1) {
		if strings.Contains(id, "gpuwarden") {
			out = append(out, id)
		}
	}
	return out
}

// labelNames lists the label names an expression matches or groups on.
func labelNames(expr string) []string {
	var out []string
	for _, m := range matcherRe.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	for _, m := range groupingRe.FindAllStringSubmatch(stringRe.ReplaceAllString(expr, `""`), -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}
