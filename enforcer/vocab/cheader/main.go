// Command cheader writes enforcer/vocab's limits as a C header for the
// interposer (go generate ./enforcer/vocab).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

func main() {
	out := flag.String("o", "", "the header to write")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "usage: cheader -o FILE")
		os.Exit(2)
	}
	if err := os.WriteFile(*out, []byte(vocab.CHeader()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
