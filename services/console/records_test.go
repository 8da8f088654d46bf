package console

import (
	"context"
	"html"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
)

var monthlyLimitRE = regexp.MustCompile(`data-model="\*" data-quota="monthly_tokens" data-used="[^"]*" data-limit="([^"]*)"`)

// monthlyLimit is the limit tenant's page shows for monthly_tokens of all
// models, "" for none.
func (c *keyConsole) monthlyLimit(tenant string) string {
	c.t.Helper()
	m := monthlyLimitRE.FindStringSubmatch(c.do(nil, http.MethodGet, "/tenants/"+tenant, nil).Body.String())
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// Review finding: a tenant that exists only as an admin API record and
// has no use yet showed the policy file's defaults in the console's quota
// table, the console's policy being the file's alone. Following the admin
// topic (follow_admin), the console lays the records over its file as the
// gateways do, and the table shows the record's quotas: the policy in
// force.
func TestARecordTenantWithoutUseShowsItsRecordsQuotas(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	kc, sa := itest.Kafka(t), itest.SignalAuth(t)
	topic := itest.Unique(t, "console_admin_")
	c := newKeyConsole(t)
	if err := os.WriteFile(c.file, []byte(testPolicy+"defaults:\n  models:\n    \"*\":\n      monthly_tokens: 777\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !c.policy.Reload() {
		t.Fatal(c.policy.LastError())
	}
	if got := c.monthlyLimit("green"); got != "777" {
		t.Fatalf("green, of no file nor record: monthly limit %q; want the defaults' 777", got)
	}
	// The record is on the topic before the console follows it, as for a
	// console started after the tenant was made.
	controlplanetest.ProduceTenant(t, kc, sa, topic, "green", `{"models":{"*":{"monthly_tokens":1000000}}}`)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		followRecords(ctx, platform.Env{Kafka: kc, Topics: platform.Topics{Admin: topic}, SignalAuth: sa, Logger: itest.Logger(t)}.Named("console"), c.policy)
	}()
	t.Cleanup(func() { cancel(); <-done })

	itest.Eventually(t, 30*time.Second, "green's record laid over the console's policy", func() bool { return c.monthlyLimit("green") != "777" })
	if got := c.monthlyLimit("green"); got != "1e+06" {
		t.Fatalf("green, a record without use: monthly limit %q; want the record's 1e+06", got)
	}
}

// A console told to follow the admin topic refuses to start without one
// it can name, rather than serve the file's quotas while the operator
// believes the records are shown.
func TestFollowAdminNeedsTheAdminTopic(t *testing.T) {
	c := DefaultConfig()
	c.FollowAdmin = true
	if _, err := New(c, platform.Env{}); err == nil || !strings.Contains(err.Error(), "topics.admin") || !strings.Contains(err.Error(), "follow_admin") {
		t.Fatalf("follow_admin without topics.admin: %v; want an error naming both", err)
	}
	if _, err := New(c, platform.Env{Topics: platform.Topics{Admin: "team-a.admin.v1"}}); err != nil {
		t.Fatal(err) // a valid name; nothing runs, no broker needed
	}
}
