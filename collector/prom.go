package collector

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemoryUsed, descMemoryLimit, descAllocFailures, descLaunches,
		descThrottled, descShare, descLimit, descUnenforced, descBreach, descDeviceMemTotal, descDeviceMemUsed, descDeviceUtil,
		descProbeEvents, descProbeLost, descBuildInfo, descSourceUp} {
		ch <- d
	}
}

// Collect emits the current view as const metrics: a container that is gone
// is simply not in the view, so its series disappear.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	v := c.View(context.Background())
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	for _, d := range v.Devices {
		l := []string{v.Node, strconv.Itoa(d.Index), d.UUID}
		ch <- prometheus.MustNewConstMetric(descDeviceMemTotal, gauge, float64(d.MemoryTotalBytes), l...)
		ch <- prometheus.MustNewConstMetric(descDeviceMemUsed, gauge, float64(d.MemoryUsedBytes), l...)
		ch <- prometheus.MustNewConstMetric(descDeviceUtil, gauge, d.Utilization, l...)
	}
	for _, e := range v.Containers {
		l := []string{e.Node, strconv.Itoa(e.GPU), e.UUID, e.Namespace, e.Pod, e.Container}
		ch <- prometheus.MustNewConstMetric(descMemoryUsed, gauge, float64(e.MemoryUsedBytes), l...)
		if e.MemoryLimitBytes > 0 {
			ch <- prometheus.MustNewConstMetric(descMemoryLimit, gauge, float64(e.MemoryLimitBytes), l...)
		}
		ch <- prometheus.MustNewConstMetric(descAllocFailures, counter, float64(e.AllocFailuresQuota), append(l, "quota")...)
		ch <- prometheus.MustNewConstMetric(descAllocFailures, counter, float64(e.AllocFailuresDevice), append(l, "device")...)
		ch <- prometheus.MustNewConstMetric(descLaunches, counter, e.Launches, l...)
		ch <- prometheus.MustNewConstMetric(descThrottled, counter, e.ThrottledSeconds, l...)
		ch <- prometheus.MustNewConstMetric(descShare, gauge, e.ComputeShare, l...)
		if e.ComputeLimit > 0 {
			ch <- prometheus.MustNewConstMetric(descLimit, gauge, e.ComputeLimit, l...)
		}
		ch <- prometheus.MustNewConstMetric(descUnenforced, gauge, boolFloat(e.Unenforced), l...)
		for _, b := range e.Breaches {
			ch <- prometheus.MustNewConstMetric(descBreach, gauge, 1, append(l, b.Reason)...)
		}
	}
	if v.probesOn {
		ch <- prometheus.MustNewConstMetric(descProbeEvents, counter, float64(v.probeEvents), v.Node)
		ch <- prometheus.MustNewConstMetric(descProbeLost, counter, float64(v.probeLost), v.Node)
	}
	for _, s := range v.Sources {
		ch <- prometheus.MustNewConstMetric(descSourceUp, gauge, boolFloat(s.OK), v.Node, s.Name)
	}
	ch <- prometheus.MustNewConstMetric(descBuildInfo, gauge, 1, c.version, goVersion())
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
