package agent

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpuwarden/gpuwarden/enforcer/control"
)

func (a *Agent) mux() *http.ServeMux {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "gpuwarden_agent"}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.coll.MetricsHandler(reg, a.log))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	a.coll.RegisterAPI(mux)
	if e := a.enf.Load(); e != nil {
		if err := control.Register(mux, a.cfg.Enforcement.APITokenFile, e, a.breaches); err != nil {
			a.log.Error("the change API is off: no token", "err", err)
		}
	}
	return mux
}

func (a *Agent) readyz(w http.ResponseWriter, _ *http.Request) {
	a.checkCgroups()
	p, ready := a.parts.snapshot()
	w.Header().Set("Content-Type", "application/json")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(agentapi.ReadyResponse{Ready: ready, Parts: p})
}
