package alerter

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// crashRig runs `sluice run alerter` as a process against the real Kafka,
// a unique signals topic and group, and stand-ins for every direct channel
// kind (DingTalk, Slack, Feishu, WeCom and a webhook endpoint), so that a
// test can kill it with SIGKILL and start it again.
type crashRig struct {
	t         *testing.T
	tenant    string
	ding, sl  *receiver
	fs, wc    *receiver
	hook      *receiver
	bin, conf string
	dir       string
	cl        *kgo.Client
	n         int
}

// alerterProc is one `sluice run alerter` process.
type alerterProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	ops  string
}

func newCrashRig(t *testing.T, rules string) *crashRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the sluice binary")
	}
	kcfg := itest.Kafka(t)
	topic := itest.Unique(t, "signals_")
	r := &crashRig{t: t, tenant: itest.Unique(t, "crash_"), ding: newReceiver(t, "dingtalk"), sl: newReceiver(t, "slack"),
		fs: newReceiver(t, "feishu"), wc: newReceiver(t, "wecom"), hook: newReceiver(t, "webhook"), dir: t.TempDir()}
	r.bin = filepath.Join(r.dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", r.bin, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r.conf = filepath.Join(r.dir, "sluice.yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: [%q]
signal_auth:
  keys: [%q]
topics: {signals: %q}
services:
  alerter:
    consumer: {group: %q, session_timeout: 6s}
    tick: 50ms
    default_channels: [dingtalk:ops, slack:noc, feishu:ops, wecom:ops, webhook:ops]
    channels:
      dingtalk: {ops: {webhook: %q, secret: %q}}
      slack: {noc: {webhook: %q}}
      feishu: {ops: {webhook: %q, secret: %q}}
      wecom: {ops: {webhook: %q, msgtype: template_card, card_url: "https://ops.example/sluice"}}
      webhook: {ops: {url: %q, secret: %q}}
    rules: %s
`, kcfg.Brokers[0], testSignalAuth.Keys[0], topic, topic, r.ding.url(), robotSecret, r.sl.url(),
		r.fs.url(), robotSecret, r.wc.url(), r.hook.url(), robotSecret, rules)
	if err := os.WriteFile(r.conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := kafkaconn.NewClient(kcfg, kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := kafkaconn.EnsureTopics(context.Background(), cl, kcfg, topic); err != nil {
		t.Fatal(err)
	}
	r.cl = cl
	return r
}

// start runs the alerter and waits until it is ready.
func (r *crashRig) start() *alerterProc {
	t := r.t
	t.Helper()
	r.n++
	n := r.n
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops := ln.Addr().String()
	ln.Close()
	p := &alerterProc{done: make(chan struct{}), log: filepath.Join(r.dir, fmt.Sprintf("alerter-%d.log", n)), ops: ops}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(r.bin, "run", "-config", r.conf, "-migrate=false", "-log.format=text", "-ops.listen="+ops, "alerter")
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

// metric reads one unlabelled sample of the process's /metrics, 0 if absent.
func (p *alerterProc) metric(name string) float64 {
	resp, err := http.Get("http://" + p.ops + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func (r *crashRig) kill9(p *alerterProc) {
	r.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	<-p.done
}

// stop ends p gracefully, which sends whatever is still queued, so that
// what the receivers hold afterwards is final.
func (r *crashRig) stop(p *alerterProc) {
	r.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		r.t.Fatal("the alerter did not stop within 60s of SIGTERM")
	}
}

func (r *crashRig) produce(s *schemas.Signal) {
	r.t.Helper()
	b, err := schemas.EncodeSignal(s)
	if err != nil {
		r.t.Fatal(err)
	}
	rec := testSigner.Record("", []byte(r.tenant), b)
	if err := r.cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
}

// receivers are the stand-ins of every channel the rig's alerter notifies.
func (r *crashRig) receivers() []*receiver { return []*receiver{r.ding, r.sl, r.fs, r.wc, r.hook} }

// waitFor waits until every receiver holds every title.
func (r *crashRig) waitFor(within time.Duration, what string, titles ...string) {
	r.t.Helper()
	for _, rc := range r.receivers() {
		itest.Eventually(r.t, within, rc.kind+": "+what, func() bool {
			got, _, _ := rc.got()
			for _, want := range titles {
				if !slices.Contains(got, want) {
					return false
				}
			}
			return true
		})
	}
}

// exactlyOnce checks that each receiver got want, each title once, in any
// order (one tick may notify several alerts, in key order), and that the
// webhook endpoint saw no event id twice.
func (r *crashRig) exactlyOnce(want ...string) {
	r.t.Helper()
	want = slices.Sorted(slices.Values(want))
	if ids := r.hook.eventIDs(); len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) || len(ids) != len(want) {
		r.t.Errorf("webhook event ids %v: want %d, none twice", ids, len(want))
	}
	for _, rc := range r.receivers() {
		got, _, errs := rc.got()
		slices.Sort(got)
		if len(errs) > 0 {
			r.t.Errorf("%s refused messages: %v", rc.kind, errs)
		}
		if !slices.Equal(got, want) {
			r.t.Errorf("%s received:\n  %s\nwant each notification exactly once:\n  %s", rc.kind, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}

func (r *crashRig) exhaustion(at time.Time, lead time.Duration, like *schemas.Signal) *schemas.Signal {
	sigSeq++
	p := at.Add(lead)
	return &schemas.Signal{ID: fmt.Sprintf("x%d", sigSeq), Kind: schemas.SignalExhaustionPredicted, Time: at, Tenant: r.tenant, Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodStart: like.PeriodStart, PeriodEnd: like.PeriodEnd,
		Used: 900000, Limit: 1000000, Rate: 20000, Unit: schemas.UnitTokens, Mode: schemas.ModeHard, PredictedExhaustion: &p}
}

// TestKill9AndRestartSendsNothingTwice crashes the alerter process with
// SIGKILL after it notified two alerts on a DingTalk robot, a Slack
// webhook, a Feishu bot, a WeCom robot and a webhook endpoint, restarts
// it, and checks that the restart announces nothing again, that an alert
// whose condition ends after the restart resolves (once) rather than being
// forgotten or re-announced, and that each notification reached each
// receiver exactly once (the webhook endpoint: no event id twice).
func TestKill9AndRestartSendsNothingTwice(t *testing.T) {
	r := newCrashRig(t, "{pending_for: 0s, resolve_after: 0s, group_wait: 0s}")
	tier := tierSignal(r.tenant, 70, 90, time.Now().UTC())
	tierTitle := "[warning] " + r.tenant + ": monthly_tokens quota at 90%"
	exhaustTitle := "[critical] " + r.tenant + ": monthly_tokens quota predicted to run out"
	resolvedTitle := "[RESOLVED] " + r.tenant + ": monthly_tokens quota predicted to run out"

	first := r.start()
	r.produce(tier)
	r.produce(r.exhaustion(time.Now().UTC(), 5*time.Minute, tier))
	r.waitFor(60*time.Second, "notified of both alerts", tierTitle, exhaustTitle)
	r.kill9(first)

	// The restart produces nothing new; then one signal says the predicted
	// exhaustion is far away now, which must resolve the alert.
	second := r.start()
	r.produce(r.exhaustion(time.Now().UTC(), 100*time.Hour, tier))
	r.waitFor(90*time.Second, "told the prediction resolved", resolvedTitle)
	r.stop(second)
	r.exactlyOnce(tierTitle, exhaustTitle, resolvedTitle)
}

// TestKill9DuringGroupWaitLosesNothing crashes the alerter while a
// notification waits rules.group_wait for grouping: the alert's state
// already says it was sent, so the held notification itself must survive
// the crash and go out once after the restart.
func TestKill9DuringGroupWaitLosesNothing(t *testing.T) {
	// group_wait is long enough that the kill lands inside it on any
	// machine; the test checks that it did.
	r := newCrashRig(t, "{pending_for: 0s, resolve_after: 0s, group_wait: 20s}")
	tierTitle := "[warning] " + r.tenant + ": monthly_tokens quota at 90%"

	first := r.start()
	r.produce(tierSignal(r.tenant, 70, 90, time.Now().UTC()))
	// The alert's state and one held notification per channel.
	itest.Eventually(t, 30*time.Second, "the alert and its held notifications stored", func() bool {
		return first.metric("sluice_alerter_state_writes_total") >= float64(1+len(r.receivers()))
	})
	r.kill9(first)
	for _, rc := range r.receivers() {
		if got, _, _ := rc.got(); len(got) > 0 {
			t.Fatalf("%s was notified before the kill (%v): group_wait passed before it, the test proves nothing", rc.kind, got)
		}
	}

	second := r.start()
	r.waitFor(90*time.Second, "notified after the restart", tierTitle)
	r.stop(second)
	r.exactlyOnce(tierTitle)
}
