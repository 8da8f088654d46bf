// Package keyfile is the hashed API-key file that ingest (gateway keys,
// services/ingest/apikey) and the gateway service (tenant keys,
// services/gateway) both authenticate callers with: a YAML list of
// entries, each with an id and the hex SHA-256 of a secret key, plus the
// fields each service adds; re-read when it changes, so keys rotate
// without a restart.
//
// What is shared is what must not differ between the two: how a hash is
// written and checked, that ids and keys are unique, that a presented key
// is compared with every hash in constant time, the size limit on a
// reload, and that a reload that does not parse keeps the previous keys
// in force. Each service parses its own fields with its own rules.
package keyfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// Entry is what every keys file entry has. A service's entry type embeds
// it inline (`yaml:",inline"`) next to its own fields.
type Entry struct {
	// ID names the key in logs and metrics.
	ID string `yaml:"id"`
	// SHA256 is the lower- or upper-case hex SHA-256 of the secret key.
	SHA256 string `yaml:"sha256"`
}

// Head returns e itself; embedding Entry gives a service's entry type this
// method, which is how Parse finds the shared fields.
func (e *Entry) Head() *Entry { return e }

// Set is an immutable list of keys, each with the value its service built
// from the entry.
type Set[T any] struct {
	hashes [][sha256.Size]byte
	ids    []string
	vals   []*T
}

// Entries is the constraint on a service's entry type E: a pointer to it
// has Head (E embeds Entry).
type Entries[E any] interface {
	*E
	Head() *Entry
}

// Parse decodes data, a document with a top-level `keys:` list of E, and
// builds a Set: it checks each entry's id (required, unique) and sha256
// (64 hex digits, no key twice) and calls build for the rest, with the
// entry's position ("keys[3]") for its messages. Every problem of every
// entry is reported at once; unknown fields are errors.
func Parse[E any, P Entries[E], T any](data []byte, build func(where string, e *E) (*T, []error)) (*Set[T], error) {
	var doc struct {
		Keys []E `yaml:"keys"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	var errs []error
	set := &Set[T]{}
	ids := map[string]bool{}
	for i := range doc.Keys {
		e := &doc.Keys[i]
		h := P(e).Head()
		where := fmt.Sprintf("keys[%d]", i)
		if h.ID == "" {
			errs = append(errs, fmt.Errorf("%s.id: is required", where))
		} else if ids[h.ID] {
			errs = append(errs, fmt.Errorf("%s.id: %q appears twice; ids must be unique", where, h.ID))
		}
		ids[h.ID] = true
		raw, err := hex.DecodeString(h.SHA256)
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("%s.sha256: must be 64 hex digits (the SHA-256 of the key, e.g. `printf %%s KEY | sha256sum`)", where))
			continue
		}
		var hash [sha256.Size]byte
		copy(hash[:], raw)
		val, problems := build(where, e)
		errs = append(errs, problems...)
		if j := slices.Index(set.hashes, hash); j >= 0 {
			errs = append(errs, fmt.Errorf("%s.sha256: same key as %q", where, set.ids[j]))
		}
		set.hashes = append(set.hashes, hash)
		set.ids = append(set.ids, h.ID)
		set.vals = append(set.vals, val)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return set, nil
}

// NewSet returns a Set whose hashes[i] authenticates as vals[i], named
// ids[i], for keys that come from elsewhere than a keys file (the control
// plane's, internal/controlplane): they share Authenticate's constant-time
// scan. Unlike Parse it checks nothing; such keys are validated where they
// are written. One id may have several hashes (a rotation's overlap).
func NewSet[T any](ids []string, hashes [][sha256.Size]byte, vals []*T) *Set[T] {
	return &Set[T]{ids: ids, hashes: hashes, vals: vals}
}

// keyStackBytes holds any key a client sends on the stack while it is
// hashed; a longer one is copied to the heap.
const keyStackBytes = 256

// Authenticate returns the value of key, or nil. It hashes the presented
// key and compares the hash with every entry in constant time, without
// stopping at a match, so timing says nothing about which hashes exist.
func (s *Set[T]) Authenticate(key string) *T {
	if s == nil || key == "" {
		return nil
	}
	// Copied to the stack first: a conversion of a string above 32 bytes
	// (any real key) allocated on every request.
	var buf [keyStackBytes]byte
	h := sha256.Sum256(append(buf[:0], key...))
	var found *T
	for i := range s.hashes {
		if subtle.ConstantTimeCompare(h[:], s.hashes[i][:]) == 1 {
			found = s.vals[i]
		}
	}
	return found
}

// Len returns the number of keys.
func (s *Set[T]) Len() int { return len(s.hashes) }

// IDs returns the key ids, sorted.
func (s *Set[T]) IDs() []string {
	out := slices.Clone(s.ids)
	slices.Sort(out)
	return out
}

// Values returns the value of every key, in file order.
func (s *Set[T]) Values() []*T { return slices.Clone(s.vals) }

// MaxFileBytes bounds what a load reads, so a wrong path (a log file)
// cannot exhaust memory.
const MaxFileBytes = 1 << 20

// File is a keys file watched for changes. A change that does not parse is
// logged and ignored: the previous keys stay in force, so a typo during a
// rotation does not lock every caller out.
type File[T any] struct {
	path    string
	parse   func([]byte) (*Set[T], error)
	log     *slog.Logger
	current atomic.Pointer[Set[T]]
	// onReload is told the outcome of every reload attempt, for metrics.
	onReload func(err error)

	modTime time.Time
	size    int64
}

// Open reads the keys file at path with parse; it fails if the file is
// missing or invalid, because a service without keys would refuse every
// caller. onReload may be nil. Errors name the setting as keys_file.
func Open[T any](path string, parse func([]byte) (*Set[T], error), log *slog.Logger, onReload func(error)) (*File[T], error) {
	f := &File[T]{path: path, parse: parse, log: log, onReload: onReload}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// Keys returns the keys in force.
func (f *File[T]) Keys() *Set[T] { return f.current.Load() }

// Authenticate checks key against the keys in force.
func (f *File[T]) Authenticate(key string) *T { return f.current.Load().Authenticate(key) }

func (f *File[T]) load() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("keys_file: %w", err)
	}
	if st.Size() > MaxFileBytes {
		return fmt.Errorf("keys_file: %s is %d bytes; the limit is %d", f.path, st.Size(), MaxFileBytes)
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("keys_file: %w", err)
	}
	set, err := f.parse(data)
	if err != nil {
		return fmt.Errorf("keys_file %s: %w", f.path, err)
	}
	f.current.Store(set)
	f.modTime, f.size = st.ModTime(), st.Size()
	return nil
}

// Watch polls the file's modification time and size every interval and
// reloads it when either changed, until ctx ends.
func (f *File[T]) Watch(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, f.reloadIfChanged)
}

// reloadIfChanged reloads the file when its modification time or size
// changed since the last load (or the last failed one).
func (f *File[T]) reloadIfChanged() {
	st, err := os.Stat(f.path)
	if err == nil && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return
	}
	if err == nil {
		err = f.load()
	} else {
		err = fmt.Errorf("keys_file: %w", err)
	}
	if f.onReload != nil {
		f.onReload(err)
	}
	if err != nil {
		f.log.Error("keys file reload failed; keeping the previous keys", "err", err)
		// Remember the broken version so it is reported once, not every tick.
		if st != nil {
			f.modTime, f.size = st.ModTime(), st.Size()
		}
		return
	}
	f.log.Info("keys file reloaded", "keys", f.Keys().IDs())
}
