package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// smiView is what `gpuwarden smi` shows, and what --json prints: the
// agent's view (or the one read locally) and where it came from.
type smiView struct {
	Node       string                     `json:"node"`
	Time       time.Time                  `json:"time"`
	Source     string                     `json:"source"`          // "agent" or "local"
	Agent      string                     `json:"agent,omitempty"` // the agent's URL, when it answered
	Devices    []agentapi.Device          `json:"devices"`
	Containers []agentapi.ContainerDevice `json:"containers"`
	Sources    []agentapi.SourceState     `json:"sources"`
	GPUs       []agentapi.GPUInfo         `json:"gpus,omitempty"` // the enforcer's policy, max_inst and free_weight per GPU
	// Notes say what the view cannot know (read without the agent, a
	// source down); they are printed above the table.
	Notes []string `json:"notes,omitempty"`
}

// Layout: 99 columns, so the table fits a 100-column terminal. Between the
// borders ("| " and " |") sit fixed-width columns two spaces apart; the name
// column takes what is left.
const (
	smiWidth = 99
	colGPU   = 3
	colPrio  = 4
	colUtil  = 11 // "100% / 100%"
	colMem   = 21 // "144384MiB / 144384MiB"
	colEnf   = 10 // "UNENFORCED"
	colGap   = 2
	colName  = smiWidth - 4 - colGPU - colPrio - colUtil - colMem - colEnf - 5*colGap
	mib      = 1 << 20
)

// smiRow is one line of the table, column by column.
type smiRow struct{ gpu, name, prio, util, mem, enf string }

func (r smiRow) String() string {
	gap := strings.Repeat(" ", colGap)
	return "| " + padLeft(r.gpu, colGPU) + gap + padRight(r.name, colName) + gap + padLeft(r.prio, colPrio) + gap +
		padLeft(r.util, colUtil) + gap + padLeft(r.mem, colMem) + gap + padRight(r.enf, colEnf) + " |"
}

// renderSmi writes the view as a table per GPU: the device's line (name,
// uuid, utilization, memory used/total) and under it one line per container.
// watch, when not zero, is shown in the title.
func renderSmi(w io.Writer, v *smiView, watch time.Duration) error {
	var b strings.Builder
	title := "gpuwarden smi"
	if v.Node != "" {
		title += "  node " + v.Node
	}
	if !v.Time.IsZero() {
		title += "  " + v.Time.Format("2006-01-02 15:04:05 MST")
	}
	switch {
	case v.Source == "local":
		title += "  read locally"
	case v.Agent != "":
		title += "  agent " + v.Agent
	}
	if watch > 0 {
		title += "  every " + watch.String()
	}
	b.WriteString(title + "\n")
	for _, n := range v.Notes {
		b.WriteString(wrap("note: ", n, smiWidth))
	}

	border := "+" + strings.Repeat("-", smiWidth-2) + "+\n"
	rule := func(c string) string { return "|" + strings.Repeat(c, smiWidth-2) + "|\n" }
	b.WriteString(border)
	b.WriteString(smiRow{"GPU", "Device name and UUID", "High", "GPU-Util/", "GPU-Memory", "Enforced"}.String() + "\n")
	b.WriteString(smiRow{"", "Pod/Container (or cgroup)", "Prio", "Limit", "Usage/Total", ""}.String() + "\n")
	b.WriteString(rule("="))

	devices := map[int]agentapi.Device{}
	byGPU := map[int][]agentapi.ContainerDevice{}
	var gpus []int
	for _, d := range v.Devices {
		if _, ok := devices[d.Index]; !ok {
			gpus = append(gpus, d.Index)
		}
		devices[d.Index] = d
	}
	for _, c := range v.Containers {
		if _, ok := devices[c.GPU]; !ok && byGPU[c.GPU] == nil {
			gpus = append(gpus, c.GPU) // a container on a GPU NVML did not list: still shown
		}
		byGPU[c.GPU] = append(byGPU[c.GPU], c)
	}
	sort.Ints(gpus)
	if len(gpus) == 0 {
		b.WriteString(smiRow{name: "no GPUs found"}.String() + "\n")
	}
	for i, g := range gpus {
		if i > 0 {
			b.WriteString(border)
		}
		d, known := devices[g]
		if known {
			b.WriteString(smiRow{gpu: fmt.Sprint(g), name: truncate(d.Name, colName),
				util: percent(d.Utilization), mem: memory(d.MemoryUsedBytes, d.MemoryTotalBytes, true)}.String() + "\n")
			// The uuid (40 characters) may run over the priority column, which is
			// empty here; the enforcer's policy, max_inst and free_weight follow.
			b.WriteString("| " + strings.Repeat(" ", colGPU+colGap) +
				padRight(truncate(d.UUID, colName+colGap+colPrio), colName+colGap+colPrio+colGap) +
				padLeft(scheduling(v.GPUs, g), colUtil+colGap+colMem+colGap+colEnf) + " |\n")
		} else {
			b.WriteString(smiRow{gpu: fmt.Sprint(g), name: "(no device data)"}.String() + "\n")
		}
		b.WriteString(rule("-"))
		cs := byGPU[g]
		if len(cs) == 0 {
			b.WriteString(smiRow{name: "no containers"}.String() + "\n")
		}
		for _, c := range cs {
			b.WriteString(containerRow(c, d, known).String() + "\n")
		}
	}
	b.WriteString(border)
	_, err := io.WriteString(w, b.String())
	return err
}

func containerRow(c agentapi.ContainerDevice, d agentapi.Device, known bool) smiRow {
	r := smiRow{gpu: fmt.Sprint(c.GPU), name: truncate(containerName(c), colName), prio: "no"}
	if c.HighPriority {
		r.prio = "yes"
	}
	limit := "-"
	if c.ComputeLimit > 0 {
		limit = percent(c.ComputeLimit)
	}
	r.util = percent(c.ComputeShare) + " / " + limit
	total, haveTotal := c.MemoryLimitBytes, true
	if total == 0 { // no quota: the device's total
		total, haveTotal = d.MemoryTotalBytes, known
	}
	r.mem = memory(c.MemoryUsedBytes, total, haveTotal)
	switch {
	case c.Unenforced:
		r.enf = "UNENFORCED"
	case c.Enforced:
		r.enf = "enforced"
	default:
		r.enf = "-"
	}
	return r
}

// containerName is namespace/pod/container on Kubernetes; off it, the
// collector puts the cgroup path (or the container id) in Container.
func containerName(c agentapi.ContainerDevice) string {
	var parts []string
	for _, p := range []string{c.Namespace, c.Pod, c.Container} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	switch {
	case len(parts) > 0:
		return strings.Join(parts, "/")
	case c.CgroupPath != "":
		return c.CgroupPath
	}
	return fmt.Sprintf("cgroup %d", c.CgroupID)
}

func percent(ratio float64) string {
	if math.IsNaN(ratio) || ratio < 0 {
		ratio = 0
	}
	return fmt.Sprintf("%d%%", int64(math.Round(ratio*100)))
}

func memory(used, total uint64, haveTotal bool) string {
	t := "-"
	if haveTotal {
		t = fmt.Sprintf("%dMiB", total/mib)
	}
	return fmt.Sprintf("%dMiB / %s", used/mib, t)
}

// truncate shortens s to n characters, cutting its middle: both ends of a
// name (namespace, container; the start and end of a cgroup path) say most.
func truncate(s string, n int) string {
	r := []rune(printable(s))
	if len(r) <= n {
		return string(r)
	}
	if n <= 3 {
		return string(r[:n])
	}
	head := (n - 3) / 3
	tail := n - 3 - head
	return string(r[:head]) + "..." + string(r[len(r)-tail:])
}

// printable replaces what a terminal would act on (escape sequences,
// control characters) in names that containers choose: a cgroup's name
// must not redraw the operator's screen.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

func padRight(s string, n int) string {
	if k := len([]rune(s)); k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}

func padLeft(s string, n int) string {
	if k := len([]rune(s)); k < n {
		return strings.Repeat(" ", n-k) + s
	}
	return s
}

// wrap breaks text into lines of at most width columns, the first starting
// with prefix and the rest indented as deep.
func wrap(prefix, text string, width int) string {
	var b strings.Builder
	indent := strings.Repeat(" ", len(prefix))
	line := prefix
	empty := true
	for _, word := range strings.Fields(text) {
		if !empty && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line, empty = indent, true
		}
		if !empty {
			line += " "
		}
		line += word
		empty = false
	}
	b.WriteString(line + "\n")
	return b.String()
}

// scheduling is GPU index's line of the enforcer's state, cGPU's free_weight
// included; empty when the enforcer did not say.
func scheduling(gpus []agentapi.GPUInfo, index int) string {
	for _, g := range gpus {
		if g.Index == index {
			return fmt.Sprintf("%s  max_inst %d  free_weight %d", g.Policy, g.MaxInst, g.FreeWeight)
		}
	}
	return ""
}
