// Package collector joins what the agent knows about each container's use
// of each GPU — the eBPF view, the interposer's ledgers, NVML — into one
// view, served as Prometheus metrics and as the JSON API `gpuwarden smi` reads.
package collector

import "github.com/prometheus/client_golang/prometheus"

// Namespace prefixes every metric name.
const Namespace = "gpuwarden"

// ContainerLabels label every container-level series: gpu is NVML's index of
// the physical GPU (NoGPU, -1: one whose UUID the ledger does not record),
// uuid its UUID.
var ContainerLabels = []string{"node", "gpu", "uuid", "namespace", "pod", "container"}

// DeviceLabels label every device-level series.
var DeviceLabels = []string{"node", "gpu", "uuid"}

func containerDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "container", name), help,
		append(append([]string{}, ContainerLabels...), extra...), nil)
}

func deviceDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "device", name), help, DeviceLabels, nil)
}

// The metrics the agent serves (docs/metrics.md), defined once here; dashboards and alerts are
// tested against what the agent really exports.
var (
	descMemoryUsed = containerDesc("gpu_memory_used_bytes",
		"GPU memory the container holds on the device, observed by eBPF (NVML's per-process memory where eBPF is off).")
	descMemoryLimit = containerDesc("gpu_memory_limit_bytes",
		"The container's GPU memory quota on the device; absent when it has none.")
	descAllocFailures = containerDesc("gpu_memory_alloc_failures_total",
		"Allocations refused: reason=quota by the interposer (over the container's quota), reason=device by the driver.", "reason")
	descLaunches = containerDesc("kernel_launches_total",
		"Kernel launches: exact from the interposer's ledger; counted by eBPF probes for containers without it (sampled before Linux 6.6).")
	descThrottled = containerDesc("throttled_seconds_total",
		"Time the container's launches waited for the enforcer's launch budget.")
	descDeviceMismatches = containerDesc("device_mismatches_total",
		"Launches the interposer counted on the wrong device, found when it checks its context hooks against the driver (one gated launch in 1024 on several GPUs): a context made current behind them. Container-wide, on its first GPU.")
	descShare = containerDesc("compute_share_ratio",
		"Share of the device's time the container used over the last sampling window (NVML), 0-1.")
	descLimit = containerDesc("compute_limit_ratio",
		"The container's target share of the device's time, 0-1; absent when it has none.")
	descScheduled = containerDesc("scheduled_share_ratio",
		"Share of the device's time the enforcer's scheduler measured the container take over about the last second, 0-1: on its own clock where it gates the container's launches (what it holds to compute_limit_ratio), NVML's where it does not; absent when no scheduler holds the container to a target.")
	descScheduledSeconds = containerDesc("scheduled_seconds_total",
		"Device time the enforcer's scheduler charged the container on its own clock (each slice from its start until the work launched in it ran); its rate over a window is the container's share on that clock. Absent when no scheduler holds the container to a target.")
	descUnenforced = containerDesc("unenforced",
		"1 while the container is in breach: GPU activity seen without the interposer, or what the node saw contradicts its ledger; else 0.")
	descBreach = containerDesc("breach",
		"1 for each reason the container is in breach, while it is: bypass, over_limit, over_ledger, unledgered_process, bad_ledger, false_claim, over_share; absent otherwise.", "reason")

	descDeviceMemTotal = deviceDesc("memory_total_bytes", "The device's memory.")
	descDeviceMemUsed  = deviceDesc("memory_used_bytes", "Memory in use on the device, all processes.")
	descDeviceUtil     = deviceDesc("utilization_ratio", "Share of time the device was busy over the last sampling window, 0-1.")

	descProbeEvents = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "agent", "probe_events_total"),
		"eBPF probe hits of every kind.", []string{"node"}, nil)
	descProbeLost = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "agent", "probe_lost_events_total"),
		"Failed-allocation events the eBPF ring buffer dropped.", []string{"node"}, nil)
	descBuildInfo = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "build_info"),
		"The agent's version; always 1.", []string{"version", "goversion"}, nil)
	descSourceUp = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "scrape", "collector_success"),
		"1 if the source answered this scrape, 0 if it failed; sources that are switched off are absent.",
		[]string{"node", "collector"}, nil)
)
