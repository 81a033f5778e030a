package client

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// WriteList prints a server's GPUs as `gpuwarden smi --remote` shows them.
func WriteList(w io.Writer, server string, l session.GPUList) error {
	fmt.Fprintf(w, "%s (node %s): %d GPU(s)\n", server, l.Node, len(l.GPUs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUUID\tNAME\tTOTAL MiB\tUSED MiB\tFREE MiB\tSESSIONS")
	for _, g := range l.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\n", g.Index, g.UUID, g.Name, g.TotalBytes>>20, g.UsedBytes>>20,
			g.FreeBytes>>20, g.Sessions)
	}
	return tw.Flush()
}
