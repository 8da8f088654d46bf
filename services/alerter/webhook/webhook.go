// Package webhook is the alerter's generic webhook channel kind, for
// customers' own systems (billing, CRM, a tenant's on-call tooling): every
// notification is POSTed as JSON in the documented alert webhook format
// (schemas/jsonschema/alert-webhook.v1.json, docs/webhooks.md), one event
// per alert state change, and signed the way Standard Webhooks signs:
//
//	webhook-id:        the delivery's idempotency key (the body's id)
//	webhook-timestamp: Unix seconds of this attempt
//	webhook-signature: v1,<base64(HMAC-SHA256(key, id + "." + timestamp + "." + body))>
//
// with a second v1 entry while a previous secret is configured, so that a
// receiver can switch keys at its own pace. Verify is the receiver's check.
//
// Retries, back-off, rate limit and queue are the dispatcher's (package
// notify), as for every channel; ids are derived from the alert's state, so
// a retry, or a notification the alerter persisted and sends after a
// restart, carries the same ids and a receiver can drop the repeat.
package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Schema is the value of every payload's schema field, the format's name
// and version: a change that could break a receiver gets a new one.
const Schema = "sluice.alerts.v1"

// The signature headers, as Standard Webhooks names them (HTTP header
// names are case-insensitive; Go sends them as Webhook-Id …).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// UserAgent names the alerter in every delivery's User-Agent header, so a
// receiver's logs tell its deliveries from other traffic.
const UserAgent = "sluice-alerter"

// MinKeyBytes is the shortest signing key accepted: a guessable key would
// let anyone forge alerts to the receiver.
const MinKeyBytes = 16

// Payload is one delivery: one notification of the alerter, which carries
// one alert's state change, or an incident grouping several of one rule,
// severity and status (see the alerter's rules.group_threshold).
type Payload struct {
	// Schema is always Schema.
	Schema string `json:"schema"`
	// ID is the delivery's idempotency key, also sent as webhook-id: the
	// event's id for a delivery of one event, else derived from the ids of
	// its events.
	ID string `json:"id"`
	// Status is firing or resolved, the status of every event.
	Status alert.Status `json:"status"`
	// Incident says the delivery groups more than one event.
	Incident bool `json:"incident"`
	// Title and Text are the notification rendered as plain text by the
	// alerter's message templates, in the tenant's language (the
	// operator's for an incident), for receivers that forward to people.
	Title string `json:"title"`
	Text  string `json:"text"`
	// Events holds one entry per alert, at least one.
	Events []Event `json:"events"`
}

// Event is one alert's state change.
type Event struct {
	// ID is the event's idempotency key: the same for every delivery of
	// this state change, different for any other.
	ID string `json:"id"`
	// Type names the condition (see EventType); Status says whether it
	// began (firing, or escalated to a higher tier or severity) or ended.
	Type     string       `json:"type"`
	Status   alert.Status `json:"status"`
	Severity string       `json:"severity"`
	// Rule and AlertName are the alerter's rule and its Alertmanager
	// alertname.
	Rule      alert.Rule `json:"rule"`
	AlertName string     `json:"alertname"`
	Tenant    string     `json:"tenant"`
	Model     string     `json:"model"`
	Period    string     `json:"period,omitempty"`
	Quota     string     `json:"quota,omitempty"`
	Variant   string     `json:"variant,omitempty"`
	// Tier is the quota tier in percent, for quota_tier alerts only.
	Tier int `json:"tier,omitempty"`
	// Used, Limit (absent without one) and RatePerMinute are in Unit.
	Used                float64    `json:"used"`
	Limit               float64    `json:"limit,omitempty"`
	Percent             float64    `json:"percent,omitempty"`
	Unit                string     `json:"unit,omitempty"`
	RatePerMinute       float64    `json:"rate_per_minute,omitempty"`
	Mode                string     `json:"mode,omitempty"`
	PredictedExhaustion *time.Time `json:"predicted_exhaustion,omitempty"`
	PeriodEnd           *time.Time `json:"period_end,omitempty"`
	// StartsAt is when the alert began firing; EndsAt, for a resolved
	// event, when it resolved.
	StartsAt time.Time  `json:"starts_at"`
	EndsAt   *time.Time `json:"ends_at,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	// Summary and Description are the plain-text annotations Alertmanager
	// gets, in the tenant's language.
	Summary      string `json:"summary"`
	Description  string `json:"description"`
	DashboardURL string `json:"dashboard_url,omitempty"`
	RunbookURL   string `json:"runbook_url,omitempty"`
	// Labels is the alert's Alertmanager label set.
	Labels     map[string]string `json:"labels"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// EventTypes lists every value of Event.Type (the schema's enum).
var EventTypes = []string{
	"quota.tier_crossed", "quota.exhausted", "quota.exhaustion_predicted",
	"budget.tier_crossed", "budget.exhausted", "budget.exhaustion_predicted",
	"rate.exceeded", "breaker.open", "anomaly.detected", "reconciliation.drift",
}

// EventType names the condition of a: the subject (quota, or budget for
// the currency quota) and what happened to it. A resolved event keeps the
// type of what it ends: breaker.open resolved is the breaker closing.
func EventType(a *alert.Alert) string {
	subject := "quota"
	if a.Key.Quota == string(schemas.QuotaBudget) {
		subject = "budget"
	}
	switch a.Key.Rule {
	case alert.RuleQuotaTier:
		if a.Tier >= 100 {
			return subject + ".exhausted"
		}
		return subject + ".tier_crossed"
	case alert.RuleExhaustionPredicted:
		return subject + ".exhaustion_predicted"
	case alert.RuleRateExceeded:
		return "rate.exceeded"
	case alert.RuleBreakerOpen:
		return "breaker.open"
	case alert.RuleAnomaly:
		return "anomaly.detected"
	case alert.RuleReconciliationDrift:
		return "reconciliation.drift"
	}
	return "alert." + string(a.Key.Rule)
}

// EventID is a's idempotency key: a hash of its key, status, severity,
// tier and the times it started and ended, which are set once when the
// alerter decides and kept in its persisted state. So a retry, or a held
// notification sent after a restart, repeats the id, and every other
// state change (an escalation, a resolution, the next firing) gets another.
func EventID(a *alert.Alert) string {
	k := a.Key
	ends := ""
	if a.Status == alert.StatusResolved {
		ends = a.EndsAt.UTC().Format(time.RFC3339Nano)
	}
	return schemas.SignalID("sluice.alerts.v1/event", k.Tenant, k.Model, k.Period, k.Quota, string(k.Rule), k.Variant,
		string(a.Status), a.Severity.String(), strconv.Itoa(a.Tier), a.StartsAt.UTC().Format(time.RFC3339Nano), ends)
}

// Key returns the signing key of secret: the base64 after "whsec_" (the
// Standard Webhooks form, which its libraries take as is), or else the
// secret's own bytes. Errors never quote the secret.
func Key(secret string) ([]byte, error) {
	key := []byte(secret)
	if b64, ok := strings.CutPrefix(secret, "whsec_"); ok {
		var err error
		if key, err = base64.StdEncoding.DecodeString(b64); err != nil {
			return nil, errors.New("the part after whsec_ is not standard base64 (the value is not shown)")
		}
	}
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("a key of %d bytes is too short; use at least %d (32 random bytes, e.g. whsec_ followed by `openssl rand -base64 32`)", len(key), MinKeyBytes)
	}
	return key, nil
}

// Sign returns the webhook-signature entry of body for key.
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + strconv.FormatInt(timestamp, 10) + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Sender posts to one webhook.
type Sender struct {
	url string
	// keys sign every delivery: the current secret's first, then the
	// previous one's while a rotation lasts.
	keys [][]byte
	// tenant, when set, binds the channel to one tenant: alerts of other
	// tenants are never sent to it.
	tenant string
	client *http.Client
	render *message.Renderer
	now    func() time.Time
}

// New returns a sender to url signing with secret (and previous, when not
// empty, during a rotation); a non-empty tenant binds the channel to it.
func New(url, secret, previous, tenant string, render *message.Renderer, client *http.Client) (*Sender, error) {
	if _, err := notify.ParseURL(url); err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	s := &Sender{url: url, tenant: tenant, client: client, render: render, now: time.Now}
	for _, kv := range [][2]string{{"secret", secret}, {"previous_secret", previous}} {
		if kv[1] == "" && kv[0] == "previous_secret" {
			continue
		}
		key, err := Key(kv[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kv[0], err)
		}
		s.keys = append(s.keys, key)
	}
	if s.client == nil {
		s.client = http.DefaultClient
	}
	return s, nil
}

// errForeign is returned for a message that holds only alerts of tenants
// other than the one the channel is bound to: a routing mistake (an
// operator channel, or another tenant's policy naming this channel) that
// must not reach this tenant's receiver.
var errForeign = errors.New("webhook: the channel is bound to one tenant and this notification holds only other tenants' alerts; not sent (check operator_channels and the tenants' channels in the policy)")

// Send renders m and posts it, signed.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	if s.tenant != "" {
		own := slices.DeleteFunc(slices.Clone(m.Alerts), func(a alert.Alert) bool { return a.Key.Tenant != s.tenant })
		if len(own) == 0 {
			return notify.Permanent(errForeign)
		}
		m.Alerts = own
	}
	p, err := s.Payload(&m)
	if err != nil {
		return notify.Permanent(err)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return notify.Permanent(err)
	}
	// Signed per attempt, so that a retry minutes later still falls within
	// the receiver's replay window.
	ts := s.now().Unix()
	sigs := make([]string, len(s.keys))
	for i, k := range s.keys {
		sigs[i] = Sign(k, p.ID, ts, body)
	}
	h := http.Header{
		"Content-Type":  {"application/json"},
		"User-Agent":    {UserAgent},
		HeaderID:        {p.ID},
		HeaderTimestamp: {strconv.FormatInt(ts, 10)},
		HeaderSignature: {strings.Join(sigs, " ")},
	}
	_, err = notify.Post(ctx, s.client, "webhook", s.url, h, body)
	return err
}

// Payload builds m's delivery.
func (s *Sender) Payload(m *alert.Message) (*Payload, error) {
	if len(m.Alerts) == 0 {
		return nil, errors.New("webhook: a notification without alerts")
	}
	title, text, err := s.render.Message(m, message.Plain)
	if err != nil {
		return nil, err
	}
	p := &Payload{Schema: Schema, Status: m.Status(), Incident: m.Incident(), Title: title, Text: text,
		Events: make([]Event, 0, len(m.Alerts))}
	ids := make([]string, 0, len(m.Alerts)+1)
	ids = append(ids, "sluice.alerts.v1/delivery")
	for i := range m.Alerts {
		e, err := s.event(&m.Alerts[i])
		if err != nil {
			return nil, err
		}
		p.Events = append(p.Events, e)
		ids = append(ids, e.ID)
	}
	p.ID = p.Events[0].ID
	if len(p.Events) > 1 {
		p.ID = schemas.SignalID(ids...)
	}
	return p, nil
}

func (s *Sender) event(a *alert.Alert) (Event, error) {
	summary, desc, err := s.render.Annotations(a)
	if err != nil {
		return Event{}, err
	}
	dash, runbook := s.render.Links(a)
	e := Event{
		ID: EventID(a), Type: EventType(a), Status: a.Status, Severity: a.Severity.String(),
		Rule: a.Key.Rule, AlertName: a.Key.Rule.AlertName(),
		Tenant: a.Key.Tenant, Model: a.Key.Model, Period: a.Key.Period, Quota: a.Key.Quota, Variant: a.Key.Variant,
		Used: a.Used, Limit: a.Limit, Unit: a.Unit, RatePerMinute: a.Rate, Mode: a.Mode,
		StartsAt: a.StartsAt.UTC(), Reason: a.Reason, Summary: summary, Description: desc,
		DashboardURL: dash, RunbookURL: runbook, Labels: a.Labels(),
	}
	if a.Key.Rule == alert.RuleQuotaTier {
		e.Tier = a.Tier
	}
	if a.Limit > 0 {
		e.Percent = math.Round(a.Percent()*100) / 100
	}
	if a.PredictedExhaustion != nil {
		t := a.PredictedExhaustion.UTC()
		e.PredictedExhaustion = &t
	}
	if !a.PeriodEnd.IsZero() {
		t := a.PeriodEnd.UTC()
		e.PeriodEnd = &t
	}
	if a.Status == alert.StatusResolved && !a.EndsAt.IsZero() {
		t := a.EndsAt.UTC()
		e.EndsAt = &t
	}
	if len(a.Attributes) > 0 {
		e.Attributes = a.Attributes
	}
	return e, nil
}
