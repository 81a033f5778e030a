package collector

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// exposition keeps the last joined view's families encoded, per format: at
// a thousand containers, making, checking and encoding its 20,000 series
// costs more than the rest of a scrape, and a view served again
// (Collector.build) has the same series, so scrapes between joins write
// the same bytes.
type exposition struct {
	mu      sync.Mutex
	gen     uint64
	encoded map[expfmt.Format][]family
}

// family is one metric family, encoded.
type family struct {
	name string
	b    []byte
}

// encoded returns v's families encoded in format, encoding them on the
// first scrape of that view in that format.
func (c *Collector) encoded(v *View, format expfmt.Format) ([]family, error) {
	x := &c.exposed
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen != v.gen {
		x.gen, x.encoded = v.gen, map[expfmt.Format][]family{}
	}
	if fams, ok := x.encoded[format]; ok {
		return fams, nil
	}
	mfs, err := c.gather(v)
	if err != nil {
		return nil, err
	}
	out := make([]family, 0, len(mfs))
	for _, mf := range mfs {
		var b bytes.Buffer
		if err := expfmt.NewEncoder(&b, format).Encode(mf); err != nil {
			return nil, err
		}
		out = append(out, family{mf.GetName(), b.Bytes()})
	}
	x.encoded[format] = out
	return out, nil
}

// MetricsHandler serves /metrics as promhttp does (the same formats and
// negotiation, gzip, the `name[]` filter, an error as a 500): first the
// families of others (the agent's own process and Go runtime, gathered on
// each scrape), then the view's, encoded once per view joined. Their names
// do not overlap. OpenMetrics is not offered, so no trailer is written.
func (c *Collector) MetricsHandler(others prometheus.Gatherer, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		format := expfmt.NegotiateAccept(req.Header, expfmt.DefaultAcceptedFormats()...)
		mfs, err := others.Gather()
		var view []family
		if err == nil {
			view, err = c.encoded(c.View(req.Context()), format)
		}
		if err != nil {
			log.Error("error gathering metrics", "err", err)
			http.Error(w, "error gathering metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
		keep := func(string) bool { return true }
		if names := req.URL.Query()["name[]"]; len(names) > 0 {
			want := map[string]bool{}
			for _, n := range names {
				want[n] = true
			}
			keep = func(name string) bool { return want[name] }
		}
		h := w.Header()
		h.Add("Vary", "Accept")
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Type", string(format))
		var out io.Writer = w
		if acceptsGzip(req.Header.Get("Accept-Encoding")) {
			h.Set("Content-Encoding", "gzip")
			gz := gzips.Get().(*gzip.Writer)
			gz.Reset(w)
			defer func() {
				_ = gz.Close()
				gzips.Put(gz)
			}()
			out = gz
		}
		enc := expfmt.NewEncoder(out, format)
		for _, mf := range mfs {
			if keep(mf.GetName()) {
				err = errors.Join(err, enc.Encode(mf))
			}
		}
		for _, f := range view {
			if err == nil && keep(f.name) {
				_, err = out.Write(f.b)
			}
		}
		if err != nil {
			log.Debug("error sending metrics", "err", err) // most likely the scraper hung up
		}
	})
}

// gzips are writers at BestSpeed: a scrape's 2-3 MB of text compress to a
// tenth at the fastest level too.
var gzips = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return w
}}

// acceptsGzip says whether an Accept-Encoding value takes gzip (named, and
// not refused with q=0).
func acceptsGzip(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		coding, params, _ := strings.Cut(part, ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
		if !ok {
			return true
		}
		v, err := strconv.ParseFloat(q, 64)
		return err == nil && v > 0
	}
	return false
}
