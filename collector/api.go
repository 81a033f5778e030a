package collector

import (
	"encoding/json"
	"net/http"
	"time"
)

// ContainersResponse is GET /api/v1/containers.
type ContainersResponse struct {
	Node       string            `json:"node"`
	Time       time.Time         `json:"time"`
	Containers []ContainerDevice `json:"containers"`
	Sources    []SourceState     `json:"sources"`
	BadLedgers []BadLedger       `json:"badLedgers,omitempty"`
}

// DevicesResponse is GET /api/v1/devices.
type DevicesResponse struct {
	Node    string    `json:"node"`
	Time    time.Time `json:"time"`
	Devices []Device  `json:"devices"`
}

// RegisterAPI adds the read API to mux.
func (c *Collector) RegisterAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/containers", func(w http.ResponseWriter, r *http.Request) {
		v := c.View(r.Context())
		writeJSON(w, ContainersResponse{Node: v.Node, Time: v.Time, Containers: nonNil(v.Containers), Sources: v.Sources,
			BadLedgers: v.BadLedgers})
	})
	mux.HandleFunc("GET /api/v1/devices", func(w http.ResponseWriter, r *http.Request) {
		v := c.View(r.Context())
		writeJSON(w, DevicesResponse{Node: v.Node, Time: v.Time, Devices: nonNil(v.Devices)})
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
