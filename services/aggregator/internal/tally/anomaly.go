package tally

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Anomaly detection.
//
// Three detectors run on every series (tenant × model and tenant × "*"):
//
//   - error_ratio: errors (outcome error or timeout, or status >= 500) over
//     calls, in tumbling windows of the tenant's breakers.error_ratio.window,
//     aligned to the Unix epoch in event time.
//   - slow_call: calls with latency_ms >= breakers.slow_call.slow_call_ms
//     over calls, in windows of breakers.slow_call.window.
//   - rate_spike: the settled tokens of the minute in progress against a
//     60-minute baseline (an exponential moving average of completed
//     minutes, idle minutes counting as zero).
//
// Each emits an anomaly signal with Attributes state=firing when its
// condition starts and state=resolved when it clears, on change only, with
// one exception that consumers rely on: while the condition persists a
// fresh firing signal is emitted once per window (per minute for
// rate_spike), as soon as the window qualifies, because the enforcer
// re-evaluates a half-open breaker on the next anomaly signal. Signal ids
// are built from detector, state, tenant, model and window start, so a
// replay produces the same ids.
//
// A window is judged when the first event of a later window arrives: a
// firing detector resolves when the window that closed did not qualify, or
// when an empty window lies between it and the new one. Events of an older
// window than the current one (late events) are left out: breakers look at
// the present.
//
// Probes. A half-open breaker is judged by its probes, not by the
// min_requests window it opened on: each gateway's Checker lets only
// half_open_probes requests through, so a fleet of fewer than
// min_requests/half_open_probes gateways never fills a window, and a
// window verdict would never come (or, worse, a "resolved" for too few
// calls would read as healthy). A settled event carrying attribute
// flags.ProbeAttribute (the gateway middleware sets it on probes) is,
// besides being counted as usual, a probe of both detectors of its
// series and of the tenant-wide one:
//
//   - a failed probe (the detector's bad condition) emits at once a
//     firing signal with Attributes probe=failed, at most one per second
//     per series and detector (the fleet sends a bounded number of
//     probes; a gateway that marks everything must not flood the topic);
//   - half_open_probes successful ones in a row, none more than a window
//     apart, emit a resolved signal with probe=passed.
//
// A probe the client abandoned (no outcome) says nothing. The enforcer
// acts on these only for a breaker that is half-open: any failed probe
// reopens it with a doubled open time, enough passed ones close it.
//
// Only settled events count: estimates are skipped (their settlement counts
// instead), because a rebuild from ClickHouse sees only the settlement and
// the detectors' state must replay identically. Rejected calls (the gateway
// refused them) are left out of error and slow-call ratios: they never
// reached the upstream whose health the breakers judge.

// Detector names, as carried in Attributes["detector"] and ["type"].
const (
	DetectorErrorRatio = "error_ratio"
	DetectorSlowCall   = "slow_call"
	DetectorRateSpike  = "rate_spike"
)

// spikeWarmup is how many completed minutes the baseline needs before a
// spike can be called: a tenant's first busy minutes are not a spike.
const spikeWarmup = 10

// baselineMinutes is the span the rate baseline averages over.
const baselineMinutes = 60

const (
	detErr = iota
	detSlow
)

var healthNames = [2]string{DetectorErrorRatio, DetectorSlowCall}

// healthWindow is one breaker detector's calls in the current window.
type healthWindow struct {
	start, end int64 // unix seconds; end 0: no window yet
	req, bad   int32
	fired      bool // a firing signal was emitted for this window
	firing     bool
}

// probeTally is one breaker detector's half-open probes of a series.
type probeTally struct {
	last     int64 // unix second of the latest probe counted
	failedAt int64 // unix second of the latest probe=failed signal
	passed   int32 // successful probes in a row since the last verdict
}

// spikeState is the rate-spike detector of a series.
type spikeState struct {
	min      int64 // unix minute being accumulated; 0: none yet
	tok      int64 // settled tokens of min
	req      int32 // settled requests of min
	minutes  int32 // completed minutes in the baseline, up to baselineMinutes
	baseline float64
	fired    bool // a firing signal was emitted for min
	firing   bool
}

// detect feeds one settled event to the anomaly detectors of s and of the
// tenant-wide series.
func (t *tenant) detect(s *Series, ev *schemas.UsageEvent, ts, offset int64, p *Partition) {
	br := &t.tp.Breakers
	health := ev.Outcome != schemas.OutcomeRejected
	isErr := ev.Outcome == schemas.OutcomeError || ev.Outcome == schemas.OutcomeTimeout || ev.Status >= 500
	slow := br.SlowCall.SlowCallMS > 0 && ev.LatencyMS >= br.SlowCall.SlowCallMS
	tok := ev.TotalTokens()
	// A probe whose client went away (no outcome) tells nothing about the
	// upstream.
	probe := health && ev.Outcome != "" && ev.Attributes[flags.ProbeAttribute] != ""
	for _, x := range [2]*Series{s, t.all} {
		if health {
			x.observeHealth(detErr, &br.ErrorRatio, isErr, ts, offset, p)
			x.observeHealth(detSlow, &br.SlowCall, slow, ts, offset, p)
		}
		if probe {
			x.observeProbe(detErr, &br.ErrorRatio, isErr, ts, offset, p)
			x.observeProbe(detSlow, &br.SlowCall, slow, ts, offset, p)
		}
		x.observeSpike(tok, ts, offset, p)
	}
}

// observeProbe counts one half-open probe of detector d and emits the
// verdict it completes (see "Probes" above).
func (s *Series) observeProbe(d int, bp *policy.BreakerPolicy, bad bool, ts, offset int64, p *Partition) {
	if bp.Threshold <= 0 {
		return
	}
	pr := &s.probes[d]
	width := int64(bp.Window / time.Second)
	if width < 1 {
		width = 60
	}
	if ts < pr.last {
		return // late: the verdict it belonged to is made
	}
	if ts-pr.last > width {
		pr.passed = 0 // successes of an earlier half-open round
	}
	pr.last = ts
	start := floorDiv(ts, width) * width
	if bad {
		pr.passed = 0
		if pr.failedAt == ts {
			return
		}
		pr.failedAt = ts
		s.probeSignal(d, bp, false, 1, start, start+width, ts, offset, p)
		return
	}
	pr.passed++
	if int(pr.passed) >= bp.HalfOpenProbes {
		s.probeSignal(d, bp, true, pr.passed, start, start+width, ts, offset, p)
		pr.passed = 0
	}
}

// probeSignal emits a probe verdict of detector d: failed (firing, ratio
// 1 over the one probe) or passed (resolved, ratio 0 over n probes). Its
// period is the detector's window holding the probe, which the enforcer's
// staleness check reads; its id carries the probe's second, so a replay
// produces the same ids.
func (s *Series) probeSignal(d int, bp *policy.BreakerPolicy, passed bool, n int32, start, end, ts, offset int64, p *Partition) {
	name := healthNames[d]
	verdict, ratio := "failed", 1.0
	reason := "a half-open probe failed (" + name + "): the breaker reopens"
	if passed {
		verdict, ratio = "passed", 0
		reason = strconv.Itoa(int(n)) + " half-open probes in a row succeeded (" + name + "): the breaker closes"
	}
	sig := s.anomalySignal(name, !passed, start, end, ratio, int64(n), bp.Threshold, ts, offset, reason)
	sig.ID = schemas.SignalID(string(schemas.SignalAnomaly), s.t.id, s.model, name, "probe_"+verdict, time.Unix(ts, 0).UTC().Format(time.RFC3339))
	sig.Attributes["breaker"] = name
	sig.Attributes["probe"] = verdict
	sig.Attributes["half_open_probes"] = strconv.Itoa(bp.HalfOpenProbes)
	sig.Attributes["window"] = (time.Duration(end-start) * time.Second).String()
	p.emit(sig)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ratioOf(bad, req int32) float64 {
	if req <= 0 {
		return 0
	}
	return float64(bad) / float64(req)
}

func (s *Series) observeHealth(d int, bp *policy.BreakerPolicy, bad bool, ts, offset int64, p *Partition) {
	if bp.Threshold <= 0 {
		return
	}
	width := int64(bp.Window / time.Second)
	if width < 1 {
		width = 60
	}
	h := &s.health[d]
	start := floorDiv(ts, width) * width
	if h.end != 0 && ts < h.start {
		return // late: breakers look at the present
	}
	if h.end == 0 || ts >= h.end {
		if h.firing {
			qualified := int(h.req) >= bp.MinRequests && ratioOf(h.bad, h.req) >= bp.Threshold
			switch {
			case !qualified:
				s.healthSignal(d, bp, false, h.start, h.end, ratioOf(h.bad, h.req), h.req, ts, offset, p)
				h.firing = false
			case start > h.end:
				// An empty window lies between: the condition did not hold there.
				s.healthSignal(d, bp, false, h.end, h.end+(h.end-h.start), 0, 0, ts, offset, p)
				h.firing = false
			}
		}
		*h = healthWindow{start: start, end: start + width, firing: h.firing}
	}
	h.req++
	if bad {
		h.bad++
	}
	if !h.fired && int(h.req) >= bp.MinRequests && ratioOf(h.bad, h.req) >= bp.Threshold {
		h.fired, h.firing = true, true
		s.healthSignal(d, bp, true, h.start, h.end, ratioOf(h.bad, h.req), h.req, ts, offset, p)
	}
}

func (s *Series) healthSignal(d int, bp *policy.BreakerPolicy, firing bool, start, end int64, ratio float64, req int32, ts, offset int64, p *Partition) {
	name := healthNames[d]
	what := "error ratio"
	if d == detSlow {
		what = "slow-call ratio (latency >= " + strconv.FormatInt(bp.SlowCallMS, 10) + "ms)"
	}
	r := strconv.FormatFloat(ratio, 'f', 3, 64)
	th := strconv.FormatFloat(bp.Threshold, 'g', -1, 64)
	win := time.Duration(end-start) * time.Second
	reason := what + " " + r + " over " + strconv.Itoa(int(req)) + " calls in the " + win.String() + " window reached the threshold " + th
	if !firing {
		reason = what + " back below the threshold " + th + " (" + r + " over " + strconv.Itoa(int(req)) + " calls, at least " + strconv.Itoa(bp.MinRequests) + " needed)"
	}
	sig := s.anomalySignal(name, firing, start, end, ratio, int64(req), bp.Threshold, ts, offset, reason)
	sig.Attributes["breaker"] = name
	sig.Attributes["min_requests"] = strconv.Itoa(bp.MinRequests)
	sig.Attributes["window"] = win.String()
	p.emit(sig)
}

func (s *Series) anomalySignal(detector string, firing bool, start, end int64, ratio float64, requests int64, threshold float64, ts, offset int64, reason string) schemas.Signal {
	state := "resolved"
	if firing {
		state = "firing"
	}
	ps := time.Unix(start, 0).UTC()
	return schemas.Signal{
		ID:          schemas.SignalID(string(schemas.SignalAnomaly), s.t.id, s.model, detector, state, ps.Format(time.RFC3339)),
		Kind:        schemas.SignalAnomaly,
		Time:        time.Unix(ts, 0).UTC(),
		Tenant:      s.t.id,
		Model:       s.model,
		PeriodStart: ps,
		PeriodEnd:   time.Unix(end, 0).UTC(),
		Used:        ratio,
		Limit:       threshold,
		Reason:      reason,
		Source:      schemas.SignalSource{FromOffset: offset, ToOffset: offset},
		Attributes: map[string]string{
			"detector":  detector,
			"type":      detector,
			"state":     state,
			"ratio":     strconv.FormatFloat(ratio, 'g', -1, 64),
			"requests":  strconv.FormatInt(requests, 10),
			"threshold": strconv.FormatFloat(threshold, 'g', -1, 64),
		},
	}
}

func (p *Partition) isSpike(tok int64, baseline float64, minutes int32) bool {
	return minutes >= spikeWarmup && baseline > 0 && tok >= p.opt.SpikeMinTokens && float64(tok) > p.opt.SpikeMultiplier*baseline
}

func (s *Series) observeSpike(tok, ts, offset int64, p *Partition) {
	if p.opt.SpikeMultiplier <= 0 {
		return
	}
	sp := &s.spike
	m := floorDiv60(ts)
	if sp.min != 0 && m < sp.min {
		return // late
	}
	if sp.min == 0 {
		sp.min = m
	}
	if m > sp.min {
		gap := m - sp.min
		if sp.firing {
			switch {
			case !p.isSpike(sp.tok, sp.baseline, sp.minutes):
				s.spikeSignal(false, sp.min, sp.tok, sp.req, sp.baseline, ts, offset, p)
				sp.firing = false
			case gap > 1:
				s.spikeSignal(false, sp.min+1, 0, 0, sp.baseline, ts, offset, p)
				sp.firing = false
			}
		}
		// Fold the completed minute and the idle ones after it into the
		// baseline; after an idle hour start over, as the predictor does.
		if gap > baselineMinutes {
			sp.baseline, sp.minutes = 0, 0
		} else {
			sp.observe(float64(sp.tok))
			for i := int64(1); i < gap; i++ {
				sp.observe(0)
			}
		}
		sp.min, sp.tok, sp.req, sp.fired = m, 0, 0, false
	}
	sp.tok += tok
	sp.req++
	if !sp.fired && p.isSpike(sp.tok, sp.baseline, sp.minutes) {
		sp.fired, sp.firing = true, true
		s.spikeSignal(true, sp.min, sp.tok, sp.req, sp.baseline, ts, offset, p)
	}
}

// observe adds one completed minute to the baseline: the mean while fewer
// than baselineMinutes were seen, then an exponential moving average with
// that span.
func (sp *spikeState) observe(v float64) {
	if sp.minutes < baselineMinutes {
		sp.minutes++
	}
	sp.baseline += (v - sp.baseline) / float64(sp.minutes)
}

func (s *Series) spikeSignal(firing bool, minute, tok int64, req int32, baseline float64, ts, offset int64, p *Partition) {
	ratio := 0.0
	if baseline > 0 {
		ratio = float64(tok) / baseline
	}
	k := p.opt.SpikeMultiplier
	cur := strconv.FormatInt(tok, 10)
	base := strconv.FormatFloat(baseline, 'f', 1, 64)
	reason := "token rate " + cur + "/min is " + strconv.FormatFloat(ratio, 'f', 1, 64) + "x the 60-minute baseline of " + base + "/min (spike at " + strconv.FormatFloat(k, 'g', -1, 64) + "x)"
	if !firing {
		reason = "token rate back to " + cur + "/min against a baseline of " + base + "/min"
	}
	sig := s.anomalySignal(DetectorRateSpike, firing, minute*60, minute*60+60, ratio, int64(req), k, ts, offset, reason)
	sig.Rate = float64(tok)
	sig.Unit = schemas.UnitTokens
	sig.Attributes["tokens_per_minute"] = cur
	sig.Attributes["baseline_tokens_per_minute"] = base
	sig.Attributes["min_tokens"] = strconv.FormatInt(p.opt.SpikeMinTokens, 10)
	p.emit(sig)
}
