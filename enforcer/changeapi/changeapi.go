// Package changeapi serves the change API that `gpuwarden ctl` uses: taken
// only from loopback and only with the token the agent writes at start to a
// root-only file.
package changeapi

import (
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
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
)

// Breaches is what the agent saw and did about containers in breach.
type Breaches interface {
	Events() []agentapi.Event
	// Unfreeze thaws a cgroup the agent froze; ErrNotFrozen when it froze
	// no such cgroup.
	Unfreeze(path string) error
}

// ErrNotFrozen: the agent froze no such cgroup.
var ErrNotFrozen = errors.New("not frozen by the agent")

// Register adds the change API and its reads to mux, with a fresh token
// written to tokenFile.
func Register(mux *http.ServeMux, tokenFile string, e *membership.Members, b Breaches) error {
	token, err := makeToken(tokenFile)
	if err != nil {
		return err
	}
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
	h := handlers{e: e, b: b}
	mux.HandleFunc("POST /api/v1/containers/{container...}", auth(h.changeContainer))
	mux.HandleFunc("POST /api/v1/gpus/{gpu}/settings", auth(h.changeGPU))
	mux.HandleFunc("GET /api/v1/gpus", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, e.GPUs()) })
	mux.HandleFunc("GET /api/v1/gpus/{gpu}", func(w http.ResponseWriter, r *http.Request) {
		if uuid, ok := h.gpuOf(w, r); ok {
			writeJSON(w, e.GPU(uuid))
		}
	})
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, b.Events()) })
	return nil
}

type handlers struct {
	e *membership.Members
	b Breaches
}

func (h handlers) changeContainer(w http.ResponseWriter, r *http.Request) {
	name, action := cutLast(r.PathValue("container"))
	if action == "unfreeze" {
		h.unfreeze(w, name)
		return
	}
	if _, err := h.e.Find(name); err != nil {
		httpError(w, http.StatusNotFound, err.Error())
		return
	}
	switch action {
	case "settings":
		var ch agentapi.ContainerChange
		if !decodeChange(w, r, &ch) {
			return
		}
		res, err := h.e.ChangeContainer(name, ch)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, res)
	default:
		httpError(w, http.StatusNotFound, "unknown action "+agentapi.Quote(action)+": want settings or unfreeze")
	}
}

// unfreeze thaws a cgroup the agent froze, named by its path (bypassing
// containers have no control block to be named by).
func (h handlers) unfreeze(w http.ResponseWriter, path string) {
	err := h.b.Unfreeze(path)
	switch {
	case errors.Is(err, ErrNotFrozen):
		httpError(w, http.StatusNotFound, fmt.Sprintf("the agent froze no cgroup %s (see gpuwarden ctl events)", agentapi.Quote(path)))
	case err != nil:
		httpError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, agentapi.ChangeResult{Container: path})
	}
}

// cutLast splits "a/b/settings" into "a/b" and "settings".
func cutLast(s string) (string, string) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return s, ""
	}
	return s[:i], s[i+1:]
}

// gpuOf reads {gpu} as a GPU's UUID, answering 404 for a GPU the node
// does not have.
func (h handlers) gpuOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	uuid, err := h.e.ResolveGPU(r.PathValue("gpu"))
	switch {
	case errors.Is(err, membership.ErrNoGPU):
		httpError(w, http.StatusNotFound, err.Error())
	case err != nil:
		httpError(w, http.StatusServiceUnavailable, err.Error())
	}
	return uuid, err == nil
}

// changeGPU sets a GPU's policy or max_inst (409 when the device plugin
// refuses the new max_inst).
func (h handlers) changeGPU(w http.ResponseWriter, r *http.Request) {
	uuid, ok := h.gpuOf(w, r)
	if !ok {
		return
	}
	var ch agentapi.GPUChange
	if !decodeChange(w, r, &ch) {
		return
	}
	res, err := h.e.ChangeGPU(r.Context(), uuid, ch)
	switch {
	case errors.Is(err, membership.ErrSlots):
		httpError(w, http.StatusConflict, err.Error())
	case errors.Is(err, membership.ErrBadChange):
		httpError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		httpError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, res)
	}
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
	if err := replacePrivate(path, []byte(tok+"\n")); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	return tok, nil
}

// replacePrivate puts b at path in a new file, readable by the agent's user
// alone, renamed over whatever was there: whoever opened an earlier file
// at path (while it was readable, or another user's) keeps reading that
// one, never b. A symlink or other non-regular file at path is refused: it
// was put there for something else.
func replacePrivate(path string, b []byte) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symlink: refused", path)
	} else if err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: refused", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*") // mode 0600
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
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
		return fmt.Sprintf("field %s: want a JSON %s", agentapi.Quote(typ.Field), typ.Type.Kind())
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON (at byte %d)", syn.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + agentapi.Quote(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
	}
	return "not a JSON object of the change's fields"
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
