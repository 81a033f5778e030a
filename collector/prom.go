package collector

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// gather checks a view's metrics, in a registry of their own, and gathers
// them.
func (c *Collector) gather(v *View) ([]*dto.MetricFamily, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(viewMetrics{c, v}); err != nil {
		return nil, err
	}
	return reg.Gather()
}

// viewMetrics are one view's metrics: a prometheus.Collector whose metrics
// are gone with the container when it leaves the view.
type viewMetrics struct {
	c *Collector
	v *View
}

func (m viewMetrics) Describe(ch chan<- *prometheus.Desc) { m.c.Describe(ch) }

func (m viewMetrics) Collect(ch chan<- prometheus.Metric) { m.c.metrics(m.v, ch) }

// Describe sends the description of every metric the collector serves.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemoryUsed, descMemoryLimit, descAllocFailures, descLaunches,
		descThrottled, descDeviceMismatches, descShare, descLimit, descScheduled, descScheduledSeconds, descUnenforced, descBreach, descDeviceMemTotal, descDeviceMemUsed, descDeviceUtil,
		descProbeEvents, descProbeLost, descBuildInfo, descSourceUp} {
		ch <- d
	}
}

// metrics emits a view's metrics.
func (c *Collector) metrics(v *View, ch chan<- prometheus.Metric) {
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
		if e.LaunchesExact {
			ch <- prometheus.MustNewConstMetric(descDeviceMismatches, counter, float64(e.DeviceMismatches), l...)
		}
		ch <- prometheus.MustNewConstMetric(descShare, gauge, e.ComputeShare, l...)
		if e.ComputeLimit > 0 {
			ch <- prometheus.MustNewConstMetric(descLimit, gauge, e.ComputeLimit, l...)
		}
		if e.Scheduled { // a claimed limit no scheduler holds has no measure: no series, not a 0
			ch <- prometheus.MustNewConstMetric(descScheduled, gauge, e.ScheduledShare, l...)
			ch <- prometheus.MustNewConstMetric(descScheduledSeconds, counter, e.ScheduledSeconds, l...)
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
