// Command diagram draws docs/architecture.svg, the picture of how data flows
// between gpuwarden's parts, from the tables of boxes and arrows in
// diagram.go. It needs nothing but Go: no renderer, no fonts.
//
// Regenerate the picture after changing a table (TestSVGIsCurrent fails
// until then):
//
//	go generate ./docs/diagram
//
// (`make generate` runs it too.)
package main

//go:generate go run . -o ../architecture.svg

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	out := flag.String("o", "architecture.svg", "the SVG file to write")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "diagram:", err)
		os.Exit(1)
	}
}

// write renders the picture into path, replacing what was there.
func write(path string) error {
	var b []byte
	b = render(b)
	return os.WriteFile(path, b, 0o644)
}
