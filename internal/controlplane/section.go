package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// The kinds of record whose body is a section of the policy file.
const (
	// KindTenant is a tenant defined at runtime: its section exactly as
	// under tenants: in the policy file. Every service with a policy lays
	// the tenants in force over its file (policy.Overlay).
	KindTenant Kind = "tenant"
	// KindPlan is a named tenant template, as under plans: in the policy
	// file: a tenant record may take it (plan: NAME), or be created from
	// it (a copy of its section, then the tenant's own fields).
	KindPlan Kind = "plan"
)

// MaxSectionBytes bounds a section's JSON: far beyond any tenant's
// settings, small enough that every process holds every tenant.
const MaxSectionBytes = 64 << 10

// Section is a tenant or a plan managed through the admin API: what the
// API shows of it (adminapi.Section, its body in policy.Canonical form),
// and whether it was deleted.
type Section struct {
	adminapi.Section
	// Deleted ends the tenant or plan; the record stays so that versions
	// keep counting (a re-created one continues after it).
	Deleted bool `json:"deleted,omitempty"`
}

// Validate names a bad name or body and its limit. Whether the body is a
// valid tenant is the policy's to say, laid over a file (policy.Overlaid).
func (s *Section) Validate() error {
	var errs []error
	if !ValidTenant(s.Name) {
		errs = append(errs, fmt.Errorf("name: %q must be 1..%d characters of [A-Za-z0-9._:-]", s.Name, schemas.MaxTenantLen))
	}
	if len(s.Body) > MaxSectionBytes {
		errs = append(errs, fmt.Errorf("body: %d bytes; the limit is %d", len(s.Body), MaxSectionBytes))
	} else if _, err := policy.Canonical(s.Body); err != nil {
		errs = append(errs, fmt.Errorf("body: %w", err))
	}
	return errors.Join(errs...)
}

// API returns s as the admin API shows it.
func (s *Section) API() adminapi.Section { return s.Section }

// SectionDiff returns the settings that differ between before and after
// (nil: none), as the audit trail records them: top-level fields of the
// section, and deleted.
func SectionDiff(before, after *Section) []adminapi.Change {
	body := func(s *Section) any {
		if s == nil || s.Deleted {
			return nil
		}
		return s.Body
	}
	out := Diff(body(before), body(after))
	if before != nil && before.Deleted != after.Deleted {
		out = append(out, adminapi.Change{Field: "deleted", From: fmt.Sprint(before.Deleted), To: fmt.Sprint(after.Deleted)})
	} else if before == nil && after.Deleted {
		out = append(out, adminapi.Change{Field: "deleted", From: "false", To: "true"})
	}
	return out
}

// Section returns a copy of the tenant or plan name (kind KindTenant or
// KindPlan), deleted or not, or nil.
func (l *Log) Section(kind Kind, name string) *Section {
	return copyOf(l, string(kind)+"/"+name, sectionOf)
}

// Sections returns copies of the tenants or plans in force (not deleted),
// sorted by name.
func (l *Log) Sections(kind Kind) []*Section {
	return copiesOf(l, kind, sectionOf, func(s *Section) bool { return !s.Deleted },
		func(a, b *Section) bool { return a.Name < b.Name })
}

func sectionOf(r *Record) *Section { return r.Section }

// Overlay returns the tenants and plans in force, for a policy.Watcher to
// lay over its file.
func (l *Log) Overlay() policy.Overlay {
	o := policy.Overlay{Tenants: map[string]json.RawMessage{}, Plans: map[string]json.RawMessage{}}
	for _, s := range l.Sections(KindTenant) {
		o.Tenants[s.Name] = s.Body
	}
	for _, s := range l.Sections(KindPlan) {
		o.Plans[s.Name] = s.Body
	}
	return o
}

// HasSections reports whether r holds a tenant or a plan: a reader whose
// policy follows them lays the log's Overlay over its file when one applies.
func (r *Record) HasSections() bool { return r.Kind == KindTenant || r.Kind == KindPlan }

// PolicyConflicts is service's gauge of the tenants and plans that both
// the policy file and the admin API define, differently, as w last found
// them (policy.Watcher.Conflicts).
func PolicyConflicts(service string, w *policy.Watcher) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_" + service + "_policy_conflicts",
		Help: "Tenants and plans both the policy file and the admin API define, differently: the file's definition is in force until they agree or one goes (docs/controlplane.md)."},
		func() float64 { return float64(len(w.Conflicts())) })
}
