package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/truthcheck"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Bounds the replica test states (docs/scaling.md repeats them and the
// figures measured against them).
const (
	// replicaFlagBound: a hard quota crossed at any moment of the run —
	// during normal running, right after the kill -9 of an aggregator, of
	// the leading enforcer, or after partitions were added to the usage
	// topic — is refused by a gateway Checker on the Redis Cluster within
	// this of ingest's 2xx for the event that crossed it. The slowest case
	// is the aggregator's: the dead instance's partitions move after its
	// 6 s session timeout and are rebuilt from ClickHouse first.
	replicaFlagBound = 30 * time.Second
	// replicaSettle: once the load stops, counters equal ClickHouse's
	// truth and every replica's admin state is complete within this.
	replicaSettle = 90 * time.Second
)

// slackReceiver stands in for a Slack incoming webhook: it counts every
// message by its text (the alert's title).
type slackReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[string]int
	bad []string
}

func newSlackReceiver(t testing.TB) *slackReceiver {
	r := &slackReceiver{got: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var p struct {
			Text string `json:"text"`
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := json.Unmarshal(body, &p); err != nil || p.Text == "" {
			r.bad = append(r.bad, string(body))
			http.Error(w, "invalid_payload", http.StatusBadRequest)
			return
		}
		r.got[p.Text]++
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *slackReceiver) url() string { return r.srv.URL + "/services/T0/B0/replicas" }

// titles returns a copy of the counts.
func (r *slackReceiver) titles() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.got))
	for k, v := range r.got {
		out[k] = v
	}
	return out
}

// replicaPolicy meters every tenant with a huge monthly quota, gives the
// limited tenants a 1,000-token hourly one, and sends every alert to the
// Slack stand-in only.
func replicaPolicy(limited []string, webhook string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `defaults:
  timezone: UTC
  mode: hard
  fail_mode: open
  alert_tiers: [70, 90, 100]
  channels: [slack:noc]
  models:
    "*":
      monthly_tokens: 1000000000
channels:
  slack:
    noc: {webhook: %q}
tenants:
`, webhook)
	for _, tn := range limited {
		fmt.Fprintf(&b, "  %s:\n    models:\n      \"*\":\n        hourly_tokens: 1000\n        monthly_tokens: 1000000000\n", tn)
	}
	return b.String()
}

// replicaRig is the replica test's view of its stack: the ingest
// addresses, the enforcers' admin clients, and a gateway Checker on the
// Redis Cluster.
type replicaRig struct {
	t       *testing.T
	s       *stack
	checker *checker.Checker
	admins  map[string]*adminapi.Client // by enforcer replica id
	// pushed are the events the test sent itself (tenant -> id -> tokens),
	// acknowledged with a 2xx.
	mu     sync.Mutex
	pushed map[string]map[string]uint64
	next   int
}

// push sends one event of tenant with tokens to the ingest replicas in
// turn until one answers 202, and returns when it did.
func (r *replicaRig) push(tenant string, tokens int64) time.Time {
	r.t.Helper()
	id := "push-" + randomKey()[7:]
	body := []byte(eventJSON(id, tenant, time.Now(), tokens-1, 1))
	var acked time.Time
	itest.EventuallyNoError(r.t, waitTimeout, "an ingest replica acknowledges "+tenant+"'s event", func() error {
		r.mu.Lock()
		addr := r.s.ingests[r.next%len(r.s.ingests)]
		r.next++
		r.mu.Unlock()
		code, b, _, err := r.s.postEventsTo(context.Background(), addr, r.s.ingestKey, "application/json", body)
		if err != nil || code != http.StatusAccepted {
			return fmt.Errorf("%s: %d %v %s", addr, code, err, b)
		}
		acked = time.Now()
		return nil
	})
	r.mu.Lock()
	if r.pushed[tenant] == nil {
		r.pushed[tenant] = map[string]uint64{}
	}
	r.pushed[tenant][id] = uint64(tokens)
	r.mu.Unlock()
	return acked
}

// flagLatency waits until the Checker refuses tenant on its hourly quota
// and returns how long after since that happened; beyond
// replicaFlagBound the test fails.
func (r *replicaRig) flagLatency(what, tenant string, since time.Time) time.Duration {
	r.t.Helper()
	itest.EventuallyNoError(r.t, replicaFlagBound-time.Since(since), what+": the Checker refuses "+tenant, func() error {
		d := r.checker.Check(tenant, "gpt-4o-mini", "")
		if d.Outcome != checker.Refused || d.Flag.Kind != flags.KindQuota || d.Flag.Quota != "hourly_tokens" {
			return fmt.Errorf("decision %+v", d)
		}
		return nil
	})
	lat := time.Since(since)
	r.t.Logf("flag latency %s: %v", what, lat.Round(time.Millisecond))
	return lat
}

// leader returns the replica id holding the enforcers' leader lease.
func (r *replicaRig) leader() string {
	var id string
	itest.EventuallyNoError(r.t, waitTimeout, "an enforcer holds the leader lease", func() error {
		v, err := r.s.rdb.Get(context.Background(), r.s.prefix+"leader").Result()
		if err != nil {
			return err
		}
		id, _, _ = strings.Cut(v, "/")
		return nil
	})
	return id
}

// adminDriver blacklists one new tenant after another through the admin
// APIs of both enforcers in turn, retrying a refused call on the other
// replica, and remembers each action an API acknowledged.
type adminDriver struct {
	r      *replicaRig
	run    string
	mu     sync.Mutex
	acked  []string // blacklisted tenants, in order
	failed int      // calls refused (the replica was down)
	stop   context.CancelFunc
	done   chan struct{}
}

func (r *replicaRig) startAdmin() *adminDriver {
	ctx, cancel := context.WithCancel(context.Background())
	a := &adminDriver{r: r, run: randomKey()[7:13], stop: cancel, done: make(chan struct{})}
	ids := slices.Sorted(maps.Keys(r.admins))
	go func() {
		defer close(a.done)
		for i, turn := 0, 0; ctx.Err() == nil; i++ {
			tenant := fmt.Sprintf("e2e-adm-%s-%03d", a.run, i)
			for deadline := time.Now().Add(waitTimeout); ; {
				cl := r.admins[ids[turn%len(ids)]]
				turn++
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := cl.Blacklist(cctx, adminapi.Request{Tenant: tenant, Reason: "e2e replica test", ExpiresIn: "1h"})
				cancel()
				if err == nil {
					a.mu.Lock()
					a.acked = append(a.acked, tenant)
					a.mu.Unlock()
					break
				}
				a.mu.Lock()
				a.failed++
				a.mu.Unlock()
				if time.Now().After(deadline) {
					return
				}
				time.Sleep(50 * time.Millisecond) // pacing a retry, not a wait for a condition
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return a
}

func (a *adminDriver) count() (acked, failed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked), a.failed
}

// waitAcked waits until n more actions were acknowledged.
func (a *adminDriver) waitAcked(t testing.TB, n int) {
	t.Helper()
	have, _ := a.count()
	itest.Eventually(t, waitTimeout, fmt.Sprintf("%d more admin actions acknowledged", n), func() bool {
		got, _ := a.count()
		return got >= have+n
	})
}

func (a *adminDriver) finish() []string {
	a.stop()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.acked)
}

// homeOf is a tenant's home partition of n: where ingest's key
// partitioner puts its events and the aggregator counts them (murmur2 of
// the key, as Kafka's Java client).
func homeOf(tenant string, n int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(tenant)}, n))
}

// pickTenants returns names prefix-<i>-sfx: for each of the n partitions,
// one tenant whose home stays when the topic grows to 2n partitions and
// one whose home moves to a new partition.
func pickTenants(prefix, sfx string, n int) (stay, move []string) {
	haveStay, haveMove := map[int32]bool{}, map[int32]bool{}
	for i := 0; len(stay) < n || len(move) < n; i++ {
		tn := fmt.Sprintf("%s-%d-%s", prefix, i, sfx)
		h := homeOf(tn, n)
		switch {
		case homeOf(tn, 2*n) == h && !haveStay[h]:
			haveStay[h] = true
			stay = append(stay, tn)
		case homeOf(tn, 2*n) != h && !haveMove[h]:
			haveMove[h] = true
			move = append(move, tn)
		}
	}
	return stay, move
}

// owned returns the usage partitions an aggregator process is consuming:
// the labels of its consumer-lag gauge, set for each partition it
// processed and dropped when the partition is revoked.
func (s *stack) owned(name string) map[int32]bool {
	out := map[int32]bool{}
	for _, line := range strings.Split(s.metrics(name), "\n") {
		rest, ok := strings.CutPrefix(line, `sluice_aggregator_consumer_lag{partition="`)
		if !ok {
			continue
		}
		var p int32
		if _, err := fmt.Sscanf(rest, "%d", &p); err == nil {
			out[p] = true
		}
	}
	return out
}

// TestReplicasUnderLoad runs two replicas each of ingest, the aggregator,
// the enforcer and the alerter as processes against the real Kafka,
// ClickHouse and Redis Cluster (the flags) under load spread over both
// ingests. It kills one of each with kill -9 and starts it again, doubles
// the usage topic's partitions mid-run with everything running (half the
// load tenants move to a new home), crosses hard quotas at each of those
// moments and blacklists tenants through both admin APIs while the leading
// enforcer dies. Then:
// every event acknowledged with a 2xx is stored once; the monthly
// counters, quota_state and usage_minute equal the distinct events in
// ClickHouse; every crossing was refused by a Checker within
// replicaFlagBound; no Slack message was sent twice; and every
// acknowledged admin action is in force in both enforcers and at the
// Checker.
func TestReplicasUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	// Not parallel: eight service processes under load. It runs before the
	// parallel suites start, so that its bounds measure Sluice rather than
	// the other suites' load on two cores.
	const parts = 4 // -kafka.partitions of every stack
	sfx := randomKey()[7:15]
	stay, move := pickTenants("e2e-rep-load", sfx, parts)
	load := append(slices.Clone(stay), move...)
	lim := map[string]string{}
	var limited []string
	for _, role := range []string{"steady", "enf", "alert", "after"} {
		lim[role] = "e2e-rep-" + role + "-" + sfx
		limited = append(limited, lim[role])
	}
	// One candidate per partition for the crossing right after an
	// aggregator dies: the test uses the one on a partition the killed
	// instance owned. And one whose home moves when partitions are added.
	aggStay, _ := pickTenants("e2e-rep-agg", sfx, parts)
	_, partsMove := pickTenants("e2e-rep-parts", sfx, parts)
	lim["parts"] = partsMove[0]
	limited = append(append(limited, aggStay...), lim["parts"])
	slack := newSlackReceiver(t)
	s := newStack(t, stackOptions{RedisCluster: true, Policy: replicaPolicy(limited, slack.url()), Extra: []string{
		// Crashed members leave the groups soon; the aggregator's is 6 s
		// in every stack.
		"-services.alerter.consumer.session_timeout=6s",
		"-services.enforcer.consumer.session_timeout=6s",
		// Nothing resolves within the test, so each alert notifies each
		// level at most once: a second message is a duplicate.
		"-services.alerter.rules.resolve_after=10m",
	}})

	// Two of everything: ingest on two addresses, enforcers with their own
	// replica_id and admin API, aggregators and alerters sharing a group.
	ingest2, admin2 := freeAddr(t), freeAddr(t)
	s.ingests = []string{s.ingestAddr, ingest2}
	replicas := map[string][]string{
		"ingest-1": {"ingest"}, "ingest-2": {"ingest", "-services.ingest.listen=" + ingest2},
		"aggregator-1": {"aggregator"}, "aggregator-2": {"aggregator"},
		"enforcer-1": {"enforcer", "-services.enforcer.replica_id=e1"},
		"enforcer-2": {"enforcer", "-services.enforcer.replica_id=e2", "-services.enforcer.admin.listen=" + admin2},
		"alerter-1":  {"alerter"}, "alerter-2": {"alerter"},
	}
	start := func(names ...string) {
		ps := make([]*proc, 0, len(names))
		for _, n := range names {
			ps = append(ps, s.spawnAs(n, replicas[n][0], replicas[n][1:]...))
		}
		for _, p := range ps {
			s.waitReady(p)
		}
	}
	restart := func(name string) time.Duration {
		t0 := time.Now()
		start(name)
		return time.Since(t0)
	}
	began := time.Now()
	start(slices.Sorted(maps.Keys(replicas))...)

	r := &replicaRig{t: t, s: s, pushed: map[string]map[string]uint64{}, admins: map[string]*adminapi.Client{}}
	for id, addr := range map[string]string{"e1": s.adminAddr, "e2": admin2} {
		cl, err := adminapi.NewClient("http://"+addr, s.adminToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.admins[id] = cl
	}
	r.checker = newClusterChecker(t, s)
	adm := kadm.NewClient(s.kafkaClient(t))
	l := startLoader(t, s, 20, 40*time.Millisecond, load...)
	l.waitProgress(t, 1000)
	if n := s.partitions(t, adm); n != parts {
		t.Fatalf("the usage topic has %d partitions, the test chose its tenants for %d", n, parts)
	}
	lat := map[string]time.Duration{}
	acked := func() map[string]map[string]uint64 {
		a := l.snapshot()
		r.mu.Lock()
		defer r.mu.Unlock()
		for tn, evs := range r.pushed {
			a[tn] = maps.Clone(evs)
		}
		return a
	}
	// A quota crossed while everything runs.
	r.push(lim["steady"], 750)
	lat["steady"] = r.flagLatency("steady", lim["steady"], r.push(lim["steady"], 300))

	// Ingest: the load fails over to the other replica.
	s.kill9("ingest-1")
	l.waitProgress(t, 500)
	restarts := map[string]time.Duration{"ingest": restart("ingest-1")}
	l.waitProgress(t, 500)

	// Aggregator: its partitions move to the other instance, which
	// rebuilds them from ClickHouse; a quota crossed on one of them meanwhile.
	var victim map[int32]bool
	itest.Eventually(t, waitTimeout, "aggregator-1 consumes a partition", func() bool {
		victim = s.owned("aggregator-1")
		return len(victim) > 0
	})
	s.kill9("aggregator-1")
	for _, tn := range aggStay {
		if victim[homeOf(tn, parts)] {
			lim["agg"] = tn
			break
		}
	}
	if lim["agg"] == "" {
		t.Fatalf("aggregator-1 consumed partitions %v, none a home of %v", victim, aggStay)
	}
	lat["aggregator killed"] = r.flagLatency("aggregator killed", lim["agg"], r.push(lim["agg"], 1050))
	restarts["aggregator"] = restart("aggregator-1")
	l.waitProgress(t, 500)

	// Partitions added: half the load tenants and lim["parts"] move to new
	// partitions, with the aggregators, ingest and the load running
	// throughout. A moved tenant's new home takes it over only once its old
	// home stored what it counted under the old count (the hand-over,
	// docs/scaling.md), so the counters stay exact.
	added := time.Now()
	resp, err := adm.CreatePartitions(context.Background(), parts, s.topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("adding %d partitions to %s: %v", parts, s.topic, err)
	}
	lat["partitions added"] = r.flagLatency("partitions added", lim["parts"], r.push(lim["parts"], 1050))
	itest.EventuallyNoError(t, replicaFlagBound, "the aggregators consume all 8 partitions", func() error {
		all := s.owned("aggregator-1")
		maps.Copy(all, s.owned("aggregator-2"))
		if len(all) != 2*parts {
			return fmt.Errorf("consumed: %v", slices.Sorted(maps.Keys(all)))
		}
		return nil
	})
	newParts := time.Since(added)
	t.Logf("usage topic: %d partitions, now %d; all consumed %v after the change", parts, 2*parts, newParts.Round(time.Millisecond))
	l.waitProgress(t, 1000)

	// Enforcer: the leader dies while admin actions arrive at both.
	ad := r.startAdmin()
	ad.waitAcked(t, 5)
	lead := r.leader()
	leadProc := map[string]string{"e1": "enforcer-1", "e2": "enforcer-2"}[lead]
	s.kill9(leadProc)
	lat["leading enforcer killed"] = r.flagLatency("leading enforcer killed", lim["enf"], r.push(lim["enf"], 1050))
	ad.waitAcked(t, 5)
	restarts["enforcer"] = restart(leadProc)
	ad.waitAcked(t, 5)
	blacklisted := ad.finish()
	if _, failed := ad.count(); failed == 0 {
		t.Fatalf("no admin call was refused: the kill of enforcer %s did not land among them, the test proves nothing", lead)
	}
	var lifted []string
	for i, tn := range blacklisted {
		if i%3 == 0 {
			if _, err := r.admins[lead].Unblacklist(context.Background(), adminapi.Request{Tenant: tn, Reason: "e2e: lifted"}); err != nil {
				t.Fatalf("unblacklist %s on the restarted enforcer %s: %v", tn, lead, err)
			}
			lifted = append(lifted, tn)
		}
	}

	// Alerter: a tier crossed while one is dead and crossed again after.
	r.push(lim["alert"], 750)
	s.kill9("alerter-1")
	r.push(lim["alert"], 300)
	restarts["alerter"] = restart("alerter-1")
	r.push(lim["after"], 750)
	lat["after the restarts"] = r.flagLatency("after the restarts", lim["after"], r.push(lim["after"], 300))

	l.stop()
	s.requireAlive()
	loaded := time.Since(began)

	// Every 2xx event stored once; the monthly counters, every
	// quota_state row and every usage_minute row equal the distinct events.
	pol, err := policy.Load(s.policyPath)
	if err != nil {
		t.Fatal(err)
	}
	// Checked to the end, then reported without stopping the test, so
	// that one run shows every guarantee that does not hold.
	var qs, mins truthcheck.Report
	if err := pollErr(replicaSettle, func() error {
		cerr := s.countersErr(acked())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ev, err := truthcheck.Load(ctx, s.conn, pol)
		if err != nil {
			return err
		}
		if qs, err = truthcheck.QuotaState(ctx, s.conn, ev, pol); err != nil {
			return err
		}
		if mins, err = truthcheck.Minutes(ctx, s.conn, ev); err != nil {
			return err
		}
		return cmpErr(cerr, qs.Err("quota_state"), mins.Err("usage_minute"))
	}); err != nil {
		t.Errorf("after %v, the stored events and counters are not ClickHouse's truth: %v", replicaSettle, err)
		s.explainCounters(t, acked())
	}

	// Flags right: over-quota and blacklisted tenants refused, the rest
	// (lifted blacklists included) allowed; each acknowledged action in
	// both enforcers' state.
	overQuota := []string{lim["steady"], lim["agg"], lim["parts"], lim["enf"], lim["alert"], lim["after"]}
	itest.EventuallyNoError(t, replicaSettle, "every acknowledged admin action in force in both enforcers and at the Checker", func() error {
		for _, tn := range append(slices.Clone(overQuota), blacklisted...) {
			if slices.Contains(lifted, tn) {
				continue
			}
			if d := r.checker.Check(tn, "gpt-4o-mini", ""); d.Allowed() {
				return fmt.Errorf("%s allowed, want refused", tn)
			}
		}
		for _, tn := range append(slices.Clone(load), lifted...) {
			if d := r.checker.Check(tn, "gpt-4o-mini", ""); !d.Allowed() {
				return fmt.Errorf("%s refused (%+v), want allowed", tn, d.Flag)
			}
		}
		for id, cl := range r.admins {
			for _, tn := range blacklisted {
				bs, err := cl.Breakers(context.Background(), tn)
				if err != nil {
					return fmt.Errorf("enforcer %s: %w", id, err)
				}
				has := slices.ContainsFunc(bs, func(b adminapi.Breaker) bool { return b.Kind == flags.KindBlacklist })
				if want := !slices.Contains(lifted, tn); has != want {
					return fmt.Errorf("enforcer %s: %s blacklisted %v, want %v", id, tn, has, want)
				}
			}
		}
		return nil
	})

	// Every crossing was announced — the one made while an alerter was
	// dead by the survivor or the restarted one — and no Slack message
	// came twice.
	for _, role := range []string{"steady", "agg", "parts", "enf", "alert", "after"} {
		tn := lim[role]
		itest.EventuallyNoError(t, waitTimeout, "Slack told of "+tn+" at 100%", func() error {
			for title := range slack.titles() {
				if strings.Contains(title, tn) && strings.Contains(title, "at 100%") {
					return nil
				}
			}
			return fmt.Errorf("titles: %v", slices.Sorted(maps.Keys(slack.titles())))
		})
	}
	got := slack.titles()
	var twice []string
	for title, n := range got {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%dx %q", n, title))
		}
	}
	sort.Strings(twice)
	if len(twice) > 0 {
		t.Errorf("Slack received messages more than once: %v", twice)
	}
	t.Logf("Slack received: %q", slices.Sorted(maps.Keys(got)))
	t.Logf("%d events acknowledged (%d refused and retried) over %v, %d admin actions (%d refused calls retried, %d lifted); %d quota_state rows and %d minutes checked; %d Slack messages",
		l.ackedCount(), l.refused, loaded.Round(time.Second), len(blacklisted), func() int { _, f := ad.count(); return f }(), len(lifted), qs.Checked, mins.Checked, len(got))
	t.Logf("flag latencies: %v; restarts until ready: %v; new partitions consumed after %v", lat, restarts, newParts.Round(time.Millisecond))
}

// explainCounters logs, for every tenant whose monthly counter is not its
// ground truth, its home partitions, where its events are stored, and every
// quota_state row of its monthly counter with the partition count and
// offset its version encodes (chstore.VersionShift): the evidence of which
// partition's state wrote the row that wins.
func (s *stack) explainCounters(t testing.TB, acked map[string]map[string]uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var moved, stayed []string
	defer func() {
		t.Logf("monthly counters off for %d tenants whose home partition moved when partitions were added %v, and for %d whose home stayed %v",
			len(moved), moved, len(stayed), stayed)
	}()
	for _, tn := range slices.Sorted(maps.Keys(acked)) {
		_, tok, err := s.truth(ctx, tn)
		if err != nil {
			t.Logf("explain %s: %v", tn, err)
			return
		}
		c, err := s.counter(ctx, tn, "monthly_tokens")
		if err != nil || math.Abs(c-float64(tok)) <= 0.5 {
			continue
		}
		if homeOf(tn, 4) != homeOf(tn, 8) {
			moved = append(moved, tn)
		} else {
			stayed = append(stayed, tn)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s: monthly_tokens counter %.0f, ground truth %d; home partition %d of 4, %d of 8\n", tn, c, tok, homeOf(tn, 4), homeOf(tn, 8))
		rows, err := s.conn.Query(ctx, `SELECT kafka_partition, count(), sum(prompt_tokens + completion_tokens), min(kafka_offset), max(kafka_offset)
FROM usage_events FINAL WHERE tenant = ? GROUP BY kafka_partition ORDER BY kafka_partition`, tn)
		if err == nil {
			for rows.Next() {
				var p int32
				var n, sum uint64
				var lo, hi int64
				if rows.Scan(&p, &n, &sum, &lo, &hi) == nil {
					fmt.Fprintf(&b, "  usage_events on partition %d: %d events, %d tokens, offsets %d..%d\n", p, n, sum, lo, hi)
				}
			}
			rows.Close()
		}
		var homeEnd int64 = -1
		_ = s.conn.QueryRow(ctx, `SELECT max(kafka_offset) + 1 FROM usage_events WHERE kafka_partition = ?`, homeOf(tn, 8)).Scan(&homeEnd)
		fmt.Fprintf(&b, "  home partition %d (of 8) stored events up to offset %d\n", homeOf(tn, 8), homeEnd)
		rows, err = s.conn.Query(ctx, `SELECT used, intDiv(version, 281474976710656), version % 281474976710656, updated_at
FROM quota_state WHERE tenant = ? AND quota = 'monthly_tokens' AND model = '*' ORDER BY version`, tn)
		if err == nil {
			// The last row (highest version) is the one FINAL keeps.
			var used float64
			var n, off uint64
			for rows.Next() {
				var at time.Time
				if rows.Scan(&used, &n, &off, &at) == nil {
					fmt.Fprintf(&b, "  quota_state row: used %.0f, version = %d partitions << 48 | offset %d, written %v\n", used, n, off, at.UTC().Format(time.TimeOnly))
				}
			}
			rows.Close()
			switch {
			case homeOf(tn, 4) == homeOf(tn, 8):
			case n == 8 && int64(off) > homeEnd:
				fmt.Fprintf(&b, "  => the winning row was written under 8 partitions at an offset beyond the home partition's end: by the old home (partition %d), which still held the tenant after it moved and wrote its stale rows again; that version beats the new home's rows under FINAL\n", homeOf(tn, 4))
			case n == 8 && used < float64(tok):
				fmt.Fprintf(&b, "  => the winning row is the new home's, %.0f tokens short: events its old home (partition %d) counted before that instance learned of the new partitions and stored after the new home had rebuilt the tenant from ClickHouse\n", float64(tok)-used, homeOf(tn, 4))
			}
		}
		t.Log(b.String())
	}
}

// pollErr polls cond until it returns nil or within has passed, and
// returns its last error: itest.EventuallyNoError for a check whose
// failure must not end the test.
func pollErr(within time.Duration, cond func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond) // polling interval, not an assertion
	}
}

// cmpErr joins the non-nil errors.
func cmpErr(errs ...error) error {
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// newClusterChecker is a gateway Checker on the stack's flags.
func newClusterChecker(t testing.TB, s *stack) *checker.Checker {
	t.Helper()
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = s.prefix
	cfg.ResyncInterval = 2 * time.Second
	return checkertest.Start(t, s.rdb, cfg)
}

// kafkaClient is a client of the stack's broker, closed with the test.
func (s *stack) kafkaClient(t testing.TB) *kgo.Client {
	t.Helper()
	kc := itest.Kafka(t)
	kc.Brokers = strings.Split(s.kafka, ",")
	cl, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// partitions returns the usage topic's partition count.
func (s *stack) partitions(t testing.TB, adm *kadm.Client) int {
	t.Helper()
	tds, err := adm.ListTopics(context.Background(), s.topic)
	if err != nil {
		t.Fatal(err)
	}
	td, ok := tds[s.topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		t.Fatalf("usage topic %s: %v", s.topic, td.Err)
	}
	return len(td.Partitions)
}
