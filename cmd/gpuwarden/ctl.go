package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

const ctlUsage = `usage: gpuwarden ctl [--agent URL] [--token-file FILE] COMMAND

commands:
  set CONTAINER [--memory-limit 6Gi|3Gi,4Gi|0] [--weight N] [--compute-limit PERCENT] [--priority high|normal]
  gpu INDEX|UUID [--policy 0-5|fair-share|preemptive|weighted|fixed|soft|native] [--max-inst 1-128]
      (without flags: shows the GPU's policy, max_inst and free_weight)
  unfreeze CONTAINER
  events

CONTAINER is a control-block directory, a cgroup path, or namespace/pod/container.
Changes take effect within 100 ms and are kept across agent restarts.`

// runCtl is `gpuwarden ctl`: changes a container's or a GPU's settings at
// run time through the agent's change API.
func runCtl(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, ctlUsage) }
	agent := fs.String("agent", "http://127.0.0.1:9477", "the agent's address")
	tokenFile := fs.String("token-file", "/run/gpuwarden-agent/token", "the agent's change-API token (enforcement.apiTokenFile)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 2
	}
	c := &ctlClient{agent: strings.TrimSuffix(*agent, "/"), tokenFile: *tokenFile}
	if !strings.Contains(c.agent, "://") {
		c.agent = "http://" + c.agent
	}
	var err error
	switch rest[0] {
	case "set":
		err = c.set(rest[1:], stdout, stderr)
	case "gpu":
		err = c.gpu(rest[1:], stdout, stderr)
	case "unfreeze":
		if len(rest) != 2 {
			fmt.Fprintln(stderr, ctlUsage)
			return 2
		}
		err = c.post("/api/v1/containers/"+url.PathEscape(rest[1])+"/unfreeze", struct{}{}, stdout)
	case "events":
		err = c.events(stdout)
	default:
		fmt.Fprintf(stderr, "gpuwarden ctl: unknown command %q\n%s\n", rest[0], ctlUsage)
		return 2
	}
	if err == errUsage {
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden ctl: %v\n", err)
		return 1
	}
	return 0
}

var errUsage = fmt.Errorf("usage")

type ctlClient struct {
	agent, tokenFile string
}

func (c *ctlClient) set(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, ctlUsage)
		return errUsage
	}
	name := args[0]
	fs := flag.NewFlagSet("ctl set", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mem := fs.String("memory-limit", "", "GPU memory per device")
	weight := fs.Int("weight", 0, fmt.Sprintf("compute weight, 1-%d", vocab.MaxWeight))
	limit := fs.Int("compute-limit", -1, "hard cap, percent of the device; 0: none")
	prio := fs.String("priority", "", "high or normal")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	var ch agentapi.ContainerChange
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "memory-limit":
			ch.MemoryLimit = mem
		case "weight":
			ch.Weight = weight
		case "compute-limit":
			ch.ComputeLimit = limit
		case "priority":
			ch.Priority = prio
		}
	})
	if ch.MemoryLimit == nil && ch.Weight == nil && ch.ComputeLimit == nil && ch.Priority == nil {
		return fmt.Errorf("set %s: nothing to change (give --memory-limit, --weight, --compute-limit or --priority)", name)
	}
	return c.post("/api/v1/containers/"+url.PathEscape(name)+"/settings", ch, stdout)
}

func (c *ctlClient) gpu(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, ctlUsage)
		return errUsage
	}
	fs := flag.NewFlagSet("ctl gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pol := fs.String("policy", "", "scheduling policy")
	maxInst := fs.Int("max-inst", 0, "the GPU's max_inst: the device plugin's slots and the policies' 1/max_inst")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	var ch agentapi.GPUChange
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "policy":
			ch.Policy = pol
		case "max-inst":
			ch.MaxInst = maxInst
		}
	})
	if ch.Policy == nil && ch.MaxInst == nil {
		var g agentapi.GPUInfo
		if err := c.getJSON("/api/v1/gpus/"+url.PathEscape(args[0]), &g); err != nil {
			return err
		}
		printGPU(stdout, g)
		return nil
	}
	return c.post("/api/v1/gpus/"+url.PathEscape(args[0])+"/settings", ch, stdout)
}

func printGPU(w io.Writer, g agentapi.GPUInfo) {
	set := ""
	if g.PolicySet {
		set = " (set)"
	}
	fmt.Fprintf(w, "GPU %d (%s): policy %s%s, max_inst %d, free_weight %d, %d containers\n", g.Index, g.UUID, g.Policy, set,
		g.MaxInst, g.FreeWeight, g.Containers)
}

func (c *ctlClient) post(path string, body any, stdout io.Writer) error {
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return fmt.Errorf("read the agent's token: %w (run as root on the agent's node)", err)
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, c.agent+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("agent at %s: %w", c.agent, err)
	}
	defer resp.Body.Close()
	var res struct {
		Error string `json:"error"`
		agentapi.ChangeResult
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&res)
	if resp.StatusCode != http.StatusOK {
		if res.Error == "" {
			res.Error = resp.Status
		}
		return fmt.Errorf("refused: %s", res.Error)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	for _, f := range res.InForce {
		fmt.Fprintf(stdout, "in force: %s on GPU %s: %s, target %.1f%%\n", f.Container, f.GPU, f.Policy, f.Target*100)
	}
	if res.GPU != nil {
		printGPU(stdout, *res.GPU)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

// getJSON reads one of the agent's GET answers into v.
func (c *ctlClient) getJSON(path string, v any) error {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(c.agent + path)
	if err != nil {
		return fmt.Errorf("agent at %s: %w", c.agent, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent at %s: %s", c.agent, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v); err != nil {
		return fmt.Errorf("agent at %s: bad answer: %w", c.agent, err)
	}
	return nil
}

func (c *ctlClient) events(stdout io.Writer) error {
	var evs []agentapi.Event
	if err := c.getJSON("/api/v1/events", &evs); err != nil {
		return err
	}
	for _, e := range evs {
		fmt.Fprintf(stdout, "%s  %-9s gpu %d  %s  %s\n", e.Time.Format(time.RFC3339), e.Kind, e.GPU, e.Cgroup, e.Message)
	}
	return nil
}
