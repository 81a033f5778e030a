package agent

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/gpuwarden/gpuwarden/enforcer/connlimit"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/admission"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/server"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// startRemote serves remote GPU sessions when the remote part is on, and
// returns the collector's source of their labels: a session's cgroup is
// labelled with its client's namespace, pod and container, from its
// certificate. nil when the part is off or down.
func (a *Agent) startRemote(cgroupFS, node string) func(string) (string, string, string, bool) {
	if !a.cfg.Remote.Enabled {
		return nil
	}
	srv, err := a.remoteServer(cgroupFS, node)
	a.parts.set("remote", true, err)
	if err != nil {
		a.log.Error("remote GPU sessions not served", "err", err)
		return nil
	}
	a.closers = append(a.closers, srv.Close)
	a.refused["remote"] = srv.Refused
	a.remoteTraffic = &remoteTraffic{list: srv.Traffic, node: node}
	a.serving = true
	a.log.Info("serving remote GPU sessions", "address", srv.Addr())
	a.checkKernelTLS()
	return func(path string) (string, string, string, bool) {
		id, ok := srv.Label(path)
		return id.Namespace, id.Pod, id.Container, ok
	}
}

func (a *Agent) remoteServer(cgroupFS, node string) (*server.Server, error) {
	r := a.cfg.Remote
	tlsConf, err := pki.ServerConfig(pki.Files{Cert: r.Cert, Key: r.Key, CA: r.CA})
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	beside := func(set, name string) string {
		if set != "" {
			return set
		}
		return filepath.Join(filepath.Dir(exe), name)
	}
	rules := admission.Rules{SessionsPerClient: r.MaxSessionsPerClient, HighPriority: r.HighPriority}
	relayed, err := session.ParseDataPath(r.DataPath)
	if err != nil {
		return nil, err
	}
	return server.Start(server.Config{
		Listen: r.Listen, TLS: tlsConf, Timeout: r.Timeout, Node: node, Log: a.log, Admission: rules, Relayed: relayed,
		LocalSocket: a.localSocket(),
		Limits:      connlimit.Limits{Total: r.MaxConnections, PerSource: r.MaxConnectionsPerSource},
		Devices:     a.remoteDevices,
		Worker: server.Worker{Path: beside(r.Worker, "gpuwarden-worker"), Interposer: beside(r.Interposer, "libgpuwarden.so"),
			ControlDir: a.cfg.ControlDir, CgroupFS: cgroupFS, CgroupParent: r.CgroupParent, Env: os.Environ()},
	})
}

// checkKernelTLS says once where handed-over sessions' records will be
// sealed: in the kernel (kernel TLS) or by the client library and the
// worker. The check loads the tls module, which a tenant's client library
// cannot.
func (a *Agent) checkKernelTLS() {
	a.kernelTLS.Do(func() {
		if err := handover.KernelTLS(); err != nil {
			a.log.Info("remote: kernel TLS unavailable: handed-over sessions seal their records in user space", "why", err)
			return
		}
		a.log.Info("remote: kernel TLS available: handed-over sessions' records are sealed by the kernel")
	})
}

// localSocket is where clients on this node (its own relay, `gpuwarden
// run --local-socket`) reach its remote sessions without the network.
func (a *Agent) localSocket() string { return filepath.Join(a.cfg.ControlDir, session.LocalSocket) }

// remoteDevices is the node's GPUs as NVML reads them.
func (a *Agent) remoteDevices() ([]session.Device, error) {
	if a.nvml == nil {
		return nil, errors.New("NVML is not available on this node")
	}
	devs, err := a.nvml.Devices()
	if err != nil {
		return nil, err
	}
	out := make([]session.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, session.Device{Index: d.Index, UUID: d.UUID, Name: d.Name,
			TotalBytes: d.MemoryTotalBytes, UsedBytes: d.MemoryUsedBytes})
	}
	return out, nil
}
