package aggregator_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
)

// kcat returns the path of kcat, a librdkafka producer; scripts/services.sh
// installs it. Missing, the test is skipped, or fails under CI=true.
func kcat(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kcat")
	if err != nil {
		msg := "kcat (Debian package kcat) is not installed; `scripts/services.sh up` installs it"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// kcatProduce sends each event with kcat, keyed by tenant, with the given
// headers (name=value), through librdkafka's default partitioner
// (consistent_random: CRC32 of the key), unlike ingest's murmur2.
func kcatProduce(t *testing.T, bin string, e *env, headers []string, evs []schemas.UsageEvent) {
	t.Helper()
	var in bytes.Buffer
	for i := range evs {
		in.WriteString(evs[i].Tenant)
		in.WriteByte('\t')
		in.Write(eventjson.AppendUsageEventJSON(nil, &evs[i]))
		in.WriteByte('\n')
	}
	args := []string{"-P", "-b", strings.Join(e.kafka.Brokers, ","), "-t", e.topic, "-K", "\t", "-X", "acks=all"}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
}

// TestDirectProducersWithAnotherPartitioner: events of the same tenants
// produced side by side by ingest's client (murmur2 key partitioner) and by
// kcat (librdkafka, CRC32) land on different partitions; the counters must
// still be exact, a retry sent through both producers counted once, and
// records without schema=sluice.usage.v1 not counted at all.
func TestDirectProducersWithAnotherPartitioner(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	bin := kcat(t)
	e := setup(t)
	if err := os.WriteFile(e.policy, []byte("defaults:\n  timezone: UTC\n  models:\n    \"*\": {hourly_tokens: 100000000, daily_tokens: 100000000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const parts = 3 // itest.Kafka's partition count
	var tenants []string
	moved := 0
	for i := 0; len(tenants) < 8; i++ {
		tn := fmt.Sprintf("d%d", i)
		murmur := kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(tn)}, parts)
		if int(crc32.ChecksumIEEE([]byte(tn))%parts) != murmur {
			moved++
		}
		tenants = append(tenants, tn)
	}
	if moved < 3 {
		t.Fatalf("only %d of %d tenants land on different partitions under the two partitioners; pick other names", moved, len(tenants))
	}
	r := runInProcess(t, e, e.ch.Addr, nil)

	at := time.Now().UTC().Truncate(time.Second)
	want := map[string]int64{}
	var viaIngest, viaKcat []schemas.UsageEvent
	for i := range 240 {
		ev := schemas.UsageEvent{ID: fmt.Sprintf("x%d", i), Time: at, Tenant: tenants[i%len(tenants)], Model: "gpt-4o", PromptTokens: int64(100 + i), CompletionTokens: 7}
		want[ev.Tenant] += ev.TotalTokens()
		if i%2 == 0 {
			viaIngest = append(viaIngest, ev)
		} else {
			viaKcat = append(viaKcat, ev)
		}
	}
	// A gateway retrying through the other path: same ids, counted once.
	viaKcat = append(viaKcat, viaIngest[:10]...)
	viaIngest = append(viaIngest, viaKcat[:10]...)

	produceV1(t, e, viaIngest[:60])
	kcatProduce(t, bin, e, []string{"schema=" + schemas.SchemaUsageV1}, viaKcat)
	produceV1(t, e, viaIngest[60:])
	// Not usage event v1 records: no header, another major version.
	stray := []schemas.UsageEvent{{ID: "stray", Time: at, Tenant: tenants[0], Model: "gpt-4o", PromptTokens: 1_000_000}}
	kcatProduce(t, bin, e, nil, stray)
	kcatProduce(t, bin, e, []string{"schema=sluice.usage.v2"}, stray)

	itest.Eventually(t, 90*time.Second, "every record consumed", caughtUp(t, e))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tn := range tenants {
		for _, q := range []string{"hourly_tokens", "daily_tokens"} {
			var used float64
			if err := e.conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = ? AND model = '*' AND quota = ?", tn, q).Scan(&used); err != nil {
				t.Fatalf("%s %s: %v", tn, q, err)
			}
			if int64(used) != want[tn] {
				t.Errorf("tenant %s %s: quota_state used %v, the events sent total %d", tn, q, used, want[tn])
			}
		}
	}
	var stored uint64
	if err := e.conn.QueryRow(ctx, "SELECT count() FROM (SELECT tenant, id FROM usage_events GROUP BY tenant, id)").Scan(&stored); err != nil || stored != 240 {
		t.Errorf("usage_events holds %d distinct events (%v), want 240 (no stray record)", stored, err)
	}
	if got := r.metric(t, "sluice_aggregator_events_total", "wrong_schema"); got != 2 {
		t.Errorf("wrong_schema events %v, want 2", got)
	}
	if got := r.metric(t, "sluice_aggregator_events_total", "rerouted"); got == 0 {
		t.Error("no record was re-routed; the test does not exercise the other partitioner")
	}
}

// produceV1 sends events as ingest does: key tenant, murmur2 partitioner,
// header schema=sluice.usage.v1.
func produceV1(t testing.TB, e *env, evs []schemas.UsageEvent) {
	t.Helper()
	produce(t, e, evs)
}
