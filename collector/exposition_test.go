package collector

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// TestMetricsHandlerServesBothGatherers: /metrics carries the agent's own
// families and the view's, in the format and encoding the scraper asks
// for, the view's encoded once per view joined; name[] filters.
func TestMetricsHandlerServesBothGatherers(t *testing.T) {
	used := uint64(1 << 30)
	c := New("node", "test", Sources{NVML: func() ([]nvmldev.Device, error) {
		return []nvmldev.Device{{Index: 0, UUID: "GPU-0", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: used}}, nil
	}}, slog.New(slog.DiscardHandler))
	c.maxAge = 0
	own := prometheus.NewRegistry()
	own.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuwarden_agent_test_gauge", Help: "A test gauge."},
		func() float64 { return 7 }))
	srv := httptest.NewServer(c.MetricsHandler(own, slog.New(slog.DiscardHandler)))
	defer srv.Close()

	scrape := func(query string, header http.Header) (http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest("GET", srv.URL+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		tr := &http.Transport{DisableCompression: true} // see the body as sent
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			if body, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		b, err := io.ReadAll(body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape: %v, status %d: %s", err, resp.StatusCode, b)
		}
		return resp.Header, b
	}
	text := func(b []byte) map[string]*dto.MetricFamily {
		t.Helper()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("the exposition does not parse: %v\n%s", err, b)
		}
		return fams
	}

	h, plain := scrape("", http.Header{})
	fams := text(plain)
	if h.Get("Content-Encoding") != "" || fams["gpuwarden_agent_test_gauge"] == nil ||
		fams["gpuwarden_device_memory_used_bytes"].GetMetric()[0].GetGauge().GetValue() != float64(used) {
		t.Fatalf("plain scrape (encoding %q): %v", h.Get("Content-Encoding"), fams)
	}
	encodedOnce := &c.exposed.encoded[expfmt.Format(h.Get("Content-Type"))][0]
	h, zipped := scrape("", http.Header{"Accept-Encoding": {"gzip"}})
	if &c.exposed.encoded[expfmt.Format(h.Get("Content-Type"))][0] != encodedOnce {
		t.Error("the view's families were encoded again for a view served again")
	}
	if h.Get("Content-Encoding") != "gzip" || !bytes.Equal(zipped, plain) {
		t.Errorf("gzip scrape: encoding %q, same body %v", h.Get("Content-Encoding"), bytes.Equal(zipped, plain))
	}
	if h, _ := scrape("", http.Header{"Accept-Encoding": {"gzip;q=0, identity"}}); h.Get("Content-Encoding") != "" {
		t.Error("gzip refused with q=0, yet sent")
	}

	// Protobuf, as Prometheus asks for it by default.
	h, pb := scrape("", http.Header{"Accept": {"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"}})
	dec := expfmt.NewDecoder(bytes.NewReader(pb), expfmt.Format(h.Get("Content-Type")))
	names := map[string]bool{}
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("protobuf (%s): %v", h.Get("Content-Type"), err)
		}
		names[mf.GetName()] = true
	}
	if !names["gpuwarden_agent_test_gauge"] || !names["gpuwarden_device_memory_used_bytes"] || len(names) != len(fams) {
		t.Errorf("protobuf families %v, text %d", names, len(fams))
	}

	// name[] keeps the named families alone.
	_, only := scrape("?name[]=gpuwarden_device_memory_used_bytes&name[]=gpuwarden_agent_test_gauge", http.Header{})
	if got := text(only); len(got) != 2 || got["gpuwarden_device_memory_used_bytes"] == nil {
		t.Errorf("name[] filter: %d families", len(got))
	}

	// A new view is encoded again: the scrape shows what it shows.
	used = 2 << 30
	if v := text(func() []byte { _, b := scrape("", http.Header{}); return b }())["gpuwarden_device_memory_used_bytes"].GetMetric()[0].GetGauge().GetValue(); v != float64(used) {
		t.Errorf("after the device changed, the scrape shows %v bytes used, want %d", v, used)
	}
}
