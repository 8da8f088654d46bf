package deferred

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Task is one deferred request as it waits in Kafka. It carries no
// credential: the key is named by its id and looked up when the task
// runs, so a key removed meanwhile runs nothing.
type Task struct {
	ID       string           `json:"id"`
	Tenant   string           `json:"tenant"`
	KeyID    string           `json:"api_key_id"`
	Priority schemas.Priority `json:"priority,omitempty"`
	Endpoint string           `json:"endpoint"`
	Model    string           `json:"model"`
	Body     []byte           `json:"body"`
	Created  time.Time        `json:"created"`
}

// NewID returns a fresh task id: "task_" and 32 hex digits.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "task_" + hex.EncodeToString(b[:])
}

// validID reports whether id has NewID's form, so that an id from a URL
// is checked before it names a Redis key.
func validID(id string) bool {
	if len(id) != 37 || id[:5] != "task_" {
		return false
	}
	_, err := hex.DecodeString(id[5:])
	return err == nil
}

func decodeTask(b []byte) (*Task, error) {
	var t Task
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("deferred: task record: %w", err)
	}
	if !validID(t.ID) || t.Tenant == "" || t.KeyID == "" || t.Endpoint == "" || t.Created.IsZero() {
		return nil, fmt.Errorf("deferred: task record %q lacks id, tenant, api_key_id, endpoint or created", t.ID)
	}
	return &t, nil
}

// Status is a task's state.
type Status string

// The states.
const (
	// Queued: accepted, waiting for capacity (also after a 429/503).
	Queued Status = "queued"
	// Running: a gateway runs it now.
	Running Status = "running"
	// Succeeded: it ran and the answer was 2xx; Result holds it.
	Succeeded Status = "succeeded"
	// Failed: it ran and the answer was not 2xx (Result holds it), or it
	// could not run (Error says why).
	Failed Status = "failed"
)

func (s Status) terminal() bool { return s == Succeeded || s == Failed }

// Result is a finished task's answer.
type Result struct {
	// Status is the HTTP status the request path answered.
	Status int
	// ContentType is the answer's Content-Type.
	ContentType string
	// Body is the answer's body, at most MaxResultBytes.
	Body []byte
}

// State is what GET /v1/tasks/{id} shows of a task.
type State struct {
	ID       string
	Status   Status
	Tenant   string
	Priority schemas.Priority
	Endpoint string
	Model    string
	Created  time.Time
	Started  time.Time // the latest run's start; zero before the first
	Finished time.Time // zero until succeeded or failed
	// Runs counts the times it started; Retries the runs answered 429/503
	// and put back.
	Runs, Retries int
	// Result is the answer, once finished (nil when it could not run).
	Result *Result
	// Error says why it failed without a result, or why the last run was
	// put back (code and message).
	ErrorCode, Error string
}

// stateJSON is State's wire form.
type stateJSON struct {
	ID        string      `json:"id"`
	Object    string      `json:"object"`
	Status    Status      `json:"status"`
	Priority  string      `json:"priority"`
	Endpoint  string      `json:"endpoint"`
	Model     string      `json:"model"`
	CreatedAt int64       `json:"created_at"`
	StartedAt *int64      `json:"started_at"`
	EndedAt   *int64      `json:"finished_at"`
	Runs      int         `json:"runs"`
	Retries   int         `json:"retries"`
	Result    *resultJSON `json:"result,omitempty"`
	Error     *errorJSON  `json:"error,omitempty"`
}

type resultJSON struct {
	Status      int             `json:"status"`
	ContentType string          `json:"content_type,omitempty"`
	Body        json.RawMessage `json:"body"`
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// MarshalJSON renders the state as the API answers it: times in Unix
// seconds (null when not yet), the result's body embedded when it is
// JSON and as a string otherwise.
func (s State) MarshalJSON() ([]byte, error) {
	unix := func(t time.Time) *int64 {
		if t.IsZero() {
			return nil
		}
		v := t.Unix()
		return &v
	}
	prio := string(s.Priority)
	if prio == "" {
		prio = string(schemas.PriorityNormal)
	}
	out := stateJSON{ID: s.ID, Object: "sluice.task", Status: s.Status, Priority: prio, Endpoint: s.Endpoint, Model: s.Model,
		CreatedAt: s.Created.Unix(), StartedAt: unix(s.Started), EndedAt: unix(s.Finished), Runs: s.Runs, Retries: s.Retries}
	if r := s.Result; r != nil {
		body := json.RawMessage(r.Body)
		if !json.Valid(r.Body) {
			body, _ = json.Marshal(string(r.Body))
		}
		out.Result = &resultJSON{Status: r.Status, ContentType: r.ContentType, Body: body}
	}
	if s.ErrorCode != "" {
		out.Error = &errorJSON{Code: s.ErrorCode, Message: s.Error}
	}
	return json.Marshal(out)
}
