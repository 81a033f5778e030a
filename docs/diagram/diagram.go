package main

import (
	"fmt"
	"strings"
)

// The picture is a grid of four columns and five rows of boxes: what runs
// outside the node agent on top, the agent's parts in the middle, the node's
// files and libraries and a container's processes below. Arrows are drawn
// along the points they list, from the first to the last (the head).

const (
	width, height = 1000, 612
	boxW, boxH    = 200, 56
	fontSize      = 11 // labels and second lines
	titleSize     = 14 // a box's first line
)

// Column and row origins.
var (
	col = [...]int{30, 280, 530, 780}
	row = [...]int{20, 140, 260, 380, 510}
)

// kind says what a box is, and so its colours.
type kind int

const (
	outside   kind = iota // runs off the node agent: the kubelet, Prometheus, the operator
	agent                 // a part of `gpuwarden agent`
	node                  // a file or library on the node
	container             // code that runs in a container's processes
)

var colours = map[kind][2]string{ // fill, stroke
	outside:   {"#f2f2f2", "#777777"},
	agent:     {"#e8f0fc", "#3b6bb5"},
	node:      {"#fff6d9", "#b58a1b"},
	container: {"#e6f4e6", "#3c8a3c"},
}

// box is one part. Its first line is its title; the others are smaller.
type box struct {
	id       string
	c, r     int // column and row
	kind     kind
	lines    []string
	h        int // 0: boxH
	x, y, ht int // set by place
}

var boxes = []box{
	{id: "prom", c: 0, r: 0, kind: outside, lines: []string{"Prometheus, Grafana", "gpuwarden smi, alert rules"}},
	{id: "kubelet", c: 1, r: 0, kind: outside, lines: []string{"kubelet", "device plugins, pod-resources"}},
	{id: "apiserver", c: 2, r: 0, kind: outside, lines: []string{"Kubernetes API server", "pod annotations"}},
	{id: "ctl", c: 3, r: 0, kind: outside, lines: []string{"gpuwarden ctl", "the operator's changes"}},

	{id: "http", c: 0, r: 1, kind: agent, lines: []string{"HTTP server", "/metrics, /api/v1, /readyz"}},
	{id: "deviceplugin", c: 1, r: 1, kind: agent, lines: []string{"device plugin", "deploy/deviceplugin"}},
	{id: "membership", c: 2, r: 1, kind: agent, lines: []string{"membership, settings", "enforcer/membership"}},
	{id: "changeapi", c: 3, r: 1, kind: agent, lines: []string{"change API", "enforcer/changeapi"}},

	{id: "collector", c: 0, r: 2, kind: agent, lines: []string{"collector", "view, metrics, breach judge"}},
	{id: "ebpf", c: 1, r: 2, kind: agent, lines: []string{"eBPF observer", "bpf/: uprobes, pinned maps"}},
	{id: "scheduler", c: 2, r: 2, kind: agent, lines: []string{"scheduler", "enforcer/scheduler"}},

	{id: "nvml", c: 0, r: 3, kind: node, lines: []string{"NVML", "libnvidia-ml.so.1"}},
	{id: "controlblock", c: 2, r: 3, kind: node, h: 64, lines: []string{"control block", "<control dir>/<key>/", "limits, usage"}},

	{id: "gpu", c: 0, r: 4, kind: node, lines: []string{"GPU", "NVIDIA's, or simgpu"}},
	{id: "libcuda", c: 1, r: 4, kind: container, lines: []string{"libcuda.so.1", "NVIDIA's driver, or simgpu"}},
	{id: "interposer", c: 2, r: 4, kind: container, lines: []string{"libgpuwarden.so", "the interposer (LD_PRELOAD)"}},
	{id: "workload", c: 3, r: 4, kind: container, lines: []string{"workload", "any CUDA program"}},
}

// group is a dashed frame around boxes, labelled in a corner (end-anchored
// at lx, ly).
type group struct {
	x, y, w, h int
	label      string
	lx, ly     int
}

var groups = []group{
	{x: 16, y: 106, w: 968, h: 228, label: "gpuwarden agent: one per node", lx: 976, ly: 328},
	{x: 266, y: 482, w: 718, h: 98, label: "a container's processes", lx: 976, ly: 498},
}

// pt is a point of the picture.
type pt struct{ x, y int }

// anchor says where a label sits against its point: centred on it (over
// the line, on a white ground), or ending or starting there.
type anchor int

const (
	middle anchor = iota
	end
	start
)

// arrow is one flow of data: from the box at its first point to the box at
// its last. A dashed arrow is an action, not data.
type arrow struct {
	from, to string // box ids, checked against the points by the test
	pts      []pt
	label    string
	at       pt
	anchor   anchor
	dashed   bool
}

var arrows = []arrow{
	// A container's calls, down to the device.
	{from: "workload", to: "interposer", pts: []pt{{780, 538}, {730, 538}}},
	{from: "interposer", to: "libcuda", pts: []pt{{530, 538}, {480, 538}}},
	{from: "libcuda", to: "gpu", pts: []pt{{280, 538}, {230, 538}}},

	// The control block: the interposer's ledger and the agent's limits.
	{from: "interposer", to: "controlblock", pts: []pt{{610, 510}, {610, 444}}, label: "writes usage", at: pt{602, 470}, anchor: end},
	{from: "controlblock", to: "interposer", pts: []pt{{670, 444}, {670, 510}}, label: "reads limits", at: pt{678, 470}, anchor: start},
	{from: "controlblock", to: "scheduler", pts: []pt{{610, 380}, {610, 316}}, label: "tickets, marks", at: pt{602, 350}, anchor: end},
	{from: "scheduler", to: "controlblock", pts: []pt{{670, 316}, {670, 380}}, label: "grants, heartbeat", at: pt{678, 350}, anchor: start},
	{from: "deviceplugin", to: "controlblock", pts: []pt{{480, 182}, {495, 182}, {495, 412}, {530, 412}}, label: "limits, empty usage", at: pt{495, 212}},
	{from: "controlblock", to: "collector", pts: []pt{{530, 428}, {262, 428}, {262, 308}, {230, 308}}, label: "ledgers, limits", at: pt{455, 428}},

	// What the node sees.
	{from: "libcuda", to: "ebpf", pts: []pt{{380, 510}, {380, 316}}, label: "uprobes: bytes, launches", at: pt{380, 466}},
	{from: "ebpf", to: "collector", pts: []pt{{280, 288}, {230, 288}}},
	{from: "gpu", to: "nvml", pts: []pt{{130, 510}, {130, 436}}},
	{from: "nvml", to: "collector", pts: []pt{{130, 380}, {130, 316}}, label: "memory, utilization per process", at: pt{130, 348}},
	{from: "kubelet", to: "collector", pts: []pt{{280, 48}, {245, 48}, {245, 268}, {230, 268}}, label: "pod-resources", at: pt{245, 124}},

	// What the agent serves.
	{from: "collector", to: "http", pts: []pt{{130, 260}, {130, 196}}},
	{from: "http", to: "prom", pts: []pt{{130, 140}, {130, 76}}, label: "metrics, JSON view", at: pt{130, 92}},

	// Allocations and settings.
	{from: "kubelet", to: "deviceplugin", pts: []pt{{380, 76}, {380, 140}}, label: "Allocate", at: pt{380, 92}},
	{from: "apiserver", to: "membership", pts: []pt{{630, 76}, {630, 140}}, label: "annotations", at: pt{630, 92}},
	{from: "ctl", to: "changeapi", pts: []pt{{880, 76}, {880, 140}}, label: "changes + token", at: pt{880, 92}},
	{from: "changeapi", to: "membership", pts: []pt{{780, 168}, {730, 168}}},
	{from: "membership", to: "scheduler", pts: []pt{{630, 196}, {630, 260}}, label: "weight, cap, priority, policy", at: pt{630, 240}},

	// The judge's verdicts.
	{from: "collector", to: "workload", pts: []pt{{30, 302}, {10, 302}, {10, 594}, {880, 594}, {880, 566}}, dashed: true,
		label: "a container in breach: report, freeze or kill (enforcement.onBreach)", at: pt{450, 594}},
}

// place sets each box's position from its column and row.
func place() []box {
	placed := make([]box, len(boxes))
	for i, b := range boxes {
		b.x, b.y, b.ht = col[b.c], row[b.r], boxH
		if b.h > 0 {
			b.ht = b.h
		}
		placed[i] = b
	}
	return placed
}

// textWidth estimates how wide a line of sans-serif text is drawn: about
// 0.6 of the font size per character, bold titles a little more. The
// test uses it to keep text inside its box and labels off the boxes.
func textWidth(s string, size int, bold bool) int {
	w := float64(len(s)) * float64(size) * 0.58
	if bold {
		w *= 1.08
	}
	return int(w + 0.5)
}

// rect is a rectangle of the picture.
type rect struct{ x0, y0, x1, y1 int }

// labelRect is the white ground under an arrow's label.
func labelRect(a arrow) rect {
	w := textWidth(a.label, fontSize, false) + 8
	x := a.at.x - w/2
	switch a.anchor {
	case end:
		x = a.at.x - w + 4
	case start:
		x = a.at.x - 4
	}
	return rect{x, a.at.y - 8, x + w, a.at.y + 8}
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}

// render appends the SVG to b.
func render(b []byte) []byte {
	b = fmt.Appendf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		width, height, width, height, fontSize)
	b = append(b, "<title>gpuwarden: how data flows between its parts (docs/architecture.md)</title>\n"...)
	b = append(b, `<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#333333"/></marker></defs>`+"\n"...)
	b = fmt.Appendf(b, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	for _, g := range groups {
		b = fmt.Appendf(b, `<rect x="%d" y="%d" width="%d" height="%d" rx="10" fill="none" stroke="#999999" stroke-dasharray="6 4"/>`+"\n", g.x, g.y, g.w, g.h)
		b = fmt.Appendf(b, `<text x="%d" y="%d" text-anchor="end" fill="#555555" font-style="italic">%s</text>`+"\n", g.lx, g.ly, esc(g.label))
	}
	for _, bx := range place() {
		c := colours[bx.kind]
		b = fmt.Appendf(b, `<rect x="%d" y="%d" width="%d" height="%d" rx="6" fill="%s" stroke="%s" stroke-width="1.5"/>`+"\n",
			bx.x, bx.y, boxW, bx.ht, c[0], c[1])
		// The lines are centred in the box: a 14 px title, 14 px apart below it.
		total := titleSize + (len(bx.lines)-1)*14
		y := bx.y + (bx.ht-total)/2 + titleSize - 2
		for i, line := range bx.lines {
			if i == 0 {
				b = fmt.Appendf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="%d" font-weight="bold" fill="#111111">%s</text>`+"\n",
					bx.x+boxW/2, y, titleSize, esc(line))
				y += 15
				continue
			}
			b = fmt.Appendf(b, `<text x="%d" y="%d" text-anchor="middle" fill="#333333">%s</text>`+"\n", bx.x+boxW/2, y, esc(line))
			y += 14
		}
	}
	for _, a := range arrows {
		var pts []string
		for _, p := range a.pts {
			pts = append(pts, fmt.Sprintf("%d,%d", p.x, p.y))
		}
		dash := ""
		if a.dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		b = fmt.Appendf(b, `<polyline points="%s" fill="none" stroke="#333333" stroke-width="1.3"%s marker-end="url(#head)"/>`+"\n",
			strings.Join(pts, " "), dash)
	}
	// Labels last, so that their ground covers the lines they sit on.
	for _, a := range arrows {
		if a.label == "" {
			continue
		}
		r := labelRect(a)
		b = fmt.Appendf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#ffffff" fill-opacity="0.9"/>`+"\n", r.x0, r.y0, r.x1-r.x0, r.y1-r.y0)
		ta := [...]string{"middle", "end", "start"}[a.anchor]
		b = fmt.Appendf(b, `<text x="%d" y="%d" text-anchor="%s" fill="#222222">%s</text>`+"\n", a.at.x, a.at.y+4, ta, esc(a.label))
	}
	return append(b, "</svg>\n"...)
}
