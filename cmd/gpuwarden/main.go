// Command gpuwarden is gpuwarden's one binary: the node agent, the
// per-container GPU view, the control client, the demo and the benchmarks.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/bench"
)

// version is set at build time (-ldflags -X main.version=...).
var version = "dev"

// A subcommand runs with its own arguments and returns the process's exit code.
type subcommand struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var subcommands = map[string]subcommand{
	"agent":     {"run the node agent (metrics, API, observation, enforcement)", runAgent},
	"ctl":       {"change a container's or a GPU's settings at run time", runCtl},
	"bench":     {"print benchmark figures as BENCH lines", bench.Run},
	"certs":     {"make a CA and certificates for remote GPU sessions", runCerts},
	"demo":      {"run workloads on the simulated GPU and show what gpuwarden sees", runDemo},
	"gpu-check": {"run the real-GPU check from a bundle (make gpu-check)", runGPUCheck},
	"run":       {"run a command on a slice of a remote GPU (--remote HOST)", runRemote},
	"smi":       {"show who uses which GPU, per container", runSmi},
	"version":   {"print the version", runVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		return runVersion(nil, stdout, stderr)
	}
	sc, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "gpuwarden: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return sc.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gpuwarden <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, subcommands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'gpuwarden <command> -h' for a command's flags; 'gpuwarden --version' for the version.")
}

func runVersion(_ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "gpuwarden %s\n", version)
	return 0
}
