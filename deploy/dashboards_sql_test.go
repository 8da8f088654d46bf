package deploy

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations/migrationtest"
)

// timeFilter is the ClickHouse datasource's time-range macro.
var timeFilter = regexp.MustCompile(`\$__timeFilter\((\w+)\)`)

// TestDashboardSQLRunsOnClickHouse: every ClickHouse panel's query runs on
// a database with every migration applied (a renamed table or column
// fails it here, not on an operator's screen), and the top-users panel
// ranks users by their tokens, counting an estimated event its settlement
// replaced once.
func TestDashboardSQLRunsOnClickHouse(t *testing.T) {
	qs := sqlQueries(t)
	if len(qs) == 0 {
		t.Fatal("no ClickHouse panel in grafana/dashboards: the top-users view is gone")
	}
	_, conn := migrationtest.Open(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now().UTC().Truncate(time.Second)
	at := now.Add(-10 * time.Minute)
	// bob's first event was estimated at 900 tokens and settled at 150
	// (same id, higher offset): he used 150 + 100, fewer than carol's 300.
	type ev struct {
		id, tenant, user   string
		prompt, completion uint64
		estimated          uint8
	}
	events := []ev{
		{"e1", "acme", "alice", 100, 200, 0}, {"e2", "acme", "alice", 50, 50, 0},
		{"e3", "acme", "bob", 400, 500, 1}, {"e3", "acme", "bob", 100, 50, 0}, {"e4", "acme", "bob", 60, 40, 0},
		{"e5", "beta", "carol", 100, 200, 0}, {"e6", "beta", "", 9000, 9000, 0},
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, user, estimated, kafka_offset)")
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range events {
		if err := b.Append(e.id, at, e.tenant, "gpt-4o", e.prompt, e.completion, e.user, e.estimated, int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	from, to := now.Add(-time.Hour).Unix(), now.Unix()
	for _, q := range qs {
		sql := timeFilter.ReplaceAllString(q.expr, fmt.Sprintf("$1 >= toDateTime(%d) AND $1 <= toDateTime(%d)", from, to))
		r, err := conn.Query(ctx, sql)
		if err != nil {
			t.Errorf("%s: %v\n\t%s", q.where, err, sql)
			continue
		}
		var got []string
		cols := r.Columns()
		for r.Next() {
			if strings.Join(cols, ",") != "tenant,user,tokens,requests" {
				break
			}
			var tenant, user string
			var tokens, requests uint64
			if err := r.Scan(&tenant, &user, &tokens, &requests); err != nil {
				t.Fatalf("%s: %v", q.where, err)
			}
			got = append(got, fmt.Sprintf("%s/%s=%d/%d", tenant, user, tokens, requests))
		}
		if err := r.Err(); err != nil {
			t.Errorf("%s: %v", q.where, err)
		}
		r.Close()
		if strings.Contains(q.where, "Top 10 users") {
			if want := "acme/alice=400/2 beta/carol=300/1 acme/bob=250/2"; strings.Join(got, " ") != want {
				t.Errorf("%s = %v; want %s", q.where, got, want)
			}
		}
	}
}
