package deferred

import (
	"net/http"
	"strconv"
	"time"
)

// Recorder is the http.ResponseWriter a task's run answers into: it keeps
// the status, the headers and at most limit bytes of the body, so that a
// run's answer is bounded before it is stored.
type Recorder struct {
	header    http.Header
	status    int
	body      []byte
	limit     int
	truncated bool
}

// NewRecorder returns a Recorder keeping at most limit body bytes.
func NewRecorder(limit int) *Recorder { return &Recorder{header: http.Header{}, limit: limit} }

// Header returns the answer's headers.
func (r *Recorder) Header() http.Header { return r.header }

// WriteHeader records the first status.
func (r *Recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
}

// Write keeps what fits in the limit and reports every byte written, so
// that the handler carries on (and settles its usage) as with a client.
func (r *Recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	room := r.limit - len(r.body)
	if len(b) > room {
		r.truncated = true
		b = b[:max(room, 0)]
	}
	r.body = append(r.body, b...)
	return len(b), nil
}

// Flush does nothing: the answer is read once the run ends.
func (r *Recorder) Flush() {}

// Outcome is the run's end as a Worker acts on it: a 429 or 503 is a
// refusal for capacity, retried after its Retry-After (whole seconds;
// 0 when absent, meaning the Worker's retry_min); an answer longer than
// the limit is kept as its status with error result_too_large.
func (r *Recorder) Outcome() Outcome {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	o := Outcome{Result: Result{Status: status, ContentType: r.header.Get("Content-Type"), Body: r.body}}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		o.Retry = time.Nanosecond // the Worker raises it to retry_min
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err == nil && s > 0 {
			o.Retry = time.Duration(min(s, 3600)) * time.Second
		}
	}
	if r.truncated {
		o.Result.Body = nil
		o.ErrorCode = "result_too_large"
		o.Error = "the answer is longer than services.gateway.deferred.max_result_bytes (" + strconv.Itoa(r.limit) + " bytes); only its status is kept"
	}
	return o
}
