package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// The change API, used by `gpuwarden ctl`: taken only from loopback and
// only with the token the agent writes at start to a root-only file.

// ContainerChange is POST /api/v1/containers/{container}/settings. Absent
// fields stay as they are. {container} is the control-block directory, the
// cgroup path, or namespace/pod/container.
type ContainerChange struct {
	MemoryLimit  *string `json:"memoryLimit,omitempty"`  // GPUWARDEN_MEMORY_LIMIT's syntax: "6Gi", "3Gi,4Gi"; "0": none
	Weight       *int    `json:"weight,omitempty"`       // 1-1000
	ComputeLimit *int    `json:"computeLimit,omitempty"` // percent 0-100; 0: none
	Priority     *string `json:"priority,omitempty"`     // high or normal
}

// GPUChange is POST /api/v1/gpus/{index}/settings.
type GPUChange struct {
	Policy  *string `json:"policy,omitempty"` // 0-5 or fair-share, preemptive, weighted, fixed, soft, native
	MaxInst *int    `json:"maxInst,omitempty"`
}

// ChangeResult is every change's answer. InForce lists the shares the
// scheduler holds the containers on the GPUs concerned to once the change
// is made: a
// change is in force when the answer comes (grants follow on the next
// tick, 5 ms); metrics show it within the collector's 1 s view.
type ChangeResult struct {
	Container string    `json:"container,omitempty"`
	Warnings  []string  `json:"warnings,omitempty"`
	InForce   []InForce `json:"inForce,omitempty"`
}

// InForce is one container's share on one GPU.
type InForce struct {
	Container string  `json:"container"`
	GPU       int     `json:"gpu"`
	Policy    string  `json:"policy"`
	Target    float64 `json:"target"`
}

// inForce reports the scheduler's targets for every container on the GPUs.
func (e *enforcement) inForce(devs ...int) []InForce {
	var out []InForce
	for _, st := range e.s.Status() {
		if slices.Contains(devs, st.Device) {
			out = append(out, InForce{Container: st.Key, GPU: st.Device, Policy: st.Policy.String(), Target: st.Target})
		}
	}
	return out
}

func (e *enforcement) register(mux *http.ServeMux, token string) {
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				httpError(w, http.StatusForbidden, "changes are taken from loopback only")
				return
			}
			got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				httpError(w, http.StatusUnauthorized, "missing or wrong token (see enforcement.apiTokenFile)")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /api/v1/containers/{container...}", auth(e.changeContainer))
	mux.HandleFunc("POST /api/v1/gpus/{index}/settings", auth(e.changeGPU))
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, e.breaches.list()) })
}

// makeToken writes a fresh random token to path (mode 0600) and returns it.
func makeToken(path string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	return tok, nil
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// find resolves a container name to the member it names.
func (e *enforcement) find(name string) (*member, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m := e.members[name]; m != nil {
		return m, nil
	}
	for _, m := range e.members {
		if m.path == name || controlblock.ContainerKey(name) == m.dir {
			return m, nil
		}
	}
	if strings.Count(name, "/") == 2 && !strings.HasPrefix(name, "/") {
		for _, c := range e.a.coll.View(context.Background()).Containers {
			if c.Namespace+"/"+c.Pod+"/"+c.Container == name {
				for _, m := range e.members {
					if m.cgroup == c.CgroupID {
						return m, nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("no container %q runs under the enforcer (name it by control-block directory, cgroup path or namespace/pod/container)", name)
}

func (e *enforcement) changeContainer(w http.ResponseWriter, r *http.Request) {
	name, action := cutLast(r.PathValue("container"))
	if action == "unfreeze" {
		e.unfreeze(w, name)
		return
	}
	m, err := e.find(name)
	if err != nil {
		httpError(w, http.StatusNotFound, err.Error())
		return
	}
	switch action {
	case "settings":
		var ch ContainerChange
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ch); err != nil {
			httpError(w, http.StatusBadRequest, "bad request: "+err.Error())
			return
		}
		res, err := e.apply(m, ch)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, res)
	default:
		httpError(w, http.StatusNotFound, "unknown action "+strconv.Quote(action)+": want settings or unfreeze")
	}
}

// unfreeze thaws a cgroup the agent froze, named by its path (bypassing
// containers have no control block to be named by).
func (e *enforcement) unfreeze(w http.ResponseWriter, path string) {
	e.breaches.mu.Lock()
	frozen := e.breaches.frozen[path]
	e.breaches.mu.Unlock()
	if !frozen {
		httpError(w, http.StatusNotFound, fmt.Sprintf("the agent froze no cgroup %q (see gpuwarden ctl events)", path))
		return
	}
	if err := e.freeze(path, false); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	e.breaches.record(Event{Kind: "unfrozen", Cgroup: path, Message: "unfrozen by gpuwarden ctl"})
	writeJSON(w, ChangeResult{Container: path})
}

// cutLast splits "a/b/settings" into "a/b" and "settings".
func cutLast(s string) (string, string) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return s, ""
	}
	return s[:i], s[i+1:]
}

// apply validates a change whole, then makes it: nothing changes when any
// part is bad.
func (e *enforcement) apply(m *member, ch ContainerChange) (ChangeResult, error) {
	res := ChangeResult{Container: m.dir}
	cur := e.current(m.dir)
	next := cur
	if ch.Weight != nil {
		if *ch.Weight < 1 {
			return res, fmt.Errorf("weight %d: want 1-1000", *ch.Weight)
		}
		next.Weight = *ch.Weight
	}
	if ch.ComputeLimit != nil {
		next.CapPercent = *ch.ComputeLimit
	}
	if ch.Priority != nil {
		switch *ch.Priority {
		case "high":
			next.High = true
		case "normal":
			next.High = false
		default:
			return res, fmt.Errorf("priority %q: want high or normal", *ch.Priority)
		}
	}
	if err := (policy.Container{Weight: next.Weight, CapPercent: next.CapPercent}).Validate(); err != nil {
		return res, err
	}
	var mem [controlblock.MaxDevices]uint64
	if ch.MemoryLimit != nil {
		var ok bool
		if mem, ok = controlblock.ParseMemoryList(*ch.MemoryLimit); !ok {
			return res, fmt.Errorf("memoryLimit %q: want a size list such as 6Gi or 3Gi,4Gi (0: none)", *ch.MemoryLimit)
		}
		for _, d := range m.devices {
			if held := m.usage.Reserved(d); mem[d] > 0 && held > mem[d] {
				res.Warnings = append(res.Warnings, fmt.Sprintf("GPU %d: the container already holds %d MiB, over the new limit of %d MiB; "+
					"it keeps what it has, and new allocations fail until it is under", d, held>>20, mem[d]>>20))
			}
		}
	}
	if ch.Weight != nil || ch.ComputeLimit != nil || ch.Priority != nil {
		if err := e.s.SetContainer(m.dir, next); err != nil {
			return res, err
		}
	}
	if ch.MemoryLimit != nil {
		m.limits.Update(func(c *controlblock.LimitsConfig) { c.MemLimit = mem })
	}
	err := e.settings.update(func(s *settingsStore) {
		sc := s.Containers[m.dir]
		if ch.Weight != nil || ch.ComputeLimit != nil || ch.Priority != nil {
			sc.Compute = &next
		}
		if ch.MemoryLimit != nil {
			sc.Memory = &mem
		}
		s.Containers[m.dir] = sc
	})
	res.InForce = e.inForce(m.devices...)
	return res, err
}

// current is the container's compute settings in force.
func (e *enforcement) current(dir string) scheduler.Settings {
	for _, st := range e.s.Status() {
		if st.Key == dir {
			return scheduler.Settings{Weight: st.Weight, CapPercent: st.CapPercent, High: st.High}
		}
	}
	return scheduler.Settings{Weight: 1}
}

func (e *enforcement) changeGPU(w http.ResponseWriter, r *http.Request) {
	dev, err := strconv.Atoi(r.PathValue("index"))
	if err != nil || dev < 0 || dev >= controlblock.MaxDevices {
		httpError(w, http.StatusNotFound, "no GPU "+strconv.Quote(r.PathValue("index")))
		return
	}
	var ch GPUChange
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ch); err != nil {
		httpError(w, http.StatusBadRequest, "bad request: "+err.Error())
		return
	}
	saved := e.settings.gpus()[dev]
	g := scheduler.GPUSettings{Policy: saved.Policy, PolicySet: saved.PolicySet, MaxInst: saved.MaxInst}
	if ch.Policy != nil {
		p, err := policy.Parse(*ch.Policy)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		g.Policy, g.PolicySet = p, true
	}
	if ch.MaxInst != nil {
		g.MaxInst = *ch.MaxInst
	}
	if err := e.s.SetGPU(dev, g); err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := e.settings.update(func(s *settingsStore) {
		s.GPUs[strconv.Itoa(dev)] = savedGPU{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
	}); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, ChangeResult{InForce: e.inForce(dev)})
}
