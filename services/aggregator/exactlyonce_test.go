package aggregator_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/truthcheck"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

const itPolicy = `
defaults:
  timezone: Asia/Kolkata
  alert_tiers: [70, 90, 100]
  budget: {amount: 0.2, currency: USD}
  breakers:
    error_ratio: {threshold: 0.5, min_requests: 5, window: 5m}
    slow_call:   {threshold: 0.5, slow_call_ms: 10000, min_requests: 5, window: 5m}
  models:
    "*": {hourly_tokens: 60000, daily_tokens: 250000, tokens_per_minute: 12000}
    m0: {monthly_tokens: 100000}
tenants:
  t3:
    timezone: America/New_York
prices:
  - {model: m0, currency: USD, effective_from: 2020-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
`

type env struct {
	kafka   kafkaconn.Config
	ch      chconn.Config
	conn    driver.Conn
	topic   string
	signals string
	admin   string
	group   string
	policy  string
	adm     *kadm.Client
	cl      *kgo.Client
}

// integrationEnv is how a test against the real broker and ClickHouse
// starts: it skips the test in -short mode, sets up its topics and
// database (setup) and, unless policy is empty, writes policy over setup's
// itPolicy as the aggregator's policy file.
func integrationEnv(t testing.TB, policy string) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test")
	}
	e := setup(t)
	if policy != "" {
		writePolicy(t, e.policy, policy)
	}
	return e
}

func setup(t testing.TB) *env {
	t.Helper()
	e := &env{kafka: itest.Kafka(t), ch: itest.ClickHouse(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := chconn.Open(ctx, e.ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := migrations.Apply(ctx, conn, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	e.topic, e.signals, e.group = itest.Unique(t, "usage_"), itest.Unique(t, "signals_"), itest.Unique(t, "agg_")
	e.admin = itest.Unique(t, "admin_")
	e.policy = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(e.policy, []byte(itPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	cl, err := kafkaconn.NewClient(e.kafka, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl, e.adm = cl, kadm.NewClient(cl)
	if err := kafkaconn.EnsureTopics(ctx, cl, e.kafka, e.topic, e.signals); err != nil {
		t.Fatal(err)
	}
	return e
}

// workload returns n events in send order: 20 tenants, 3 models, one event
// per second of event time; every 20th a re-sent earlier event, every 15th
// an estimate settled 40 events later, every 50th two hours late and every
// 70th an hour late. Tenant t7 falls silent for 2.5 hours (its partition
// evicts it, then restores it), phases of errors and slow calls open the
// breakers, and t5 spikes for two minutes. final maps tenant/id to the
// tokens that must count.
func workload(n int, base time.Time) (evs []schemas.UsageEvent, final map[string]int64) {
	final = map[string]int64{}
	orig := make([]schemas.UsageEvent, 0, n)
	for i := 0; i < n; i++ {
		e := schemas.UsageEvent{
			ID:               fmt.Sprintf("ev-%06d", i),
			Time:             base.Add(time.Duration(i) * time.Second),
			Tenant:           fmt.Sprintf("t%d", i%20),
			Model:            fmt.Sprintf("m%d", (i/20)%3),
			PromptTokens:     int64(100 + (i*37)%500),
			CompletionTokens: int64((i * 53) % 300),
			LatencyMS:        int64((i * 97) % 15000),
		}
		if e.Tenant == "t7" && i >= 2000 && i < 11000 {
			e.Tenant = "t8"
		}
		switch {
		case i >= 4000 && i < 4600 && i%3 != 0:
			e.Outcome = schemas.OutcomeError
		case i >= 7000 && i < 7600:
			e.LatencyMS = 12000
		case i >= 6000 && i < 6120 && e.Tenant == "t5":
			e.PromptTokens = 20000
		}
		switch {
		case i%50 == 49:
			e.Time = e.Time.Add(-2 * time.Hour)
		case i%70 == 69:
			e.Time = e.Time.Add(-65 * time.Minute)
		}
		if i%15 == 3 {
			e.Estimated = true
			e.PromptTokens, e.CompletionTokens = 2000, 0
		}
		evs = append(evs, e)
		orig = append(orig, e)
		final[e.Tenant+"/"+e.ID] = e.TotalTokens()
		if i%15 == 3+40%15 && i >= 40 { // settle the estimate sent 40 events ago (same tenant)
			s := orig[i-40]
			if s.Estimated {
				s.Estimated = false
				s.PromptTokens, s.CompletionTokens = 150, 75
				evs = append(evs, s)
				final[s.Tenant+"/"+s.ID] = s.TotalTokens()
			}
		}
		if i%20 == 19 && i >= 100 {
			evs = append(evs, evs[len(evs)-81]) // a retry of an earlier event
		}
	}
	return evs, final
}

// v1Header is what every usage record carries (docs/producers.md).
var v1Header = []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)}}

func produce(t testing.TB, e *env, evs []schemas.UsageEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		recs[i] = &kgo.Record{Topic: e.topic, Key: []byte(evs[i].Tenant), Value: eventjson.AppendUsageEventJSON(nil, &evs[i]), Headers: v1Header}
	}
	if err := e.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// committed returns the group's committed offsets summed, and the topic's
// high watermarks summed.
func committed(t testing.TB, e *env) (done, end int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := e.adm.FetchOffsets(ctx, e.group)
	if err == nil {
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == e.topic && o.At > 0 {
				done += o.At
			}
		})
	}
	ends, err := e.adm.ListEndOffsets(ctx, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) { end += o.Offset })
	return done, end
}

func buildAggregator(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aggregator")
	cmd := exec.Command("go", "build", "-o", bin, "./internal/testcmd")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func startAggregator(t *testing.T, e *env, bin string, logs *os.File, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"-brokers", strings.Join(e.kafka.Brokers, ","), "-clickhouse", e.ch.Addr, "-database", e.ch.Database,
		"-topic", e.topic, "-signals", e.signals, "-admin", e.admin, "-group", e.group, "-policy", e.policy, "-batch", "700", "-flush", "150ms",
		"-signal-keys", strings.Join(testSignalAuth.Keys, ",")}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A test that fails while the process runs must not leave it running
	// (the test stops or kills it itself otherwise; both are then no-ops).
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestKillNineExactlyOnce is the "done when": events with
// duplicates, settlements and late arrivals are consumed by an aggregator
// process that is SIGKILLed several times mid-stream; afterwards every
// quota_state and usage_minute row equals the sum over distinct event ids in
// ClickHouse, no event is lost, and the set of signals published equals
// that of a clean, uninterrupted run over the same partitions.
func TestKillNineExactlyOnce(t *testing.T) {
	e := integrationEnv(t, "")
	bin := buildAggregator(t)
	logs := aggregatorLogs(t)

	base := time.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	evs, final := workload(12000, base)
	half := len(evs) / 2
	produce(t, e, evs[:half])

	const kills = 4
	for k := 0; k < kills; k++ {
		if k == 2 {
			produce(t, e, evs[half:])
		}
		done0, _ := committed(t, e)
		cmd := startAggregator(t, e, bin, logs)
		// Kill once it has made some progress: mid-stream, at whatever
		// point of write/publish/commit the process happens to be.
		itest.Eventually(t, 90*time.Second, "progress before kill", func() bool {
			done, end := committed(t, e)
			return done >= done0+int64(len(evs))/12 || done == end
		})
		// Land the kill at varying points of the next flush cycle.
		time.Sleep(time.Duration(k*47%150) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	mark := logSize(t, logs)
	cmd := startAggregator(t, e, bin, logs)
	itest.Eventually(t, 120*time.Second, "the aggregator to catch up", func() bool {
		done, end := committed(t, e)
		return done == end
	})
	// The group may have caught up before this process started (the last
	// kill can land after the last commit): wait until it handles SIGTERM,
	// which it does before it logs that it consumes.
	itest.Eventually(t, 60*time.Second, "the last aggregator to start", func() bool { return consumingSince(logs, mark) })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	checkOutcome(t, ctx, e, final)
}

// checkOutcome checks what the exactly-once tests promise once the
// aggregator stopped: the distinct events are those sent (final), every
// quota_state and usage_minute row equals their sums, and the signals
// equal a clean run's. It returns the policy they were checked under.
func checkOutcome(t *testing.T, ctx context.Context, e *env, final map[string]int64) *policy.Policy {
	t.Helper()
	pol, err := policy.Load(e.policy)
	if err != nil {
		t.Fatal(err)
	}
	truth := loadDistinct(t, ctx, e.conn, pol)
	checkSent(t, truth, final)
	checkCounters(t, ctx, e.conn, truth, pol)
	checkSignals(t, e, pol)
	return pol
}

// logSize is how much the aggregator processes logged so far: taken before
// a process starts, the mark from which consumingSince reads.
func logSize(t *testing.T, logs *os.File) int {
	t.Helper()
	b, err := os.ReadFile(logs.Name())
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// consumingSince reports whether an aggregator logged that it consumes
// after mark: the process started after mark handles SIGTERM. Counting
// such lines in the whole log does not tell: a process killed before it
// logged (its group had already caught up) leaves none.
func consumingSince(logs *os.File, mark int) bool {
	b, _ := os.ReadFile(logs.Name())
	return len(b) > mark && strings.Contains(string(b[mark:]), `msg="aggregator consuming"`)
}

// aggregatorLogs returns the file the aggregator processes write to; its
// tail is logged if the test fails.
func aggregatorLogs(t *testing.T) *os.File {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "aggregator.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("aggregator log tail:\n%s", b)
		}
	})
	return logs
}

// checkSent fails the test unless the distinct events ClickHouse holds are
// exactly those sent (final: tenant/id to tokens): no loss, no double
// count.
func checkSent(t *testing.T, truth truthcheck.Events, final map[string]int64) {
	t.Helper()
	if len(truth) != len(final) {
		t.Errorf("ClickHouse holds %d distinct events, %d were sent", len(truth), len(final))
	}
	for k, tok := range final {
		if got, ok := truth[k]; !ok || got.Tokens != tok {
			t.Errorf("event %s: ClickHouse has %+v, want %d tokens", k, got, tok)
			break
		}
	}
}

// loadDistinct reads the distinct events ClickHouse holds, priced with
// pol.
func loadDistinct(t *testing.T, ctx context.Context, conn driver.Conn, pol *policy.Policy) truthcheck.Events {
	t.Helper()
	ev, err := truthcheck.Load(ctx, conn, pol)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// checkCounters fails the test unless every quota_state and usage_minute
// row equals the sum over the distinct events.
func checkCounters(t *testing.T, ctx context.Context, conn driver.Conn, truth truthcheck.Events, pol *policy.Policy) {
	t.Helper()
	qs, err := truthcheck.QuotaState(ctx, conn, truth, pol)
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Err("quota_state"); err != nil {
		t.Error(err)
	}
	mins, err := truthcheck.Minutes(ctx, conn, truth)
	if err != nil {
		t.Fatal(err)
	}
	if err := mins.Err("usage_minute"); err != nil {
		t.Error(err)
	}
	t.Logf("checked %d quota_state rows and %d minute rollups against the distinct events", qs.Checked, mins.Checked)
}

func checkSignals(t *testing.T, e *env, pol *policy.Policy) {
	t.Helper()
	want := map[string]string{}
	detectors := map[string]bool{}
	for p, recs := range readTopic(t, e, e.topic) {
		st := tally.New(p, tally.DefaultOptions())
		st.SetPolicy(pol)
		var ev schemas.UsageEvent
		for _, r := range recs {
			if err := eventjson.DecodeUsageEvent(r.Value, &ev); err != nil {
				t.Fatal(err)
			}
			st.Apply(&ev, r.Offset)
			for _, s := range st.TakeSignals() {
				want[s.ID] = string(s.Kind)
				detectors[s.Attributes["detector"]] = true
			}
		}
	}
	got := map[string]string{}
	published := 0
	for _, recs := range readTopic(t, e, e.signals) {
		for _, r := range recs {
			var s schemas.Signal
			if err := schemas.DecodeSignal(r.Value, &s); err != nil {
				t.Fatalf("published signal does not decode: %v", err)
			}
			got[s.ID] = string(s.Kind)
			published++
		}
	}
	if len(want) < 20 {
		t.Fatalf("the workload produced only %d signals; too tame to compare", len(want))
	}
	for _, d := range []string{tally.DetectorErrorRatio, tally.DetectorSlowCall, tally.DetectorRateSpike} {
		if !detectors[d] {
			t.Errorf("the workload raised no %s anomaly; the comparison does not cover it", d)
		}
	}
	var missing, extra []string
	for id, k := range want {
		if _, ok := got[id]; !ok {
			missing = append(missing, k+":"+id)
		}
	}
	for id, k := range got {
		if _, ok := want[id]; !ok {
			extra = append(extra, k+":"+id)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("signals differ from a clean run: %d missing %v, %d extra %v", len(missing), head(missing), len(extra), head(extra))
	}
	kinds := map[string]int{}
	for _, k := range want {
		kinds[k]++
	}
	t.Logf("%d distinct signals (%d records published, replays included): %v", len(got), published, kinds)
}

func head(s []string) []string { return s[:min(len(s), 5)] }

func readTopic(t *testing.T, e *env, topic string) map[int32][]*kgo.Record {
	t.Helper()
	out := map[int32][]*kgo.Record{}
	for _, r := range itest.ReadTopic(t, e.kafka, topic) {
		out[r.Partition] = append(out[r.Partition], r) // in offset order
	}
	return out
}
