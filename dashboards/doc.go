// Package dashboards holds no Go code: it is gpuwarden's Grafana dashboards
// (grafana/*.json), Prometheus alert and recording rules
// (alerts/gpuwarden.rules.yml, with promtool unit tests) and the alerts'
// runbooks (runbooks/). Its tests check them against what the agent really
// exports, with promtool, and end to end against a real Prometheus server
// scraping a real agent on simgpu.
package dashboards
