package gpucheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Status is a check's outcome.
type Status string

const (
	Pass Status = "pass"
	Fail Status = "FAIL"
	Skip Status = "skipped"
)

// Check is one line of a part's table.
type Check struct {
	Name   string
	Status Status
	Detail string
}

// Bench is one figure, printed as `BENCH <name> <value> <unit>`.
type Bench struct {
	Name  string
	Value float64
	Unit  string
}

func (b Bench) String() string {
	return fmt.Sprintf("BENCH gpucheck_%s %s %s", b.Name, formatValue(b.Value), b.Unit)
}

func formatValue(v float64) string {
	s := fmt.Sprintf("%.4f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}

// Result is one part of the report.
type Result struct {
	Title   string
	Checks  []Check
	Benches []Bench
	Notes   []string
	Elapsed time.Duration
}

func (r *Result) add(s Status, name, format string, a ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Status: s, Detail: fmt.Sprintf(format, a...)})
}

// Pass, Fail and Skip record a check; the detail says what was seen.
func (r *Result) Pass(name, format string, a ...any) { r.add(Pass, name, format, a...) }
func (r *Result) Fail(name, format string, a ...any) { r.add(Fail, name, format, a...) }
func (r *Result) Skip(name, format string, a ...any) { r.add(Skip, name, format, a...) }

// Expect records a check that passes when ok holds.
func (r *Result) Expect(ok bool, name, format string, a ...any) {
	if ok {
		r.Pass(name, format, a...)
	} else {
		r.Fail(name, format, a...)
	}
}

// Bench records a figure.
func (r *Result) Bench(name string, v float64, unit string) {
	r.Benches = append(r.Benches, Bench{Name: name, Value: v, Unit: unit})
}

// Note adds a sentence under the part's table.
func (r *Result) Note(format string, a ...any) { r.Notes = append(r.Notes, fmt.Sprintf(format, a...)) }

// Status is FAIL if any check failed, skipped if nothing passed, else pass.
func (r *Result) Status() Status {
	passed := false
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			return Fail
		case Pass:
			passed = true
		}
	}
	if passed {
		return Pass
	}
	return Skip
}

// Report is the whole run.
type Report struct {
	Mode    string
	Machine []string // "key: value" facts about the machine
	Started time.Time
	Elapsed time.Duration
	Parts   []*Result
}

func (rep *Report) failed() bool {
	for _, p := range rep.Parts {
		if p.Status() == Fail {
			return true
		}
	}
	return false
}

// write puts report.md and bench.txt into dir.
func (rep *Report) write(dir string) error {
	var md, bench strings.Builder
	fmt.Fprintf(&md, "# gpuwarden GPU check (%s)\n\n", rep.Mode)
	fmt.Fprintf(&md, "Run %s, %s in all.\n\n", rep.Started.UTC().Format("2006-01-02 15:04 UTC"), rep.Elapsed.Round(time.Second))
	for _, m := range rep.Machine {
		fmt.Fprintf(&md, "- %s\n", m)
	}
	md.WriteString("\n| part | result | time |\n| --- | --- | --- |\n")
	for _, p := range rep.Parts {
		fmt.Fprintf(&md, "| %s | %s | %s |\n", p.Title, p.Status(), p.Elapsed.Round(100*time.Millisecond))
	}
	for _, p := range rep.Parts {
		fmt.Fprintf(&md, "\n## %s: %s\n\n", p.Title, p.Status())
		if len(p.Checks) > 0 {
			md.WriteString("| check | result | what was seen |\n| --- | --- | --- |\n")
			for _, c := range p.Checks {
				fmt.Fprintf(&md, "| %s | %s | %s |\n", cell(c.Name), c.Status, cell(c.Detail))
			}
		}
		for _, n := range p.Notes {
			fmt.Fprintf(&md, "\n%s\n", n)
		}
		if len(p.Benches) > 0 {
			md.WriteString("\n```\n")
			for _, b := range p.Benches {
				fmt.Fprintln(&md, b)
				fmt.Fprintln(&bench, b)
			}
			md.WriteString("```\n")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.txt"), []byte(bench.String()), 0o644); err != nil {
		return fmt.Errorf("write bench lines: %w", err)
	}
	return nil
}

// cell makes text safe inside a Markdown table cell: one line, no bare pipes,
// and bounded, since compiler messages can run long.
func cell(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		s = s[:600] + " ..."
	}
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", "<br>")
}
