// Package apikey authenticates gateways by API key. Keys are kept only as
// SHA-256 hashes in a YAML file that is re-read when it changes, so keys
// rotate without a restart:
//
//	keys:
//	  - id: gw-eu-1                # named in logs and metrics, never the key
//	    sha256: 9f86d0818...       # hex SHA-256 of the key the gateway sends
//	    tenants: [acme, beta]      # tenants this key may report
//	  - id: gw-shared
//	    sha256: 2c26b46b6...
//	    tenants: ["*"]             # any tenant: must be said explicitly
//
// A key without tenants is an error rather than "any tenant": forgetting a
// line must not turn a key for one customer into a key that can spend (or
// poison the counters of) every customer.
//
// Rotation is two edits: add the new key next to the old one, move the
// gateways over, then remove the old entry.
package apikey

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
)

// Key is one gateway's credential as the keys file lists it.
type Key struct {
	// ID names the key in logs and metrics.
	ID string `yaml:"id"`
	// SHA256 is the lower- or upper-case hex SHA-256 of the secret key.
	SHA256 string `yaml:"sha256"`
	// Tenants lists the tenants the key may send events for. It is
	// required; [AnyTenant] alone means any tenant.
	Tenants []string `yaml:"tenants"`
}

// AnyTenant, as the only entry of Key.Tenants, lets a key send events for
// every tenant (a shared gateway). It cannot be a tenant name: tenants are
// letters, digits and . _ : - only.
const AnyTenant = "*"

// Identity is an authenticated key: what a request may do.
type Identity struct {
	// ID is the key's id from the keys file.
	ID      string
	tenants map[string]struct{} // nil: any tenant
}

// Allows reports whether the key may send events for tenant.
func (i *Identity) Allows(tenant string) bool {
	if i.tenants == nil {
		return true
	}
	_, ok := i.tenants[tenant]
	return ok
}

// maxKeysFileBytes bounds what a reload reads, so a wrong path (a log file)
// cannot exhaust memory.
const maxKeysFileBytes = 1 << 20

type entry struct {
	hash [sha256.Size]byte
	id   *Identity
}

// Set is an immutable list of keys.
type Set struct{ entries []entry }

// Parse reads a keys file's content. Every problem is reported with the
// entry's position and field.
func Parse(data []byte) (*Set, error) {
	var doc struct {
		Keys []Key `yaml:"keys"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	var errs []error
	set := &Set{}
	ids := map[string]bool{}
	for i, k := range doc.Keys {
		where := fmt.Sprintf("keys[%d]", i)
		if k.ID == "" {
			errs = append(errs, fmt.Errorf("%s.id: is required", where))
		} else if ids[k.ID] {
			errs = append(errs, fmt.Errorf("%s.id: %q appears twice; ids must be unique", where, k.ID))
		}
		ids[k.ID] = true
		raw, err := hex.DecodeString(k.SHA256)
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("%s.sha256: must be 64 hex digits (the SHA-256 of the key, e.g. `printf %%s KEY | sha256sum`)", where))
			continue
		}
		e := entry{id: &Identity{ID: k.ID}}
		copy(e.hash[:], raw)
		switch {
		case len(k.Tenants) == 0:
			errs = append(errs, fmt.Errorf(`%s.tenants: key %q has no tenants; list the tenants this key may report (tenants: [acme, beta]) or write tenants: ["*"] to let it report any tenant`, where, k.ID))
		case slices.Contains(k.Tenants, AnyTenant):
			if len(k.Tenants) > 1 {
				errs = append(errs, fmt.Errorf(`%s.tenants: key %q mixes "*" (any tenant) with named tenants; "*" must be the only entry, remove it or the names`, where, k.ID))
			}
			// tenants stays nil: any tenant.
		default:
			e.id.tenants = make(map[string]struct{}, len(k.Tenants))
			for _, t := range k.Tenants {
				if t == "" {
					errs = append(errs, fmt.Errorf("%s.tenants: key %q lists an empty tenant", where, k.ID))
				}
				e.id.tenants[t] = struct{}{}
			}
		}
		for _, o := range set.entries {
			if o.hash == e.hash {
				errs = append(errs, fmt.Errorf("%s.sha256: same key as %q", where, o.id.ID))
			}
		}
		set.entries = append(set.entries, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return set, nil
}

// Authenticate returns the identity of key, or nil. It hashes the presented
// key and compares the hash with every entry in constant time, without
// stopping at a match, so timing says nothing about which hashes exist.
func (s *Set) Authenticate(key string) *Identity {
	if s == nil || key == "" {
		return nil
	}
	h := sha256.Sum256([]byte(key))
	var found *Identity
	for i := range s.entries {
		if subtle.ConstantTimeCompare(h[:], s.entries[i].hash[:]) == 1 {
			found = s.entries[i].id
		}
	}
	return found
}

// Len returns the number of keys.
func (s *Set) Len() int { return len(s.entries) }

// IDs returns the key ids, sorted.
func (s *Set) IDs() []string {
	out := make([]string, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e.id.ID)
	}
	slices.Sort(out)
	return out
}

// File is a keys file watched for changes. A change that does not parse is
// logged and ignored: the previous keys stay in force, so a typo during a
// rotation does not lock every gateway out.
type File struct {
	path    string
	log     *slog.Logger
	current atomic.Pointer[Set]
	// onReload is told the outcome of every reload attempt, for metrics.
	onReload func(err error)

	modTime time.Time
	size    int64
}

// Open reads the keys file at path; it fails if the file is missing or
// invalid, because an ingest without keys would refuse every gateway.
// onReload may be nil.
func Open(path string, log *slog.Logger, onReload func(error)) (*File, error) {
	f := &File{path: path, log: log, onReload: onReload}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// Keys returns the keys in force.
func (f *File) Keys() *Set { return f.current.Load() }

// Authenticate checks key against the keys in force.
func (f *File) Authenticate(key string) *Identity { return f.current.Load().Authenticate(key) }

func (f *File) load() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("keys_file: %w", err)
	}
	if st.Size() > maxKeysFileBytes {
		return fmt.Errorf("keys_file: %s is %d bytes; the limit is %d", f.path, st.Size(), maxKeysFileBytes)
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("keys_file: %w", err)
	}
	set, err := Parse(data)
	if err != nil {
		return fmt.Errorf("keys_file %s: %w", f.path, err)
	}
	f.current.Store(set)
	f.modTime, f.size = st.ModTime(), st.Size()
	return nil
}

// Watch polls the file's modification time and size every interval and
// reloads it when either changed, until ctx ends.
func (f *File) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := os.Stat(f.path)
		if err == nil && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
			continue
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
			continue
		}
		f.log.Info("keys file reloaded", "keys", f.Keys().IDs())
	}
}
