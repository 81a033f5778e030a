package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/spf13/pflag"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// defaultAgentURL is where `gpuwarden agent` serves by default (http.listen's default).
const defaultAgentURL = "http://127.0.0.1:9477"

// runSmi is `gpuwarden smi`: who uses which GPU, per container, as the
// agent sees it; read locally from the control blocks and NVML when no
// agent answers.
func runSmi(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("smi", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: gpuwarden smi [flags]\n\nShow who uses which GPU, per container. Without an agent, read the control blocks and NVML directly.\n\nflags:")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
	}
	agentURL := fs.String("agent", defaultAgentURL, "the agent's URL")
	asJSON := fs.Bool("json", false, "print the view as JSON")
	watch := fs.Duration("watch", 0, "redraw every `DURATION` (e.g. 2s) until Ctrl-C; 0: once")
	controlDir := fs.String("control-dir", defaultControlDir(), "control blocks to read when no agent answers")
	nvmlLib := fs.String("nvml-library", "", "NVML library to read when no agent answers (default: the system's libnvidia-ml.so.1)")
	remote := fs.String("remote", "", "list the GPUs of the agent at `HOST[:PORT]` that serves remote sessions, and their free memory")
	rf := addRemoteFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gpuwarden smi: %v (see 'gpuwarden smi -h')\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpuwarden smi: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *remote != "" {
		return smiRemote(*remote, rf, *asJSON, stdout, stderr)
	}
	base, err := parseAgentURL(*agentURL)
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden smi: bad --agent: %v\n", err)
		return 2
	}
	if *watch < 0 {
		fmt.Fprintf(stderr, "gpuwarden smi: bad --watch %v: want a positive duration, or 0 for once\n", *watch)
		return 2
	}

	s := &smiSource{agent: base, controlDir: *controlDir, nvmlLibrary: *nvmlLib,
		client: &http.Client{Timeout: 5 * time.Second}}
	defer s.close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *watch == 0 {
		v, err := s.read(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err)
			return 1
		}
		if err := show(stdout, v, *asJSON, 0); err != nil {
			fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err)
			return 1
		}
		return 0
	}
	t := time.NewTicker(*watch)
	defer t.Stop()
	for {
		v, err := s.read(ctx)
		switch {
		case ctx.Err() != nil:
			return 0
		case err != nil && *asJSON:
			fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err) // keep stdout a stream of views
		case err != nil:
			fmt.Fprintf(stdout, "\x1b[H\x1b[2Jgpuwarden smi  %s  every %v\n%s", time.Now().Format("2006-01-02 15:04:05 MST"),
				*watch, wrap("error: ", printable(err.Error()), smiWidth))
		default:
			if !*asJSON {
				io.WriteString(stdout, "\x1b[H\x1b[2J")
			}
			if err := show(stdout, v, *asJSON, *watch); err != nil {
				fmt.Fprintf(stderr, "gpuwarden smi: %v\n", err)
				return 1
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-t.C:
		}
	}
}

// show prints one view: the table, or JSON (one line per view when watching).
func show(w io.Writer, v *smiView, asJSON bool, watch time.Duration) error {
	if !asJSON {
		local := *v
		local.Time = v.Time.Local()
		return renderSmi(w, &local, watch)
	}
	var b []byte
	var err error
	if watch > 0 {
		b, err = json.Marshal(v)
	} else {
		b, err = json.MarshalIndent(v, "", "  ")
	}
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func defaultControlDir() string {
	if d := os.Getenv("GPUWARDEN_CONTROL_DIR"); d != "" {
		return d
	}
	return controlblock.DefaultControlDir
}

// parseAgentURL accepts a URL or a bare host:port (http is assumed).
func parseAgentURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("empty URL")
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: want an http or https URL", s)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q: no host", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

// smiSource reads the view from the agent, or locally when none answers.
type smiSource struct {
	agent       *url.URL
	client      *http.Client
	controlDir  string
	nvmlLibrary string
	local       *localView // opened on the first miss, reused while watching
}

// errNoAgent says nothing answered at the agent's address.
type errNoAgent struct{ err error }

func (e *errNoAgent) Error() string { return e.err.Error() }
func (e *errNoAgent) Unwrap() error { return e.err }

func (s *smiSource) read(ctx context.Context) (*smiView, error) {
	v, err := s.fromAgent(ctx)
	var missing *errNoAgent
	if err == nil || !errors.As(err, &missing) || ctx.Err() != nil {
		return v, err
	}
	if s.local == nil {
		s.local, err = openLocal(s.controlDir, s.nvmlLibrary)
		if err != nil {
			return nil, fmt.Errorf("no agent answers at %s (%v), and no local data: %w", s.agent, shortNetError(missing.err), err)
		}
	}
	v = s.local.view(ctx)
	v.Notes = append([]string{fmt.Sprintf("no agent answers at %s (%v): reading the control blocks in %s and NVML directly.",
		s.agent, shortNetError(missing.err), s.controlDir)}, v.Notes...)
	return v, nil
}

func (s *smiSource) close() {
	if s.local != nil {
		s.local.close()
	}
}

// fromAgent reads the agent's API. A failure to connect is an *errNoAgent;
// an agent that answers with an error is reported as it is.
func (s *smiSource) fromAgent(ctx context.Context) (*smiView, error) {
	var cr agentapi.ContainersResponse
	if err := s.get(ctx, "/api/v1/containers", &cr); err != nil {
		return nil, err
	}
	var dr agentapi.DevicesResponse
	if err := s.get(ctx, "/api/v1/devices", &dr); err != nil {
		return nil, err
	}
	v := viewFromAPI(cr, dr)
	v.Agent = s.agent.String()
	// The enforcer's state per GPU; an agent without the enforcer has none.
	_ = s.get(ctx, "/api/v1/gpus", &v.GPUs)
	return v, nil
}

// viewFromAPI joins the agent's two answers and notes what the agent could
// not see.
func viewFromAPI(cr agentapi.ContainersResponse, dr agentapi.DevicesResponse) *smiView {
	v := &smiView{Node: cr.Node, Time: cr.Time, Source: "agent", Devices: dr.Devices, Containers: cr.Containers,
		Sources: cr.Sources}
	if v.Devices == nil {
		v.Devices = []agentapi.Device{}
	}
	if v.Containers == nil {
		v.Containers = []agentapi.ContainerDevice{}
	}
	ebpf := false
	for _, src := range cr.Sources {
		if src.Name == "ebpf" {
			ebpf = true
		}
		if !src.OK {
			v.Notes = append(v.Notes, fmt.Sprintf("the agent's %s source failed: %s", src.Name, src.Error))
		}
	}
	if !ebpf {
		v.Notes = append(v.Notes, "the agent runs without eBPF: a container that bypasses the interposer is seen only if NVML lists its processes.")
	}
	return v
}

func (s *smiSource) get(ctx context.Context, path string, into any) error {
	u := *s.agent
	u.Path += path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return &errNoAgent{err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("agent at %s: GET %s: %w", s.agent, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return fmt.Errorf("agent at %s: GET %s: %s: %s", s.agent, path, resp.Status, msg)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("agent at %s: GET %s: bad answer: %w", s.agent, path, err)
	}
	return nil
}

// shortNetError drops the URL and method that net/http repeats in its errors.
func shortNetError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		err = se.Err
	}
	return err.Error()
}
