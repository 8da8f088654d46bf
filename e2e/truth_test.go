package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// truth is the billing ground truth of a tenant: its distinct events in
// usage_events and their tokens, each id counted once.
func (s *stack) truth(ctx context.Context, tenant string) (events, tokens uint64, err error) {
	row := s.conn.QueryRow(ctx, `
SELECT count(), sum(t) FROM (
  SELECT id, argMax(prompt_tokens + completion_tokens, kafka_offset) AS t
  FROM usage_events WHERE tenant = ? GROUP BY id)`, tenant)
	err = row.Scan(&events, &tokens)
	return events, tokens, err
}

// counter is the aggregator's latest value of one quota of tenant (model
// "*"), summed over the periods it has: what enforcement decides on.
func (s *stack) counter(ctx context.Context, tenant, quota string) (float64, error) {
	rows, err := s.conn.Query(ctx, `
SELECT period_start, argMax(used, version) FROM quota_state
WHERE tenant = ? AND quota = ? AND model = '*'
GROUP BY period_start`, tenant, quota)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var sum float64
	for rows.Next() {
		var start time.Time
		var used float64
		if err := rows.Scan(&start, &used); err != nil {
			return 0, err
		}
		sum += used
	}
	return sum, rows.Err()
}

// storedIDs returns the distinct event ids stored for tenants.
func (s *stack) storedIDs(ctx context.Context, tenants []string) (map[string]int, error) {
	rows, err := s.conn.Query(ctx, `SELECT id, count() FROM (SELECT DISTINCT tenant, id FROM usage_events WHERE has(?, tenant)) GROUP BY id`, tenants)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n uint64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = int(n)
	}
	return out, rows.Err()
}

// countersMatchTruth waits until the monthly counter of every tenant equals
// its ground truth and that truth is exactly the events ingest accepted.
func (s *stack) countersMatchTruth(t testing.TB, acked map[string]map[string]uint64) {
	t.Helper()
	s.countersMatchTruthWithin(t, acked, waitTimeout)
}

// countersMatchTruthWithin is countersMatchTruth with its own bound, for a
// test that leaves a backlog to store (an outage of ClickHouse under load).
func (s *stack) countersMatchTruthWithin(t testing.TB, acked map[string]map[string]uint64, within time.Duration) {
	t.Helper()
	itest.EventuallyNoError(t, within, "counters equal the ClickHouse ground truth and every 2xx event is stored once", func() error {
		return s.countersErr(acked)
	})
}

// countersErr says how the stored events and monthly counters differ from
// what ingest acknowledged (nil when they do not): an acknowledged event
// stored other than once, a tenant whose distinct events or tokens differ,
// or whose monthly_tokens counter is not its ground truth.
func (s *stack) countersErr(acked map[string]map[string]uint64) error {
	tenants := make([]string, 0, len(acked))
	for tn := range acked {
		tenants = append(tenants, tn)
	}
	sort.Strings(tenants)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := s.storedIDs(ctx, tenants)
	if err != nil {
		return err
	}
	var problems []string
	for _, tn := range tenants {
		evs := acked[tn]
		var want uint64
		for id, tok := range evs {
			if ids[id] != 1 {
				return fmt.Errorf("event %s of %s acknowledged with 2xx is stored %d times", id, tn, ids[id])
			}
			want += tok
		}
		n, tok, err := s.truth(ctx, tn)
		if err != nil {
			return err
		}
		if n != uint64(len(evs)) || tok != want {
			return fmt.Errorf("%s: usage_events holds %d events / %d tokens, ingest acknowledged %d / %d", tn, n, tok, len(evs), want)
		}
		c, err := s.counter(ctx, tn, "monthly_tokens")
		if err != nil {
			return err
		}
		if math.Abs(c-float64(tok)) > 0.5 {
			problems = append(problems, fmt.Sprintf("%s: monthly_tokens counter %.0f, ground truth %d", tn, c, tok))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// flag returns the decoded flag of tenant's field ("*" or a model), nil
// when there is none.
func (s *stack) flag(ctx context.Context, tenant, field string) (*flags.Flag, error) {
	l := flags.Layout{Prefix: s.prefix}
	v, err := s.rdb.HGet(ctx, l.TenantKey(tenant), field).Result()
	if err != nil {
		if err.Error() == "redis: nil" {
			return nil, nil
		}
		return nil, err
	}
	return flags.Decode(v)
}

// amAlert is the part of an Alertmanager v2 alert the suites read.
type amAlert struct {
	Labels map[string]string `json:"labels"`
	Status struct {
		State string `json:"state"`
	} `json:"status"`
}

// alerts returns the active alerts of tenant in the real Alertmanager.
func (s *stack) alerts(ctx context.Context, tenant string) ([]amAlert, error) {
	q := url.Values{}
	q.Add("filter", fmt.Sprintf("tenant=%q", tenant))
	code, body, err := httpGet(ctx, s.alertmgr+"/api/v2/alerts?"+q.Encode())
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("alertmanager answered %d: %s", code, body)
	}
	var out []amAlert
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// waitAlert waits until Alertmanager holds an active alert of tenant with
// the given alertname and tier label.
func (s *stack) waitAlert(t testing.TB, tenant, alertname, tier string) {
	t.Helper()
	itest.EventuallyNoError(t, waitTimeout, fmt.Sprintf("Alertmanager has %s tier %s for %s", alertname, tier, tenant), func() error {
		as, err := s.alerts(context.Background(), tenant)
		if err != nil {
			return err
		}
		var seen []string
		for _, a := range as {
			if a.Labels["alertname"] == alertname && a.Labels["tier"] == tier && a.Status.State == "active" {
				return nil
			}
			seen = append(seen, a.Labels["alertname"]+"/"+a.Labels["tier"]+"/"+a.Status.State)
		}
		return fmt.Errorf("alerts now: [%s]", strings.Join(seen, " "))
	})
}
