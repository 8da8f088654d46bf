// Package alertmanager posts alerts to the Prometheus Alertmanager v2 API
// (POST /api/v2/alerts): labels identify an alert, annotations carry the
// summary, the figures and the links; a firing alert's endsAt lies a few
// re-send intervals ahead, so Alertmanager resolves it by itself if the
// alerter dies, and a resolved one is posted with endsAt = now.
package alertmanager

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// MaxBatch bounds the alerts of one POST, so the periodic re-send of
// thousands of firing alerts stays within request-size limits.
const MaxBatch = 500

// Sender posts messages to one Alertmanager.
type Sender struct {
	endpoint string
	client   *http.Client
	render   *message.Renderer
	// hold is how far ahead of now a firing alert's endsAt is set.
	hold time.Duration
	now  func() time.Time
}

// New returns a sender to the Alertmanager at baseURL (for example
// http://127.0.0.1:9093). hold is how long Alertmanager keeps a firing
// alert that is not re-sent; make it several re-send intervals.
func New(baseURL string, hold time.Duration, render *message.Renderer, client *http.Client) (*Sender, error) {
	if _, err := notify.ParseURL(baseURL); err != nil {
		return nil, fmt.Errorf("alertmanager.url: %w", err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Sender{endpoint: strings.TrimRight(baseURL, "/") + "/api/v2/alerts", client: client, render: render, hold: hold, now: time.Now}, nil
}

// postable is Alertmanager's postableAlert.
type postable struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt,omitzero"`
	EndsAt       time.Time         `json:"endsAt,omitzero"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// Send posts m's alerts and the label sets it supersedes.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	now := s.now()
	batch := make([]postable, 0, min(MaxBatch, len(m.Alerts)+len(m.Superseded)))
	all := append(append([]alert.Alert(nil), m.Superseded...), m.Alerts...)
	for i := range all {
		p, err := s.postable(&all[i], now)
		if err != nil {
			return notify.Permanent(err)
		}
		batch = append(batch, p)
		if len(batch) == MaxBatch || i == len(all)-1 {
			if err := s.post(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}

func (s *Sender) postable(a *alert.Alert, now time.Time) (postable, error) {
	summary, desc, err := s.render.Annotations(a)
	if err != nil {
		return postable{}, err
	}
	ann := map[string]string{"summary": summary, "description": desc}
	dash, runbook := s.render.Links(a)
	if dash != "" {
		ann["dashboard"] = dash
	}
	if runbook != "" {
		ann["runbook_url"] = runbook
	}
	// The figures as separate annotations let Alertmanager templates and
	// receivers use them without parsing the description.
	ann["used"] = figure(a.Used)
	if a.Limit > 0 {
		ann["limit"] = figure(a.Limit)
	}
	if a.Rate > 0 {
		ann["rate_per_minute"] = figure(a.Rate)
	}
	if a.PredictedExhaustion != nil {
		ann["predicted_exhaustion"] = a.PredictedExhaustion.UTC().Format(time.RFC3339)
		// The prediction's uncertainty, as the aggregator gave it.
		for _, k := range []string{schemas.AttrPredictedEarliest, schemas.AttrPredictedLatest, schemas.AttrPredictionBasis} {
			if v := a.Attributes[k]; v != "" {
				ann[k] = v
			}
		}
	}
	p := postable{Labels: a.Labels(), Annotations: ann, StartsAt: a.StartsAt, GeneratorURL: dash}
	if a.Status == alert.StatusResolved {
		p.EndsAt = a.EndsAt
		if p.EndsAt.IsZero() {
			p.EndsAt = now
		}
	} else {
		p.EndsAt = now.Add(s.hold)
	}
	return p, nil
}

// figure formats an amount without exponent, for machine readers.
func figure(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func (s *Sender) post(ctx context.Context, batch []postable) error {
	// A 400 (malformed alerts) is permanent, 5xx and transport errors retry.
	_, err := notify.PostJSON(ctx, s.client, "alertmanager", s.endpoint, "application/json", batch)
	return err
}
