package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// committed is the picture as the repository holds it.
const committed = "../architecture.svg"

// TestSVGIsCurrent draws the picture again and compares it with the
// committed one, byte for byte, so the SVG cannot drift from its tables.
func TestSVGIsCurrent(t *testing.T) {
	tmp := filepath.Join(t.TempDir(), "architecture.svg")
	if err := write(tmp); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(committed)
	if err != nil {
		t.Fatalf("%v: draw it with `go generate ./docs/diagram`", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/architecture.svg differs from what docs/diagram draws (%d bytes drawn, %d committed): run `go generate ./docs/diagram` and commit the result",
			len(got), len(want))
	}
}

// TestPictureIsLegible holds the tables to what keeps the picture
// readable: text inside its box, every arrow running from the edge of its
// source box to the edge of its target in straight horizontal and vertical
// runs, labels clear of the boxes and of each other, everything on the
// canvas, and no box left unconnected.
func TestPictureIsLegible(t *testing.T) {
	placed := place()
	byID := map[string]box{}
	for _, b := range placed {
		if _, dup := byID[b.id]; dup {
			t.Errorf("box %q twice", b.id)
		}
		byID[b.id] = b
		if b.x < 0 || b.y < 0 || b.x+boxW > width || b.y+b.ht > height {
			t.Errorf("box %q leaves the canvas", b.id)
		}
		for i, line := range b.lines {
			size := fontSize
			if i == 0 {
				size = titleSize
			}
			if w := textWidth(line, size, i == 0); w > boxW-12 {
				t.Errorf("box %q: %q is about %d px wide, more than its box holds", b.id, line, w)
			}
		}
		if min := titleSize + (len(b.lines)-1)*14 + 12; b.ht < min {
			t.Errorf("box %q: %d lines need %d px, it has %d", b.id, len(b.lines), min, b.ht)
		}
		for _, o := range placed {
			if o.id != b.id && overlaps(boxRect(b), boxRect(o)) {
				t.Errorf("boxes %q and %q overlap", b.id, o.id)
			}
		}
	}
	linked := map[string]bool{}
	var labels []rect
	for _, a := range arrows {
		from, ok1 := byID[a.from]
		to, ok2 := byID[a.to]
		if !ok1 || !ok2 {
			t.Errorf("arrow %s -> %s: no such box", a.from, a.to)
			continue
		}
		linked[a.from], linked[a.to] = true, true
		if len(a.pts) < 2 {
			t.Errorf("arrow %s -> %s: fewer than two points", a.from, a.to)
			continue
		}
		if !onEdge(a.pts[0], from) {
			t.Errorf("arrow %s -> %s starts at %v, not on the edge of %s", a.from, a.to, a.pts[0], a.from)
		}
		if !onEdge(a.pts[len(a.pts)-1], to) {
			t.Errorf("arrow %s -> %s ends at %v, not on the edge of %s", a.from, a.to, a.pts[len(a.pts)-1], a.to)
		}
		for i, p := range a.pts {
			if p.x < 0 || p.y < 0 || p.x > width || p.y > height {
				t.Errorf("arrow %s -> %s: %v is off the canvas", a.from, a.to, p)
			}
			if i > 0 && p.x != a.pts[i-1].x && p.y != a.pts[i-1].y {
				t.Errorf("arrow %s -> %s: %v to %v is neither horizontal nor vertical", a.from, a.to, a.pts[i-1], p)
			}
		}
		if a.label == "" {
			continue
		}
		r := labelRect(a)
		if r.x0 < 0 || r.x1 > width || r.y0 < 0 || r.y1 > height {
			t.Errorf("label %q leaves the canvas", a.label)
		}
		for _, b := range placed {
			if overlaps(r, boxRect(b)) {
				t.Errorf("label %q covers box %q", a.label, b.id)
			}
		}
		for _, o := range labels {
			if overlaps(r, o) {
				t.Errorf("label %q covers another label", a.label)
			}
		}
		labels = append(labels, r)
	}
	for _, b := range placed {
		if !linked[b.id] {
			t.Errorf("box %q has no arrow", b.id)
		}
	}
}

func boxRect(b box) rect { return rect{b.x, b.y, b.x + boxW, b.y + b.ht} }

func overlaps(a, b rect) bool { return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 }

// onEdge says whether p lies on the border of b.
func onEdge(p pt, b box) bool {
	inX := p.x >= b.x && p.x <= b.x+boxW
	inY := p.y >= b.y && p.y <= b.y+b.ht
	return (inX && (p.y == b.y || p.y == b.y+b.ht)) || (inY && (p.x == b.x || p.x == b.x+boxW))
}
