# deploy/build.mk: the Helm chart's tests (included by the top Makefile).
# They are a Go module of their own (deploy/helm/chart_test), so Helm's
# dependency tree stays out of the agent's go.mod; `go test ./...` from the
# root does not enter nested modules, so `make test` runs them through
# TEST_EXTRA. The device plugin's tests are in the root module
# (go test ./deploy/...).

##@ Deploy

.PHONY: chart-test
chart-test: $(BIN)/gpuwarden ## Lint and render the Helm chart with Helm's Go packages; decode every object strictly
	cd deploy/helm/chart_test && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

TEST_EXTRA += chart-test
