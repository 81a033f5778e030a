package agent

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpuwarden/gpuwarden/enforcer/changeapi"
	"github.com/gpuwarden/gpuwarden/enforcer/connlimit"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/server"
)

// The HTTP server's bounds: whoever reaches the port (any pod, on
// Kubernetes) is hostile input, and a connection that idles or sends
// slowly must not hold its place, buffers and goroutine for long.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second // a whole request: the change API's bodies are small
	idleTimeout       = 30 * time.Second // between requests on a kept-alive connection
	// maxProfile bounds a profile's or trace's seconds (http.pprof); the
	// response must be written within writeTimeout.
	maxProfile   = 30 * time.Second
	writeTimeout = maxProfile + 15*time.Second
)

func (a *Agent) mux() *http.ServeMux {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "gpuwarden_agent"}))
	for name, refused := range a.refused {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuwarden_agent_connections_refused_total",
			Help:        "Connections closed at once for being over the listener's maxConnections or maxConnectionsPerSource.",
			ConstLabels: prometheus.Labels{"listener": name}}, func() float64 { return float64(refused()) }))
	}
	for name, evicted := range a.evicted {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuwarden_agent_connections_evicted_total",
			Help:        "Idle connections closed to admit new ones while the listener was at its maxConnections.",
			ConstLabels: prometheus.Labels{"listener": name}}, func() float64 { return float64(evicted()) }))
	}
	if a.remoteTraffic != nil {
		reg.MustRegister(a.remoteTraffic)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.coll.MetricsHandler(reg, a.log))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", a.readyz)
	if a.cfg.HTTP.Pprof {
		mux.Handle("/debug/pprof/", boundedSeconds(http.HandlerFunc(pprof.Index)))
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.Handle("/debug/pprof/profile", boundedSeconds(http.HandlerFunc(pprof.Profile)))
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.Handle("/debug/pprof/trace", boundedSeconds(http.HandlerFunc(pprof.Trace)))
	}
	a.coll.RegisterAPI(mux)
	if e := a.enf.Load(); e != nil {
		if err := changeapi.Register(mux, a.cfg.Enforcement.APITokenFile, e, a.breaches); err != nil {
			a.log.Error("the change API is off: no token", "err", err)
		}
	}
	return mux
}

// markIdle tells the capped listener which connections wait for their
// peer's next request (new, or kept alive between requests): a full
// listener closes the oldest of them to admit a client that sends at once.
func markIdle(c net.Conn, state http.ConnState) {
	if lc, ok := c.(*connlimit.Conn); ok {
		lc.SetIdle(state == http.StateNew || state == http.StateIdle)
	}
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

// boundedSeconds refuses a profile that would run longer than maxProfile
// (profile, trace and the delta profiles take seconds=N), so one request
// cannot keep the agent profiling, and a connection open, for a day.
func boundedSeconds(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.FormValue("seconds"); v != "" {
			if sec, err := strconv.ParseFloat(v, 64); err != nil || !(sec <= maxProfile.Seconds()) {
				http.Error(w, "seconds: want at most "+strconv.Itoa(int(maxProfile.Seconds())), http.StatusBadRequest)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

var descRemoteBytes = prometheus.NewDesc("gpuwarden_remote_session_bytes_total",
	"Bytes of each remote session's TCP connection on this GPU node, as the kernel counts them (TLS records included; sent: acknowledged by the client). Same-node sessions have none.",
	[]string{"node", "uuid", "namespace", "pod", "container", "session", "path", "direction"}, nil)

// remoteTraffic serves the remote sessions' byte counters: read from
// their sockets at each scrape, whichever process carries their data.
type remoteTraffic struct {
	list func() []server.Traffic
	node string
}

func (r *remoteTraffic) Describe(ch chan<- *prometheus.Desc) { ch <- descRemoteBytes }

func (r *remoteTraffic) Collect(ch chan<- prometheus.Metric) {
	for _, t := range r.list() {
		for _, d := range []struct {
			name  string
			bytes uint64
		}{{"sent", t.Sent}, {"received", t.Received}} {
			ch <- prometheus.MustNewConstMetric(descRemoteBytes, prometheus.CounterValue, float64(d.bytes),
				r.node, t.GPU, t.ID.Namespace, t.ID.Pod, t.ID.Container, t.Session, t.Path, d.name)
		}
	}
}
