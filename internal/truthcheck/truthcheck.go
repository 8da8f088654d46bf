// Package truthcheck holds the checks that prove the aggregator's counters
// equal ClickHouse's ground truth: the distinct usage events (each id
// counted once, at its latest version) summed per quota period and per
// minute, compared with every quota_state and usage_minute row. The
// aggregator's exactly-once test and the e2e replica test share it; it is
// test support, and no service imports it.
//
// The checks return what they found instead of failing a test, so that a
// caller can poll them until the pipeline has caught up.
package truthcheck

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// Event is one distinct usage event as ClickHouse holds it: the fields of
// the record with the highest kafka_offset among those with its tenant and
// id (a settled estimate replaces its estimate).
type Event struct {
	Tenant, ID, Model string
	At                time.Time
	Tokens            int64
	// Cost is the event's price under the policy Load was given (0 when
	// the policy prices no such model).
	Cost float64
}

// Events are the distinct events by "tenant/id".
type Events map[string]Event

// Load reads every distinct event of usage_events in conn's database and
// prices it with pol.
func Load(ctx context.Context, conn driver.Conn, pol *policy.Policy) (Events, error) {
	rows, err := conn.Query(ctx, `SELECT tenant, id, argMax(model, kafka_offset), argMax(time, kafka_offset),
 argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset), argMax(cached_tokens, kafka_offset),
 argMax(cache_write_tokens, kafka_offset), argMax(reasoning_tokens, kafka_offset)
 FROM usage_events GROUP BY tenant, id`)
	if err != nil {
		return nil, fmt.Errorf("usage_events: %w", err)
	}
	defer rows.Close()
	out := Events{}
	for rows.Next() {
		var e Event
		var p, c, ca, cw, re uint64
		if err := rows.Scan(&e.Tenant, &e.ID, &e.Model, &e.At, &p, &c, &ca, &cw, &re); err != nil {
			return nil, fmt.Errorf("usage_events: %w", err)
		}
		e.Tokens = int64(p + c)
		pr, _, _, _ := pol.CostSpan(e.Model, e.At.Unix()) // as the aggregator counts it
		e.Cost = pr.Cost(policy.Tokens{Prompt: int64(p), Completion: int64(c), Cached: int64(ca), CacheWrite: int64(cw), Reasoning: int64(re)})
		out[e.Tenant+"/"+e.ID] = e
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage_events: %w", err)
	}
	return out, nil
}

// byTenant groups the events by tenant.
func (ev Events) byTenant() map[string][]Event {
	out := map[string][]Event{}
	for _, e := range ev {
		out[e.Tenant] = append(out[e.Tenant], e)
	}
	return out
}

// Report is what a check found.
type Report struct {
	// Checked is how many rows were compared.
	Checked int
	// Problems are the rows that differ from the truth (and truths without
	// a row), each described with the row's key, its value and the truth.
	Problems []string
}

// Err returns nil when nothing differs, and otherwise an error naming the
// first few problems and how many there are.
func (r Report) Err(what string) error {
	if len(r.Problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d of %d rows differ from the distinct events, e.g. %v", what, len(r.Problems), r.Checked, r.Problems[:min(len(r.Problems), 5)])
}

// QuotaState compares the latest version of every quota_state row
// (FINAL) with the sum over the distinct events of its tenant, model ("*"
// = all) and period, in tokens or, for currency quotas, in cost; and
// checks that every hour, day and month a tenant used has its row of each
// hourly, daily and monthly token quota the policy gives it on "*".
func QuotaState(ctx context.Context, conn driver.Conn, ev Events, pol *policy.Policy) (Report, error) {
	rows, err := conn.Query(ctx, `SELECT tenant, model, quota, period_start, period_end, used, unit FROM quota_state FINAL`)
	if err != nil {
		return Report{}, fmt.Errorf("quota_state: %w", err)
	}
	defer rows.Close()
	byTenant := ev.byTenant()
	var r Report
	seen := map[string]bool{}
	for rows.Next() {
		var tenant, model, quota, unit string
		var start, end time.Time
		var used float64
		if err := rows.Scan(&tenant, &model, &quota, &start, &end, &used, &unit); err != nil {
			return Report{}, fmt.Errorf("quota_state: %w", err)
		}
		r.Checked++
		var want float64
		for _, e := range byTenant[tenant] {
			if (model == "*" || e.Model == model) && !e.At.Before(start) && e.At.Before(end) {
				if unit == "currency" {
					want += e.Cost
				} else {
					want += float64(e.Tokens)
				}
			}
		}
		if math.Abs(used-want) > 1e-6*math.Max(1, want) {
			r.Problems = append(r.Problems, fmt.Sprintf("quota_state %s/%s %s %v: used %v, distinct events say %v", tenant, model, quota, start.UTC(), used, want))
		}
		if model == "*" {
			seen[tenant+"/"+quota+"/"+start.UTC().Format(time.RFC3339)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return Report{}, fmt.Errorf("quota_state: %w", err)
	}
	if r.Checked == 0 && len(ev) > 0 {
		r.Problems = append(r.Problems, "quota_state is empty")
	}
	missing := map[string]bool{}
	for _, e := range ev {
		tn := pol.Tenant(e.Tenant)
		for _, q := range tn.Quotas("*") {
			if q.Unit != schemas.UnitTokens || (q.Period != schemas.PeriodHour && q.Period != schemas.PeriodDay && q.Period != schemas.PeriodMonth) {
				continue
			}
			s, _ := tn.PeriodBounds(q.Period, e.At)
			k := e.Tenant + "/" + string(q.Name) + "/" + s.UTC().Format(time.RFC3339)
			if !seen[k] && !missing[k] {
				missing[k] = true
				r.Problems = append(r.Problems, fmt.Sprintf("no %s row for %s period %v", q.Name, e.Tenant, s.UTC()))
			}
		}
	}
	sort.Strings(r.Problems)
	return r, nil
}

// Minutes compares every usage_minute row (FINAL) with the distinct events
// of its tenant, model ("*" = all) and minute: requests and tokens; a
// minute with events and no row is a problem too.
func Minutes(ctx context.Context, conn driver.Conn, ev Events) (Report, error) {
	type key struct {
		tenant, model string
		minute        int64
	}
	want := map[key][2]uint64{}
	for _, e := range ev {
		m := e.At.Unix() / 60 * 60
		for _, model := range []string{e.Model, "*"} {
			k := key{e.Tenant, model, m}
			v := want[k]
			v[0]++
			v[1] += uint64(e.Tokens)
			want[k] = v
		}
	}
	rows, err := conn.Query(ctx, `SELECT tenant, model, minute, requests, prompt_tokens + completion_tokens FROM usage_minute FINAL`)
	if err != nil {
		return Report{}, fmt.Errorf("usage_minute: %w", err)
	}
	defer rows.Close()
	got := map[key][2]uint64{}
	for rows.Next() {
		var k key
		var at time.Time
		var v [2]uint64
		if err := rows.Scan(&k.tenant, &k.model, &at, &v[0], &v[1]); err != nil {
			return Report{}, fmt.Errorf("usage_minute: %w", err)
		}
		k.minute = at.Unix()
		got[k] = v
	}
	if err := rows.Err(); err != nil {
		return Report{}, fmt.Errorf("usage_minute: %w", err)
	}
	r := Report{Checked: len(want)}
	for k, v := range want {
		if got[k] != v {
			r.Problems = append(r.Problems, fmt.Sprintf("usage_minute %s/%s %v: %v (requests, tokens), distinct events say %v", k.tenant, k.model, time.Unix(k.minute, 0).UTC(), got[k], v))
		}
	}
	sort.Strings(r.Problems)
	return r, nil
}
