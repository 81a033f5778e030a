# dashboards/build.mk: Grafana dashboards, Prometheus rules and their tests
# (included by the top Makefile). The tests run in `make test` (go test
# ./dashboards/...): promtool check/test rules, and an end-to-end test with a
# real Prometheus server; both come from Debian's prometheus package.
DEPS_TEST += prometheus

##@ Dashboards

.PHONY: dashboards-check
dashboards-check: deps-test ## Check the alert rules with promtool (rules and their unit tests)
	promtool check rules dashboards/alerts/gpuwarden.rules.yml
	cd dashboards/alerts && promtool test rules gpuwarden.rules.test.yml
