package deferred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// Queue accepts deferred tasks and answers their states: the gateway's
// side of POST with Prefer: respond-async and of GET /v1/tasks/{id}.
type Queue struct {
	cfg   Config
	cl    *kgo.Client
	store *store
	m     *Metrics
	now   func() time.Time
}

// NewQueue returns a Queue producing to the class topics of cfg (created
// when missing) and keeping states in rdb; m may be nil. Close it.
func NewQueue(ctx context.Context, cfg Config, kcfg kafkaconn.Config, rdb redis.UniversalClient, m *Metrics) (*Queue, error) {
	if err := cfg.Validate("services.gateway.deferred."); err != nil {
		return nil, err
	}
	cl, err := kafkaconn.NewClient(kcfg, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxTaskBytes+64<<10)))
	if err != nil {
		return nil, err
	}
	if err := kafkaconn.EnsureTopics(ctx, cl, kcfg, cfg.Topics()...); err != nil {
		cl.Close()
		return nil, err
	}
	return &Queue{cfg: cfg, cl: cl, store: newStore(rdb, cfg), m: m, now: time.Now}, nil
}

// Close closes the Kafka client.
func (q *Queue) Close() { q.cl.Close() }

// Config is the queue's configuration.
func (q *Queue) Config() Config { return q.cfg }

// ErrTooLarge refuses a task whose body exceeds MaxTaskBytes.
var ErrTooLarge = errors.New("deferred: the request body exceeds max_task_bytes")

// Submit accepts t: it fills its id and creation time, counts it into its
// class (ErrFull when the class holds MaxPending tasks), stores its state
// and produces it to its class's topic, returning only once Kafka
// acknowledged it — then the task outlives any gateway.
func (q *Queue) Submit(ctx context.Context, t *Task) error {
	if len(t.Body) > q.cfg.MaxTaskBytes {
		return ErrTooLarge
	}
	if t.ID == "" {
		t.ID = NewID()
	}
	now := q.now()
	t.Created = now.UTC()
	val, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("deferred: encode task: %w", err)
	}
	if err := q.store.reserve(ctx, t, now); err != nil {
		if errors.Is(err, ErrFull) {
			q.m.count(classIndex(t.Priority), "refused_full")
		}
		return err
	}
	rec := &kgo.Record{Topic: q.cfg.Topic(t.Priority), Key: []byte(t.ID), Value: val,
		Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemaTask)}}}
	if err := q.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		q.store.forget(context.WithoutCancel(ctx), t)
		return fmt.Errorf("deferred: produce the task to %s: %w", rec.Topic, err)
	}
	q.m.count(classIndex(t.Priority), "accepted")
	return nil
}

// schemaTask is the schema header of a task record.
const schemaTask = "sluice.deferred.task.v1"

// Get returns the state of task id for tenant; ok is false when there is
// no such task, it expired, or it belongs to another tenant (which must
// not learn that it exists).
func (q *Queue) Get(ctx context.Context, tenant, id string) (State, bool, error) {
	st, ok, err := q.store.get(ctx, id)
	if err != nil || !ok || st.Tenant != tenant {
		return State{}, false, err
	}
	return st, true, nil
}
