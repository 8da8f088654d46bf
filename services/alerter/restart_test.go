package alerter

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// alerterProc is one `sluice run alerter` process.
type alerterProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// TestKill9AndRestartSendsNothingTwice crashes the alerter process with
// SIGKILL after it notified two alerts on a DingTalk robot and a Slack
// webhook, restarts it, and checks that the restart announces nothing
// again, that an alert whose condition ended while it was down resolves
// (once) rather than being forgotten or re-announced, and that each
// notification reached each receiver exactly once.
func TestKill9AndRestartSendsNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sluice binary")
	}
	kcfg := itest.Kafka(t)
	topic := itest.Unique(t, "signals_")
	tenant := itest.Unique(t, "crash_")
	ding, sl := newReceiver(t, "dingtalk"), newReceiver(t, "slack")

	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	conf := filepath.Join(dir, "sluice.yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: [%q]
services:
  alerter:
    topic: %q
    group: %q
    session_timeout: 6s
    tick: 50ms
    default_channels: [dingtalk:ops, slack:noc]
    channels:
      dingtalk: {ops: {webhook: %q, secret: %q}}
      slack: {noc: {webhook: %q}}
    rules: {pending_for: 0s, resolve_after: 0s, group_wait: 0s}
`, kcfg.Brokers[0], topic, topic, ding.url(), robotSecret, sl.url())
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	start := func(n int) *alerterProc {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ops := ln.Addr().String()
		ln.Close()
		p := &alerterProc{done: make(chan struct{}), log: filepath.Join(dir, fmt.Sprintf("alerter-%d.log", n))}
		logf, err := os.Create(p.log)
		if err != nil {
			t.Fatal(err)
		}
		p.cmd = exec.Command(bin, "run", "-config", conf, "-migrate=false", "-log.format=text", "-ops.listen="+ops, "alerter")
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = p.cmd.Wait(); logf.Close(); close(p.done) }()
		t.Cleanup(func() {
			_ = p.cmd.Process.Kill()
			<-p.done
			if t.Failed() {
				b, _ := os.ReadFile(p.log)
				t.Logf("alerter %d log:\n%s", n, b)
			}
		})
		itest.EventuallyNoError(t, 60*time.Second, "the alerter's /readyz answers 200", func() error {
			select {
			case <-p.done:
				b, _ := os.ReadFile(p.log)
				t.Fatalf("alerter exited: %s", b)
			default:
			}
			resp, err := http.Get("http://" + ops + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("readyz %d", resp.StatusCode)
			}
			return nil
		})
		return p
	}

	cl, err := kafkaconn.NewClient(kcfg, kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := kafkaconn.EnsureTopics(ctx, cl, kcfg, topic); err != nil {
		t.Fatal(err)
	}
	produce := func(s *schemas.Signal) {
		t.Helper()
		b, err := schemas.EncodeSignal(s)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Key: []byte(tenant), Value: b,
			Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	tier := tierSignal(tenant, 70, 90, now)
	exhaustion := func(at time.Time, lead time.Duration) *schemas.Signal {
		sigSeq++
		p := at.Add(lead)
		return &schemas.Signal{ID: fmt.Sprintf("x%d", sigSeq), Kind: schemas.SignalExhaustionPredicted, Time: at, Tenant: tenant, Model: "*",
			Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodStart: tier.PeriodStart, PeriodEnd: tier.PeriodEnd,
			Used: 900000, Limit: 1000000, Rate: 20000, Unit: schemas.UnitTokens, Mode: schemas.ModeHard, PredictedExhaustion: &p}
	}
	tierTitle := "[warning] " + tenant + ": monthly_tokens quota at 90%"
	exhaustTitle := "[critical] " + tenant + ": monthly_tokens quota predicted to run out"
	resolvedTitle := "[RESOLVED] " + tenant + ": monthly_tokens quota predicted to run out"
	has := func(r *receiver, titles ...string) func() bool {
		return func() bool {
			got, _, _ := r.got()
			for _, want := range titles {
				if !slices.Contains(got, want) {
					return false
				}
			}
			return true
		}
	}

	first := start(1)
	produce(tier)
	produce(exhaustion(now, 5*time.Minute))
	for _, r := range []*receiver{ding, sl} {
		itest.Eventually(t, 60*time.Second, r.kind+" notified of both alerts", has(r, tierTitle, exhaustTitle))
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done

	// The restart produces nothing new; then one signal says the predicted
	// exhaustion is far away now, which must resolve the alert.
	second := start(2)
	produce(exhaustion(time.Now().UTC(), 100*time.Hour))
	for _, r := range []*receiver{ding, sl} {
		itest.Eventually(t, 90*time.Second, r.kind+" told the prediction resolved", has(r, resolvedTitle))
	}
	// A graceful stop sends whatever is still queued, so that the counts
	// below are final.
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the alerter did not stop within 60s of SIGTERM")
	}
	// One tick may notify both alerts, in key order; the order within it
	// is not the point.
	want := []string{tierTitle, exhaustTitle, resolvedTitle}
	slices.Sort(want)
	for _, r := range []*receiver{ding, sl} {
		got, _, errs := r.got()
		slices.Sort(got)
		if len(errs) > 0 {
			t.Errorf("%s refused messages: %v", r.kind, errs)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s received:\n  %s\nwant each notification exactly once:\n  %s", r.kind, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}
