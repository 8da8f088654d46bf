package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// Kind is what a Record holds.
type Kind string

// KindKey is a Record holding an API key; KindTenant and KindPlan hold a
// Section.
const KindKey Kind = "key"

// Record is the value of a control-plane record on the admin topic
// (schema header schemas.SchemaControlPlaneV1), JSON-encoded.
type Record struct {
	Kind Kind `json:"kind"`
	Key  *Key `json:"key,omitempty"`
	// Section is the tenant (KindTenant) or plan (KindPlan).
	Section *Section `json:"section,omitempty"`
	// Request is the id of the change that wrote this version. Two writers
	// that read the same version write records of the same version under
	// different record keys; readers keep the first in topic order, and a
	// writer tells from the record key in force whether its change won.
	Request string `json:"request"`
}

// ID names the record's subject among all records: kind and id (or name).
func (r *Record) ID() string {
	if r.Key != nil {
		return string(r.Kind) + "/" + r.Key.ID
	}
	return string(r.Kind) + "/" + r.Section.Name
}

// Version is the record's version.
func (r *Record) Version() uint64 {
	if r.Key != nil {
		return r.Key.Version
	}
	return r.Section.Version
}

// SetVersion makes r the version v of its subject.
func (r *Record) SetVersion(v uint64) {
	if r.Key != nil {
		r.Key.Version = v
	} else {
		r.Section.Version = v
	}
}

// versionKey is the logical key of this version, from which its record key
// is derived under the signing key (signalauth.RecordKey): a producer
// without the key can neither forge a record nor a tombstone that makes
// compaction drop one.
func (r *Record) versionKey() string {
	return r.ID() + "\x00v" + strconv.FormatUint(r.Version(), 10) + "\x00" + r.Request
}

func (r *Record) validate() error {
	switch {
	case r.Kind == KindKey && r.Key != nil && r.Section == nil:
	case r.HasSections() && r.Section != nil && r.Key == nil:
	default:
		return fmt.Errorf("control-plane record: kind %q without its record; this release knows kinds key, tenant and plan", r.Kind)
	}
	if r.Version() == 0 {
		return errors.New("control-plane record: version 0; versions start at 1")
	}
	if r.Key != nil {
		return r.Key.Validate()
	}
	return r.Section.Validate()
}

// Outcome is what Apply did with a record.
type Outcome string

// Outcomes of Apply, each a value of the readers' result metrics.
const (
	// Applied: the record is now in force for its subject.
	Applied Outcome = "applied"
	// Stale: a version not newer than the one in force (a replay, or the
	// loser of two writers that read the same version); refused.
	Stale Outcome = "stale"
	// Unauthenticated: unsigned or badly signed; refused.
	Unauthenticated Outcome = "unauthenticated"
	// Invalid: signed but not a valid record of its key; skipped.
	Invalid Outcome = "invalid"
	// Ignored: another stream's record (an operator action) or a
	// tombstone, which only compaction needs.
	Ignored Outcome = "ignored"
)

// Result is what Apply did with one record.
type Result struct {
	Outcome Outcome
	// Record is what is in force now (Applied).
	Record *Record
	// Previous is what was in force before (Applied); nil for a new one.
	Previous *Record
	Err      error
}

// Log is one reader's view of the control-plane records: per subject, the
// first record of its highest version. It is safe for concurrent use.
type Log struct {
	auth *signalauth.Auth
	mu   sync.RWMutex
	recs map[string]*entry
}

type entry struct {
	rec       *Record
	recordKey string
}

// NewLog returns an empty log verifying with auth (any stream of the ring:
// it uses signalauth.ControlPlane).
func NewLog(auth *signalauth.Auth) *Log {
	return &Log{auth: auth.For(signalauth.ControlPlane), recs: map[string]*entry{}}
}

// IsRecord reports whether r is a control-plane record (by its schema
// header), which readers of operator actions leave to a Log.
func IsRecord(r *kgo.Record) bool { return signalauth.SchemaOf(r) == schemas.SchemaControlPlaneV1 }

// ErrStaleKey: the record key is not the one its subject, version and
// request derive to under the key that signed it.
var ErrStaleKey = errors.New("record key is not the key of its subject, version and request")

// Apply folds r, read in topic order, into the log.
func (l *Log) Apply(r *kgo.Record) Result {
	if !IsRecord(r) {
		return Result{Outcome: Ignored}
	}
	if _, err := l.auth.Admit(r); err != nil {
		return Result{Outcome: Unauthenticated, Err: err}
	}
	if r.Value == nil {
		return Result{Outcome: Ignored}
	}
	var rec Record
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		return Result{Outcome: Invalid, Err: fmt.Errorf("control-plane record: %w", err)}
	}
	if err := rec.validate(); err != nil {
		return Result{Outcome: Invalid, Err: err}
	}
	if !l.auth.RecordKeyMatches(r, []byte(rec.versionKey())) {
		return Result{Outcome: Invalid, Err: ErrStaleKey}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id := rec.ID()
	cur := l.recs[id]
	if cur != nil && rec.Version() <= cur.rec.Version() {
		return Result{Outcome: Stale, Err: fmt.Errorf("version %d of %s is not newer than the version %d in force", rec.Version(), id, cur.rec.Version())}
	}
	var prev *Record
	if cur != nil {
		prev = cur.rec
	}
	l.recs[id] = &entry{rec: &rec, recordKey: string(r.Key)}
	return Result{Outcome: Applied, Record: &rec, Previous: prev}
}

// Records returns the topic records that write rec (its Version already
// the one after the version its writer read): rec signed under its own
// record key, then a signed tombstone of the record in force, so that
// compaction keeps one record per subject.
func (l *Log) Records(topic string, rec *Record) ([]*kgo.Record, error) {
	if err := rec.validate(); err != nil {
		return nil, err
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("control-plane record %s: %w", rec.ID(), err)
	}
	out := []*kgo.Record{l.auth.Record(topic, l.auth.RecordKey([]byte(rec.versionKey())), v)}
	l.mu.RLock()
	cur := l.recs[rec.ID()]
	l.mu.RUnlock()
	if cur != nil {
		out = append(out, l.auth.Record(topic, []byte(cur.recordKey), nil))
	}
	return out, nil
}

// Tombstone returns a signed tombstone of record key, for a writer whose
// record lost to another of the same version.
func (l *Log) Tombstone(topic string, key []byte) *kgo.Record { return l.auth.Record(topic, key, nil) }

// Version returns the version in force of subject id (Record.ID), 0 for
// none: a change must have read it.
func (l *Log) Version(id string) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if cur := l.recs[id]; cur != nil {
		return cur.rec.Version()
	}
	return 0
}

// InForce reports whether the record in force for id has record key key:
// whether the writer of key won.
func (l *Log) InForce(id string, key []byte) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	cur := l.recs[id]
	return cur != nil && cur.recordKey == string(key)
}

// Key returns a copy of key id, or nil.
func (l *Log) Key(id string) *Key { return copyOf(l, string(KindKey)+"/"+id, keyOf) }

// Keys returns copies of the keys of tenant ("" every tenant), revoked
// ones included, sorted by tenant and id.
func (l *Log) Keys(tenant string) []*Key {
	return copiesOf(l, KindKey, keyOf, func(k *Key) bool { return tenant == "" || k.Tenant == tenant },
		func(a, b *Key) bool {
			if a.Tenant != b.Tenant {
				return a.Tenant < b.Tenant
			}
			return a.ID < b.ID
		})
}

func keyOf(r *Record) *Key { return r.Key }

// copyOf returns a copy of what body finds in the record id (kind/name),
// or nil: readers get copies, so that the log's records change only
// under its lock, whatever kind of record they are.
func copyOf[T any](l *Log, id string, body func(*Record) *T) *T {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if e := l.recs[id]; e != nil {
		if v := body(e.rec); v != nil {
			c := *v
			return &c
		}
	}
	return nil
}

// copiesOf returns copies of what body finds in the records of kind that
// keep accepts, sorted by less.
func copiesOf[T any](l *Log, kind Kind, body func(*Record) *T, keep func(*T) bool, less func(a, b *T) bool) []*T {
	l.mu.RLock()
	out := []*T{}
	for _, e := range l.recs {
		if e.rec.Kind == kind && keep(body(e.rec)) {
			c := *body(e.rec)
			out = append(out, &c)
		}
	}
	l.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return less(out[i], out[j]) })
	return out
}

// ErrStale refuses a change that read an older version than the one in
// force (another operator changed the record since): the admin API answers
// it 409 Conflict.
var ErrStale = errors.New("stale version")
