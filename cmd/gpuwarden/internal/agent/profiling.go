package agent

import (
	"github.com/grafana/pyroscope-go"
)

// startProfiling sends continuous profiles of the agent to a Pyroscope
// server when one is configured; it is off by default.
func (a *Agent) startProfiling(node string) {
	addr := a.cfg.Profiling.PyroscopeServer
	if addr == "" {
		return
	}
	p, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: "gpuwarden.agent",
		ServerAddress:   addr,
		Tags:            map[string]string{"node": node, "version": a.version},
		ProfileTypes: []pyroscope.ProfileType{pyroscope.ProfileCPU, pyroscope.ProfileAllocObjects,
			pyroscope.ProfileAllocSpace, pyroscope.ProfileInuseObjects, pyroscope.ProfileInuseSpace,
			pyroscope.ProfileGoroutines},
	})
	a.parts.set("profiling", true, err)
	if err != nil {
		a.log.Error("continuous profiling unavailable", "server", addr, "err", err)
		return
	}
	a.log.Info("profiling to pyroscope", "server", addr)
	a.closers = append(a.closers, p.Stop)
}
