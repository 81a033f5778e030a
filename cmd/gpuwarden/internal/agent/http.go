package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/pprof"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpuwarden/gpuwarden/enforcer/control"
)

func (a *Agent) mux() *http.ServeMux {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "gpuwarden_agent"}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(concatGatherers{reg, a.coll}, promhttp.HandlerOpts{ErrorLog: slogAdapter{a}}))
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

// concatGatherers serves the families of each gatherer in turn. Unlike
// prometheus.Gatherers it does not check every series again: each gatherer
// checked its own, and their family names do not overlap (the agent's
// process and Go runtime, and the collector's gpuwarden_*; a test holds
// them apart).
type concatGatherers []prometheus.Gatherer

func (g concatGatherers) Gather() ([]*dto.MetricFamily, error) {
	var out []*dto.MetricFamily
	var errs []error
	for _, x := range g {
		fams, err := x.Gather()
		out = append(out, fams...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// slogAdapter lets promhttp log through the agent's logger.
type slogAdapter struct{ a *Agent }

func (s slogAdapter) Println(v ...any) { s.a.log.Error("metrics", "err", v) }
