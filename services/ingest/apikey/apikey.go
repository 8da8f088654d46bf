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
// gateways over, then remove the old entry. The file format's shared part
// (ids, hashes, constant-time lookup, reloads) is internal/keyfile,
// which the gateway service's tenant keys use too.
package apikey

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/sluicehq/sluice/internal/keyfile"
)

// Key is one gateway's credential as the keys file lists it.
type Key struct {
	keyfile.Entry `yaml:",inline"`
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

// OnlyTenant returns the tenant of a key that may report exactly one,
// which readers such as the usage API take when the request names none.
func (i *Identity) OnlyTenant() (string, bool) {
	if len(i.tenants) != 1 {
		return "", false
	}
	for t := range i.tenants {
		return t, true
	}
	return "", false
}

// Set is an immutable list of keys.
type Set = keyfile.Set[Identity]

// File is a keys file watched for changes (see keyfile.File).
type File = keyfile.File[Identity]

// Parse reads a keys file's content. Every problem is reported with the
// entry's position and field.
func Parse(data []byte) (*Set, error) {
	return keyfile.Parse(data, func(where string, k *Key) (*Identity, []error) {
		var errs []error
		id := &Identity{ID: k.ID}
		switch {
		case len(k.Tenants) == 0:
			errs = append(errs, fmt.Errorf(`%s.tenants: key %q has no tenants; list the tenants this key may report (tenants: [acme, beta]) or write tenants: ["*"] to let it report any tenant`, where, k.ID))
		case slices.Contains(k.Tenants, AnyTenant):
			if len(k.Tenants) > 1 {
				errs = append(errs, fmt.Errorf(`%s.tenants: key %q mixes "*" (any tenant) with named tenants; "*" must be the only entry, remove it or the names`, where, k.ID))
			}
			// tenants stays nil: any tenant.
		default:
			id.tenants = make(map[string]struct{}, len(k.Tenants))
			for _, t := range k.Tenants {
				if t == "" {
					errs = append(errs, fmt.Errorf("%s.tenants: key %q lists an empty tenant", where, k.ID))
				}
				id.tenants[t] = struct{}{}
			}
		}
		return id, errs
	})
}

// Open reads the keys file at path; it fails if the file is missing or
// invalid, because an ingest without keys would refuse every gateway.
// onReload may be nil.
func Open(path string, log *slog.Logger, onReload func(error)) (*File, error) {
	return keyfile.Open(path, Parse, log, onReload)
}
