package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// ingestAnswer is the JSON body of every ingest answer.
type ingestAnswer struct {
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	Error      string `json:"error"`
	Rejected   []struct {
		Index  int    `json:"index"`
		ID     string `json:"id"`
		Errors []struct {
			Field  string `json:"field"`
			Reason string `json:"reason"`
		} `json:"errors"`
	} `json:"rejected"`
}

// eventJSON is a valid usage event of tenant with the given tokens.
func eventJSON(id, tenant string, at time.Time, prompt, completion int64) string {
	return fmt.Sprintf(`{"id":%q,"time":%q,"tenant":%q,"model":"gpt-4o-mini","prompt_tokens":%d,"completion_tokens":%d}`,
		id, at.UTC().Format(time.RFC3339Nano), tenant, prompt, completion)
}

// TestBadInput sends every kind of bad input a gateway can produce and
// checks that each gets a clear error naming the field or the limit, that
// the valid events of the same requests are all stored and counted once,
// that a broken policy file leaves the old limits enforced, and that no
// service process exits.
func TestBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	t.Parallel()
	sfx := randomKey()[7:15]
	known, unknown, scoped := "e2e-bad-"+sfx, "e2e-unknown-"+sfx, "e2e-scoped-"+sfx
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{known: 1000}), ScopedTenant: scoped})
	s.startAll("ingest", "aggregator", "enforcer")
	ctx := context.Background()
	now := time.Now()
	acked := map[string]map[string]uint64{known: {}, unknown: {}}
	n := 0
	valid := func(tenant string, tokens int64) string {
		n++
		id := fmt.Sprintf("ok-%s-%d", sfx, n)
		acked[tenant][id] = uint64(tokens)
		return eventJSON(id, tenant, now, tokens-1, 1)
	}

	type badCase struct {
		name        string
		key         string
		contentType string
		body        []byte
		wantStatus  int
		// wantField is the field every rejected event must name; wantText
		// must appear in the whole answer (a limit, a byte offset).
		wantField string
		wantText  string
		rejected  int
	}
	huge := bytes.Repeat([]byte(" "), 9<<20)
	huge = append([]byte("["+valid(known, 7)), huge...)
	delete(acked[known], fmt.Sprintf("ok-%s-%d", sfx, n)) // refused whole: 413
	cases := []badCase{
		// One malformed element of a batch is rejected alone, naming the byte.
		{name: "malformed event in a batch", body: []byte(`[` + valid(known, 10) + `, {"id": "broken", "tenant": }]`),
			wantStatus: 207, wantText: "not well-formed JSON at byte", rejected: 1},
		// A body that cannot be framed is refused whole, naming the offset.
		{name: "unframeable body", body: []byte(`[` + eventJSON("frame-1", known, now, 1, 1) + `, {"id": "x"`),
			wantStatus: 400, wantText: "byte"},
		{name: "wrong types", body: []byte(`[` + valid(known, 20) + `,` +
			`{"id":"wt-1","time":"` + now.UTC().Format(time.RFC3339) + `","tenant":"` + known + `","model":"m","prompt_tokens":"12","completion_tokens":1}]`),
			wantStatus: 207, wantField: "prompt_tokens", rejected: 1},
		{name: "negative tokens", body: []byte(`[` + valid(known, 30) + `,` + eventJSON("neg-1", known, now, -5, 1) + `]`),
			wantStatus: 207, wantField: "prompt_tokens", wantText: "-5", rejected: 1},
		{name: "overflowing tokens", body: []byte(`[` + valid(known, 40) + `,` + eventJSON("ovf-1", known, now, 1, 1_000_000_001) + `,` +
			`{"id":"ovf-2","time":"` + now.UTC().Format(time.RFC3339) + `","tenant":"` + known + `","model":"m","prompt_tokens":1e30,"completion_tokens":1}]`),
			wantStatus: 207, wantText: "1000000000", rejected: 2},
		{name: "huge body", body: huge, wantStatus: 413, wantText: "max_body_bytes"},
		{name: "far past", body: []byte(`[` + valid(known, 50) + `,` + eventJSON("past-1", known, now.Add(-80*time.Hour), 1, 1) + `]`),
			wantStatus: 207, wantField: "time", rejected: 1},
		{name: "far future", body: []byte(`[` + valid(known, 60) + `,` + eventJSON("future-1", known, now.Add(3*time.Hour), 1, 1) + `]`),
			wantStatus: 207, wantField: "time", rejected: 1},
		{name: "bad API key", key: "sk-not-a-key", body: []byte(eventJSON("badkey-1", known, now, 1, 1)), wantStatus: 401},
		{name: "no API key", key: "-", body: []byte(eventJSON("nokey-1", known, now, 1, 1)), wantStatus: 401},
		{name: "tenant outside the key's scope", key: s.scopedKey, body: []byte(eventJSON("scope-1", known, now, 1, 1)),
			wantStatus: 403, wantField: "tenant", rejected: 1},
		{name: "unknown content type", contentType: "text/csv", body: []byte("a,b"), wantStatus: 415},
		{name: "tenant unknown to the policy", body: []byte(`[` + valid(unknown, 70) + `]`), wantStatus: 202},
	}
	for _, c := range cases {
		key := c.key
		switch key {
		case "":
			key = s.ingestKey
		case "-":
			key = ""
		}
		ct := c.contentType
		if ct == "" {
			ct = "application/json"
		}
		code, body, _, err := s.postEvents(ctx, key, ct, c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if code != c.wantStatus {
			t.Errorf("%s: status %d, want %d: %.300s", c.name, code, c.wantStatus, body)
			continue
		}
		var ans ingestAnswer
		if err := json.Unmarshal(body, &ans); err != nil {
			t.Errorf("%s: answer is not JSON: %v: %.300s", c.name, err, body)
			continue
		}
		if c.wantText != "" && !strings.Contains(string(body), c.wantText) {
			t.Errorf("%s: answer does not mention %q: %.300s", c.name, c.wantText, body)
		}
		if len(ans.Rejected) != c.rejected {
			t.Errorf("%s: %d events rejected, want %d: %.300s", c.name, len(ans.Rejected), c.rejected, body)
		}
		if c.wantField != "" {
			for _, r := range ans.Rejected {
				if len(r.Errors) == 0 || r.Errors[0].Field != c.wantField || r.Errors[0].Reason == "" {
					t.Errorf("%s: rejection %+v does not name the field %s with a reason", c.name, r, c.wantField)
				}
			}
		}
		if code >= 400 && ans.Error == "" && len(ans.Rejected) == 0 {
			t.Errorf("%s: status %d without an error message: %s", c.name, code, body)
		}
	}

	// Duplicate ids, in one request and across requests, count once.
	dup := fmt.Sprintf("dup-%s", sfx)
	acked[known][dup] = 80
	one := eventJSON(dup, known, now, 79, 1)
	code, body, _, err := s.postEvents(ctx, s.ingestKey, "application/json", []byte("["+one+","+one+"]"))
	if err != nil || code/100 != 2 {
		t.Fatalf("duplicate ids in one request: %d %v %s", code, err, body)
	}
	code, body, _, err = s.postEvents(ctx, s.ingestKey, "application/json", []byte(one))
	var ans ingestAnswer
	if err != nil || code != 202 || json.Unmarshal(body, &ans) != nil || ans.Duplicates != 1 {
		t.Fatalf("a repeated id must be acknowledged as a duplicate: %d %v %s", code, err, body)
	}

	s.countersMatchTruth(t, acked)
	s.requireAlive()

	// A broken policy file: the reload fails, is reported, and the old
	// limits stay in force.
	s.writePolicy("defaults: [this is: not a policy\n")
	itest.EventuallyNoError(t, waitTimeout, "aggregator reports the failed policy reload", func() error {
		if !strings.Contains(s.metrics("aggregator"), "sluice_aggregator_policy_reload_failures_total 1") &&
			!metricPositive(s.metrics("aggregator"), "sluice_aggregator_policy_reload_failures_total") {
			return fmt.Errorf("no reload failure counted yet")
		}
		return nil
	})
	itest.EventuallyNoError(t, waitTimeout, "enforcer logs the failed policy reload", func() error {
		b, err := os.ReadFile(s.proc("enforcer").logPath)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("policy reload failed; keeping the previous policy")) {
			return fmt.Errorf("not logged yet")
		}
		return nil
	})
	// known has used 10+20+30+40+50+60+80 - 10 = 280 of its 1000 hourly
	// tokens; 800 more cross the old limit.
	over := fmt.Sprintf("over-%s", sfx)
	code, body, _, err = s.postEvents(ctx, s.ingestKey, "application/json", []byte(eventJSON(over, known, now, 799, 1)))
	if err != nil || code != 202 {
		t.Fatalf("event over the old limit: %d %v %s", code, err, body)
	}
	itest.EventuallyNoError(t, waitTimeout, "the old hourly limit is enforced under a broken policy file", func() error {
		f, err := s.flag(ctx, known, flags.AllModels)
		if err != nil {
			return err
		}
		if f == nil || f.Kind != flags.KindQuota || f.Quota != "hourly_tokens" || f.Limit != 1000 {
			return fmt.Errorf("flag %+v", f)
		}
		return nil
	})
	s.requireAlive()
}

// metricPositive reports whether the unlabelled sample name is above zero.
func metricPositive(text, name string) bool {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v != "0"
		}
	}
	return false
}
