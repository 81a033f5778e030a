package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// The change API, used by `gpuwarden ctl`: taken only from loopback and
// only with the token the agent writes at start to a root-only file.

func gpuInfo(st scheduler.GPUStatus, node []string) agentapi.GPUInfo {
	return agentapi.GPUInfo{Index: slices.Index(node, st.UUID), UUID: st.UUID, Policy: st.Policy.String(), PolicySet: st.PolicySet, MaxInst: st.MaxInst,
		FreeWeight: st.FreeWeight, Containers: st.Containers}
}

// inForce reports the scheduler's targets for every container on the GPUs.
func (e *enforcement) inForce(gpus ...string) []agentapi.InForce {
	var out []agentapi.InForce
	for _, st := range e.s.Status() {
		if slices.Contains(gpus, st.GPU) {
			out = append(out, agentapi.InForce{Container: st.Key, GPU: st.GPU, Policy: st.Policy.String(), Target: st.Target})
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
	mux.HandleFunc("POST /api/v1/gpus/{gpu}/settings", auth(e.changeGPU))
	mux.HandleFunc("GET /api/v1/gpus", func(w http.ResponseWriter, _ *http.Request) {
		node, _ := e.nodeGPUs()
		out := []agentapi.GPUInfo{}
		for _, st := range e.s.GPUs() {
			out = append(out, gpuInfo(st, node))
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /api/v1/gpus/{gpu}", func(w http.ResponseWriter, r *http.Request) {
		if uuid, node, ok := e.gpuOf(w, r); ok {
			writeJSON(w, gpuInfo(e.s.GPU(uuid), node))
		}
	})
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, e.breaches.list()) })
}

// maxChangeBody bounds a change's body: a change is a few fields.
const maxChangeBody = 64 << 10

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
	if err := writePrivate(path, []byte(tok+"\n")); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	return tok, nil
}

// writePrivate writes b to path, readable by the agent's user alone: never
// through a symlink (which could lead anywhere), never into a file of
// another user (who may hold it open), and with the mode made 0600 before
// b is written, whatever the file's mode was.
func writePrivate(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("%s is a symlink: refused", path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("%s is not a regular file: refused", path)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s belongs to uid %d: refused", path, st.Uid)
	}
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return err
	}
	return f.Close()
}

// decodeChange reads a change's JSON body, bounded: a body over
// maxChangeBody is refused (413) unread. Errors name what is wrong without
// repeating the request's text.
func decodeChange(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxChangeBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("bad request: body over %d bytes", maxChangeBody))
	case err != nil:
		httpError(w, http.StatusBadRequest, "bad request: "+jsonProblem(err))
	}
	return err == nil
}

// jsonProblem says what is wrong with a body, naming a field at most.
func jsonProblem(err error) string {
	var typ *json.UnmarshalTypeError
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: want a JSON %s", bounded(typ.Field), typ.Type.Kind())
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON (at byte %d)", syn.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + bounded(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
	}
	return "not a JSON object of the change's fields"
}

// bounded quotes a name taken from a request, cut to 64 bytes.
func bounded(s string) string {
	const most = 64
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return strconv.Quote(strings.ToValidUTF8(s[:most], "")) + "..."
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
	return nil, fmt.Errorf("no container %s runs under the enforcer (name it by control-block directory, cgroup path or namespace/pod/container)", bounded(name))
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
		var ch agentapi.ContainerChange
		if !decodeChange(w, r, &ch) {
			return
		}
		res, err := e.apply(m, ch)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, res)
	default:
		httpError(w, http.StatusNotFound, "unknown action "+bounded(action)+": want settings or unfreeze")
	}
}

// unfreeze thaws a cgroup the agent froze, named by its path (bypassing
// containers have no control block to be named by).
func (e *enforcement) unfreeze(w http.ResponseWriter, path string) {
	e.breaches.mu.Lock()
	frozen := e.breaches.frozen[path]
	e.breaches.mu.Unlock()
	if !frozen {
		httpError(w, http.StatusNotFound, fmt.Sprintf("the agent froze no cgroup %s (see gpuwarden ctl events)", bounded(path)))
		return
	}
	if err := e.freeze(path, false); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	e.breaches.record(agentapi.Event{Kind: "unfrozen", Cgroup: path, Message: "unfrozen by gpuwarden ctl"})
	writeJSON(w, agentapi.ChangeResult{Container: path})
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
func (e *enforcement) apply(m *member, ch agentapi.ContainerChange) (agentapi.ChangeResult, error) {
	res := agentapi.ChangeResult{Container: m.dir}
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
			return res, errors.New("priority: want high or normal")
		}
	}
	if err := (policy.Container{Weight: next.Weight, CapPercent: next.CapPercent}).Validate(); err != nil {
		return res, err
	}
	var mem [controlblock.MaxDevices]uint64
	if ch.MemoryLimit != nil {
		var ok bool
		if mem, ok = controlblock.ParseMemoryList(*ch.MemoryLimit); !ok {
			return res, errors.New("memoryLimit: want a size list such as 6Gi or 3Gi,4Gi (0: none)")
		}
		for _, d := range m.devices {
			if held := m.usage.Reserved(d.Ordinal); mem[d.Ordinal] > 0 && held > mem[d.Ordinal] {
				res.Warnings = append(res.Warnings, fmt.Sprintf("GPU %s: the container already holds %d MiB, over the new limit of %d MiB; "+
					"it keeps what it has, and new allocations fail until it is under", d.UUID, held>>20, mem[d.Ordinal]>>20))
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
	var gpus []string
	for _, d := range m.devices {
		gpus = append(gpus, d.UUID)
	}
	res.InForce = e.inForce(gpus...)
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

// gpuOf reads {gpu}, NVML's index or a UUID, as the GPU's UUID (with the
// node's GPUs by index), answering 404 for a GPU the node does not have.
// Without NVML only a UUID names a GPU.
func (e *enforcement) gpuOf(w http.ResponseWriter, r *http.Request) (uuid string, node []string, ok bool) {
	arg := r.PathValue("gpu")
	node, err := e.nodeGPUs()
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "the node's GPUs: "+err.Error())
		return "", nil, false
	}
	if i, err := strconv.Atoi(arg); err == nil && i >= 0 && i < len(node) {
		return node[i], node, true
	}
	if strings.HasPrefix(arg, "GPU-") && len(arg) <= 64 && (node == nil || slices.Contains(node, arg)) {
		return arg, node, true
	}
	httpError(w, http.StatusNotFound, "no GPU "+bounded(arg))
	return "", nil, false
}

// changeGPU sets a GPU's policy or max_inst; a new max_inst goes to the
// device plugin first, which may refuse it (409), then to the scheduler.
func (e *enforcement) changeGPU(w http.ResponseWriter, r *http.Request) {
	uuid, node, ok := e.gpuOf(w, r)
	if !ok {
		return
	}
	var ch agentapi.GPUChange
	if !decodeChange(w, r, &ch) {
		return
	}
	g := e.settings.gpu(uuid)
	if ch.Policy != nil {
		p, err := policy.Parse(*ch.Policy)
		if err != nil {
			httpError(w, http.StatusBadRequest, "policy: want 0-5 or one of "+policyNames())
			return
		}
		g.Policy, g.PolicySet = p, true
	}
	if ch.MaxInst != nil {
		g.MaxInst = *ch.MaxInst
		if err := policy.CheckMaxInst(g.MaxInst); err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		if err := e.a.setSlots(r.Context(), slices.Index(node, uuid), g.MaxInst); err != nil {
			httpError(w, http.StatusConflict, "device plugin: "+err.Error())
			return
		}
	}
	if err := e.s.SetGPU(uuid, g); err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := e.settings.update(func(s *settingsStore) {
		s.GPUs[uuid] = savedGPU{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
		delete(s.GPUs, strconv.Itoa(slices.Index(node, uuid))) // its entry by index, from an older file
	}); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	info := gpuInfo(e.s.GPU(uuid), node)
	writeJSON(w, agentapi.ChangeResult{InForce: e.inForce(uuid), GPU: &info})
}

// policyNames lists the policies by name, for an error.
func policyNames() string {
	var names []string
	for p := policy.Policy(0); p.Valid(); p++ {
		names = append(names, p.String())
	}
	return strings.Join(names, ", ")
}
