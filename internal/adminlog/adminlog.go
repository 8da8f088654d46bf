// Package adminlog is how Sluice reads and writes the admin topic
// (schemas.TopicAdminV1), the compacted record of every operator action in
// force, for its two readers (the enforcer and the aggregator) and its one
// writer (the enforcer's admin API).
//
// Three things can go wrong on a topic anyone with Kafka access might
// produce to, and each has its answer here:
//
//   - A forged record: every record is signed (platform/signalauth,
//     AdminActions); Apply refuses one that is unsigned or badly signed,
//     tombstones included.
//   - A replayed genuine record (a permanent override re-sent after it was
//     lifted): every record carries its scope's version, one above the
//     previous one; Apply keeps the highest version of each scope and
//     refuses an older one as Replayed. A lift is a version too (a state
//     with Lifted set), so it stands against replays of what it lifted.
//   - A forged tombstone that compaction obeys: readers refuse it, but the
//     broker's cleaner keeps the last record of each key whoever produced
//     it. Record keys are therefore derived from the scope and version
//     under the signing key (signalauth's RecordKey), which a producer
//     without the key cannot compute; each version has a key of its own,
//     and the writer deletes the version it supersedes with a signed
//     tombstone of that exact key. A tombstone never lifts an action.
//
// Records written by a release without versions (version 0, keyed by the
// scope itself) are still read: a tombstone of such a key lifts it, as it
// did. They keep that release's weaknesses until their action is re-issued.
package adminlog

import (
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// Outcome is what Apply did with a record.
type Outcome string

// Outcomes of Apply. Each is a value of the readers' result metrics.
const (
	// Applied: the record's state is now in force for its scope (a lift or
	// an expired action included: it is in force nowhere).
	Applied Outcome = "applied"
	// Replayed: a version older than the one the scope holds; refused.
	Replayed Outcome = "replayed"
	// Unauthenticated: unsigned or badly signed; refused.
	Unauthenticated Outcome = "unauthenticated"
	// Invalid: signed but not a valid admin state of its key; skipped.
	Invalid Outcome = "invalid"
	// Ignored: a tombstone of a superseded version, which compaction
	// needs and readers do not.
	Ignored Outcome = "ignored"
)

// Result is what Apply did with one record.
type Result struct {
	Outcome Outcome
	// Unsigned: admitted unsigned under signal_auth.accept_unsigned_state.
	Unsigned bool
	// Scope is the record's schemas.AdminState Key (Applied, Replayed).
	Scope string
	// State is what is in force for Scope now (Applied); nil when a
	// version-0 tombstone lifted it.
	State *schemas.AdminState
	// Previous is what was in force for Scope before (Applied).
	Previous *schemas.AdminState
	// Err says why a record was refused or skipped.
	Err error
}

// Log is one reader's view of the admin topic: per scope, the highest
// version applied and the record that carries it. It is safe for
// concurrent use.
type Log struct {
	auth *signalauth.Auth
	mu   sync.Mutex
	// scopes holds every scope ever applied, lifted ones included: their
	// version is what refuses a replay.
	scopes map[string]*scope
	// records maps the record key of each scope's current record to the
	// scope, so that a version-0 tombstone finds what it lifts.
	records map[string]string
}

type scope struct {
	version   uint64
	recordKey string
	state     *schemas.AdminState
}

// New returns an empty log that verifies with auth (the AdminActions
// stream of the ring).
func New(auth *signalauth.Auth) *Log {
	return &Log{auth: auth, scopes: map[string]*scope{}, records: map[string]string{}}
}

// ErrStaleKey: the record key is not the one its state's scope and
// version derive to under the key that signed it.
var ErrStaleKey = errors.New("record key is not the key of its state's scope and version")

// Apply folds r, read in topic order, into the log. A control-plane record
// (schemas.SchemaControlPlaneV1, an API key) shares the topic and is
// Ignored here: internal/controlplane reads it.
func (l *Log) Apply(r *kgo.Record) Result {
	if signalauth.SchemaOf(r) == schemas.SchemaControlPlaneV1 {
		return Result{Outcome: Ignored}
	}
	unsigned, err := l.auth.Admit(r)
	if err != nil {
		return Result{Outcome: Unauthenticated, Err: err}
	}
	key := string(r.Key)
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Value == nil {
		return l.tombstone(key, unsigned)
	}
	st, err := schemas.DecodeAdminState(r.Value)
	if err != nil {
		return Result{Outcome: Invalid, Unsigned: unsigned, Err: err}
	}
	if st.Version == 0 {
		if key != st.Key() {
			return Result{Outcome: Invalid, Unsigned: unsigned, Err: ErrStaleKey}
		}
	} else if !l.auth.RecordKeyMatches(r, []byte(st.VersionKey())) {
		return Result{Outcome: Invalid, Unsigned: unsigned, Err: ErrStaleKey}
	}
	name := st.Key()
	cur := l.scopes[name]
	if cur != nil && st.Version < cur.version {
		return Result{Outcome: Replayed, Unsigned: unsigned, Scope: name,
			Err: fmt.Errorf("version %d of %q is older than the version %d in force", st.Version, name, cur.version)}
	}
	var prev *schemas.AdminState
	if cur == nil {
		cur = &scope{}
		l.scopes[name] = cur
	} else {
		prev = cur.state
		delete(l.records, cur.recordKey)
	}
	cur.version, cur.recordKey, cur.state = st.Version, key, st
	l.records[key] = name
	return Result{Outcome: Applied, Unsigned: unsigned, Scope: name, State: st, Previous: prev}
}

// tombstone applies a deletion of key: it lifts a version-0 record's
// action (what a release without versions meant by it) and does nothing
// else. Called with l.mu held.
func (l *Log) tombstone(key string, unsigned bool) Result {
	name, ok := l.records[key]
	if !ok {
		return Result{Outcome: Ignored, Unsigned: unsigned}
	}
	cur := l.scopes[name]
	if cur.version != 0 {
		return Result{Outcome: Ignored, Unsigned: unsigned}
	}
	delete(l.records, key)
	prev := cur.state
	cur.state, cur.recordKey = nil, ""
	return Result{Outcome: Applied, Unsigned: unsigned, Scope: name, Previous: prev}
}

// State returns what is in force for scope (lifted and expired states
// included; nil if nothing was applied or a version-0 tombstone lifted it).
// A nil log holds nothing.
func (l *Log) State(name string) *schemas.AdminState {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.scopes[name]; s != nil {
		return s.state
	}
	return nil
}

// Each calls f with every scope's state in force (not nil), in no order.
// f must not call l. A nil log holds nothing.
func (l *Log) Each(f func(st *schemas.AdminState)) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.scopes {
		if s.state != nil {
			f(s.state)
		}
	}
}

// Records returns the records that make st the next version of its scope,
// for topic: st, given the version after the scope's and signed under the
// record key of that version, then a signed tombstone of the record it
// supersedes, so that compaction drops the older version (a replay of it
// would be refused anyway). Versions follow what l has applied: the
// writer applies the topic up to its end first (and serializes its own
// writes), or two writers may give one version twice — readers then keep
// the later record, as compaction does when both keys are the same.
func (l *Log) Records(topic string, st *schemas.AdminState) ([]*kgo.Record, error) {
	name := st.Key()
	l.mu.Lock()
	cur := l.scopes[name]
	st.Version = 1
	var old string
	if cur != nil {
		st.Version = cur.version + 1
		old = cur.recordKey
	}
	l.mu.Unlock()
	v, err := schemas.EncodeAdminState(st)
	if err != nil {
		return nil, fmt.Errorf("admin state %q: %w", name, err)
	}
	recs := []*kgo.Record{l.auth.Record(topic, l.auth.RecordKey([]byte(st.VersionKey())), v)}
	if old != "" && old != string(recs[0].Key) {
		recs = append(recs, l.auth.Record(topic, []byte(old), nil))
	}
	return recs, nil
}

// Version returns the version of scope in force (0 for none).
func (l *Log) Version(name string) uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.scopes[name]; s != nil {
		return s.version
	}
	return 0
}
