package collector

import (
	"encoding/json"
	"net/http"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// RegisterAPI adds the read API to mux.
func (c *Collector) RegisterAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/containers", func(w http.ResponseWriter, r *http.Request) {
		v := c.View(r.Context())
		writeJSON(w, agentapi.ContainersResponse{Node: v.Node, Time: v.Time, Containers: nonNil(v.Containers), Sources: v.Sources,
			BadLedgers: v.BadLedgers, RefusedLedgers: v.Refused})
	})
	mux.HandleFunc("GET /api/v1/devices", func(w http.ResponseWriter, r *http.Request) {
		v := c.View(r.Context())
		writeJSON(w, agentapi.DevicesResponse{Node: v.Node, Time: v.Time, Devices: nonNil(v.Devices)})
	})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
