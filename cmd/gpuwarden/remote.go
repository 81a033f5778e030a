package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/config"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// remoteFlags are a remote client's credentials and timeout; they default
// to the agent's variables (GPUWARDEN_REMOTE_CERT, _KEY, _CA, _TIMEOUT).
type remoteFlags struct {
	cert, key, ca *string
	timeout       *time.Duration
}

func addRemoteFlags(fs *pflag.FlagSet) remoteFlags {
	env := func(key string) string { return os.Getenv(config.EnvName(key)) }
	timeout := link.DefaultTimeout
	if d, err := time.ParseDuration(env("remote.timeout")); err == nil {
		timeout = d
	}
	return remoteFlags{
		cert:    fs.String("cert", env("remote.cert"), "the client certificate (PEM; default $"+config.EnvName("remote.cert")+")"),
		key:     fs.String("key", env("remote.key"), "its key (PEM; default $"+config.EnvName("remote.key")+")"),
		ca:      fs.String("ca", env("remote.ca"), "the CA of the server's certificate (PEM; default $"+config.EnvName("remote.ca")+")"),
		timeout: fs.Duration("timeout", timeout, "connect timeout, and how long the link may stay silent before calls fail ($"+config.EnvName("remote.timeout")+")"),
	}
}

func (r remoteFlags) dialer(server string) (*client.Dialer, error) {
	if *r.timeout < 100*time.Millisecond || *r.timeout > 10*time.Minute {
		return nil, fmt.Errorf("--timeout %v: want 100ms-10m", *r.timeout)
	}
	return client.NewDialer(server, pki.Files{Cert: *r.cert, Key: *r.key, CA: *r.ca}, *r.timeout)
}

// runRemote is `gpuwarden run --remote HOST -- CMD`: CMD's driver calls run
// on a slice of a GPU of HOST's agent.
func runRemote(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpuwarden run --remote HOST[:PORT] --memory 0.5|8Gi [flags] -- CMD [ARGS...]\n\n"+
			"Run CMD with its CUDA driver calls executed on a GPU of HOST's agent (its remote part on).\n\nflags:")
		fs.PrintDefaults()
	}
	server := fs.String("remote", "", "the GPU node's agent, HOST[:PORT] (port 7070 by default)")
	memory := fs.String("memory", "", "GPU memory: a fraction of the GPU (0.5) or a size (8Gi)")
	weight := fs.Int("weight", 1, fmt.Sprintf("compute weight, 1-%d", vocab.MaxWeight))
	priority := fs.String("priority", vocab.PriorityNormal, vocab.PriorityHigh+" or "+vocab.PriorityNormal)
	gpu := fs.String("gpu", "", "a GPU's UUID on the server; default: the one with the most free memory")
	exe, _ := os.Executable()
	libDir := fs.String("library-dir", filepath.Join(filepath.Dir(exe), "remote"), "the directory of the remote client library (libcuda.so.1)")
	dataPath := fs.String("data-path", cmp.Or(os.Getenv(config.EnvName("remote.dataPath")), session.PathDirect),
		"direct (the program's client library talks to the server's worker itself once the session is admitted) or relayed (every byte through this command and the server's agent) ($"+config.EnvName("remote.dataPath")+")")
	localSocket := fs.String("local-socket", "", "on the GPU node itself: its agent's local socket (<controlDir>/"+session.LocalSocket+
		"), dialled instead of the network; a direct session then talks to its worker with no TLS in between")
	rf := addRemoteFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gpuwarden run: %v\n", err)
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "gpuwarden run: "+format+"\n", a...)
		return code
	}
	if *server == "" {
		return fail(2, "--remote HOST is required")
	}
	if fs.NArg() == 0 {
		return fail(2, "no command given (gpuwarden run --remote HOST --memory 0.5 -- CMD)")
	}
	frac, bytes, err := vocab.ParseMemoryRequest(*memory)
	if err != nil {
		return fail(2, "--memory: %v", err)
	}
	req := session.Request{MemoryFraction: frac, MemoryBytes: bytes, Weight: *weight, Priority: *priority, GPU: *gpu}
	if _, err := req.Check(); err != nil {
		return fail(2, "%v", err)
	}
	if _, err := os.Stat(filepath.Join(*libDir, "libcuda.so.1")); err != nil {
		return fail(2, "no remote client library: %v", err)
	}
	relayed, err := session.ParseDataPath(*dataPath)
	if err != nil {
		return fail(2, "--data-path: %v", err)
	}
	d, err := rf.dialer(*server)
	if err != nil {
		return fail(2, "%v", err)
	}
	d.Relayed, d.Local = relayed, *localSocket
	// Ask once before starting CMD, so an unreachable server or refused
	// credentials show here rather than as a failed cuInit.
	if _, err := d.List(context.Background()); err != nil {
		return fail(1, "%v", err)
	}
	report := func(format string, a ...any) { fmt.Fprintf(stderr, "gpuwarden run: "+format+"\n", a...) }
	code, err := client.Run(client.Program{Args: fs.Args(), LibDir: *libDir, Env: os.Environ(),
		Stdin: os.Stdin, Stdout: stdout, Stderr: stderr}, d, req, report)
	if err != nil {
		return fail(1, "%v", err)
	}
	return code
}

// smiRemote is `gpuwarden smi --remote HOST`: the server's GPUs and their
// free memory.
func smiRemote(server string, rf remoteFlags, asJSON bool, stdout, stderr io.Writer) int {
	d, err := rf.dialer(server)
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err)
		return 2
	}
	l, err := d.List(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(l)
		return 0
	}
	_ = client.WriteList(stdout, d.Addr, l)
	return 0
}

// runCerts is `gpuwarden certs`: a CA and certificates for remote sessions.
func runCerts(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("certs", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage:\n"+
			"  gpuwarden certs ca --dir DIR\n"+
			"  gpuwarden certs server --dir DIR --name NAME --hosts gpu-node-1,10.0.0.5\n"+
			"  gpuwarden certs client --dir DIR --name NAME --namespace NS --pod POD --container C\n"+
			"  gpuwarden certs node --dir DIR --name NODE [--hosts NODE,10.0.0.5]\n\n"+
			"Make the CA (DIR/ca.crt, DIR/ca.key) and certificates it signs (DIR/NAME.crt, DIR/NAME.key) for remote GPU\n"+
			"sessions. A client certificate carries its identity as spiffe://gpuwarden/ns/NS/pod/POD/container/C; a\n"+
			"node's, spiffe://gpuwarden/node/NODE: its agent relays its pods' sessions and names their pods (with --hosts\n"+
			"it also serves sessions).\n\nflags:")
		fs.PrintDefaults()
	}
	dir := fs.String("dir", ".", "where the CA is, and where the files are written")
	out := fs.String("out", "", "write the certificate and key here instead of --dir")
	name := fs.String("name", "", "the certificate's name (files NAME.crt and NAME.key)")
	hosts := fs.String("hosts", "", "a server's host names and addresses, comma-separated")
	ns := fs.String("namespace", "", "a client's namespace")
	pod := fs.String("pod", "", "a client's pod")
	container := fs.String("container", "", "a client's container")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the certificate is valid")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gpuwarden certs: %v\n", err)
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	if *out == "" {
		*out = *dir
	}
	var err error
	switch fs.Arg(0) {
	case "ca":
		err = pki.CreateCA(*dir, "gpuwarden remote CA", *validity)
	case "server":
		err = pki.Issue(*dir, *out, pki.Request{Name: *name, Hosts: splitComma(*hosts), Validity: *validity})
	case "node":
		err = pki.Issue(*dir, *out, pki.Request{Name: *name, Node: *name, Hosts: splitComma(*hosts), Validity: *validity})
	case "client":
		err = pki.Issue(*dir, *out, pki.Request{Name: *name, Validity: *validity,
			Client: &pki.Identity{Namespace: *ns, Pod: *pod, Container: *container}})
	default:
		fmt.Fprintf(stderr, "gpuwarden certs: unknown kind %q: want ca, server, client or node\n", fs.Arg(0))
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden certs: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote the %s's files to %s\n", fs.Arg(0), *out)
	return 0
}

func splitComma(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
