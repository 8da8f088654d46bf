package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The metrics the pipeline page reads, as the services export them.
const (
	metricIngestEvents  = "sluice_ingest_events_total"         // counter, result="accepted"
	metricConsumerLag   = "sluice_aggregator_consumer_lag"     // gauge per partition
	metricFlushSeconds  = "sluice_aggregator_write_seconds"    // histogram
	metricSignalLag     = "sluice_enforcer_signal_lag_seconds" // histogram
	metricCountedEvents = "sluice_aggregator_events_total"     // counter, result="counted"
	metricFlagWriteErrs = "sluice_enforcer_flag_write_errors_total"
)

// sample is one reading of the metrics: counter and gauge sums and
// histograms, by metric name (and label value where it matters).
type sample struct {
	at    time.Time
	sums  map[string]float64
	hists map[string]hist
	// complete is false when an endpoint could not be read: its counters
	// are missing, so no rate is taken across this sample.
	complete bool
}

// hist is a cumulative histogram: upper bounds ascending, counts
// cumulative, plus the total count and sum.
type hist struct {
	bounds []float64
	counts []float64
	count  float64
	sum    float64
}

// sampler reads the metrics every interval and keeps the last max samples
// (a ring: the oldest is dropped first), from which the pipeline page
// derives rates and latencies.
type sampler struct {
	urls     []string
	gatherer prometheus.Gatherer
	hc       *http.Client
	max      int

	mu      sync.Mutex
	samples []sample
	lastErr string
}

func newSampler(urls []string, g prometheus.Gatherer, maxN int) *sampler {
	return &sampler{urls: urls, gatherer: g, hc: &http.Client{Timeout: 5 * time.Second}, max: maxN}
}

func (s *sampler) run(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sampleOnce(ctx, log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sampler) sampleOnce(ctx context.Context, log *slog.Logger) {
	fams, err := s.gather(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.lastErr != err.Error() {
			log.Warn("console: reading the pipeline metrics failed", "err", err)
		}
		s.lastErr = err.Error()
	} else {
		s.lastErr = ""
	}
	if len(fams) == 0 {
		return
	}
	sm := reduce(fams, time.Now())
	sm.complete = err == nil
	s.samples = append(s.samples, sm)
	if len(s.samples) > s.max {
		s.samples = append(s.samples[:0], s.samples[len(s.samples)-s.max:]...)
	}
}

// gather reads every configured endpoint, or the process's own registry.
func (s *sampler) gather(ctx context.Context) ([]*dto.MetricFamily, error) {
	if len(s.urls) == 0 {
		if s.gatherer == nil {
			return nil, fmt.Errorf("no services.console.metrics_urls and no metrics in this process")
		}
		return s.gatherer.Gather()
	}
	var out []*dto.MetricFamily
	var firstErr error
	for _, u := range s.urls {
		fams, err := s.scrape(ctx, u)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, fams...)
	}
	return out, firstErr
}

// maxScrapeBytes bounds what one endpoint's answer may take.
const maxScrapeBytes = 16 << 20

func (s *sampler) scrape(ctx context.Context, u string) ([]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	out := make([]*dto.MetricFamily, 0, len(m))
	for _, f := range m {
		out = append(out, f)
	}
	return out, nil
}

// reduce keeps what the page needs of a gather.
func reduce(fams []*dto.MetricFamily, at time.Time) sample {
	// A counter not exported yet (a vector with no child) has counted
	// nothing: 0, so that the first events after a start show as a rate.
	sm := sample{at: at, sums: map[string]float64{metricIngestEvents: 0, metricCountedEvents: 0}, hists: map[string]hist{}}
	for _, f := range fams {
		name := f.GetName()
		switch name {
		case metricIngestEvents, metricCountedEvents:
			want := "accepted"
			if name == metricCountedEvents {
				want = "counted"
			}
			for _, m := range f.GetMetric() {
				if label(m, "result") == want {
					sm.sums[name] += m.GetCounter().GetValue()
				}
			}
		case metricConsumerLag:
			for _, m := range f.GetMetric() {
				sm.sums[name] += m.GetGauge().GetValue()
			}
		case metricFlagWriteErrs:
			for _, m := range f.GetMetric() {
				sm.sums[name] += m.GetCounter().GetValue()
			}
		case metricFlushSeconds, metricSignalLag:
			h := sm.hists[name]
			for _, m := range f.GetMetric() {
				h = h.add(m.GetHistogram())
			}
			sm.hists[name] = h
		}
	}
	return sm
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// add merges a scraped histogram (several endpoints export the same one).
func (h hist) add(d *dto.Histogram) hist {
	if d == nil {
		return h
	}
	idx := map[float64]int{}
	for i, b := range h.bounds {
		idx[b] = i
	}
	for _, b := range d.GetBucket() {
		ub := b.GetUpperBound()
		i, ok := idx[ub]
		if !ok {
			h.bounds = append(h.bounds, ub)
			h.counts = append(h.counts, 0)
			i = len(h.bounds) - 1
			idx[ub] = i
		}
		h.counts[i] += float64(b.GetCumulativeCount())
	}
	// Keep bounds ascending (merging may have appended out of order).
	order := make([]int, len(h.bounds))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return h.bounds[order[a]] < h.bounds[order[b]] })
	nb, nc := make([]float64, len(order)), make([]float64, len(order))
	for i, o := range order {
		nb[i], nc[i] = h.bounds[o], h.counts[o]
	}
	h.bounds, h.counts = nb, nc
	h.count += float64(d.GetSampleCount())
	h.sum += d.GetSampleSum()
	return h
}

// delta returns b minus a (the observations between two samples); a
// counter reset (a restart) gives b whole.
func (b hist) delta(a hist) hist {
	if a.count > b.count || len(a.bounds) != len(b.bounds) {
		return b
	}
	d := hist{bounds: b.bounds, counts: make([]float64, len(b.counts)), count: b.count - a.count, sum: b.sum - a.sum}
	for i := range b.counts {
		d.counts[i] = b.counts[i] - a.counts[i]
	}
	return d
}

// span writes the time the samples span, for a tile's caption.
func span(samples []sample) string {
	if len(samples) < 2 {
		return "0s"
	}
	return samples[len(samples)-1].at.Sub(samples[0].at).Round(time.Second).String()
}

// quantile estimates the q-quantile by linear interpolation inside the
// bucket that holds it, as Prometheus's histogram_quantile does; NaN when
// there are no observations.
func (h hist) quantile(q float64) float64 {
	if h.count <= 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, prev := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			inBucket := h.counts[i] - prev
			if inBucket <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-prev)/inBucket
		}
		lower, prev = ub, h.counts[i]
	}
	return lower
}

// snapshot returns a copy of the samples and the last error.
func (s *sampler) snapshot() ([]sample, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...), s.lastErr
}
