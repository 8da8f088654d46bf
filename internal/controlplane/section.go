package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

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

// SubBudgetsOnly says why after, a tenant's section, is more than before
// with its sub-budgets changed, or "": a tenant administrator may add,
// change and remove the limits of its tenant scoped by user, key or
// session, nothing else. Both must be in policy.Canonical form, as
// records are: the other settings are compared byte for byte. Each call is
// checked against every level's limits (docs/admission.md), so a
// sub-budget never lets the tenant past its own: it only divides it.
func SubBudgetsOnly(before, after json.RawMessage) string {
	var b, a map[string]json.RawMessage
	if json.Unmarshal(before, &b) != nil || json.Unmarshal(after, &a) != nil {
		return "the sections do not decode"
	}
	for _, f := range slices.Sorted(maps.Keys(unionOf(b, a))) {
		if f != "limits" && !bytes.Equal(b[f], a[f]) {
			return f + " is not a sub-budget"
		}
	}
	var bl, al map[string]json.RawMessage
	_ = json.Unmarshal(b["limits"], &bl)
	_ = json.Unmarshal(a["limits"], &al)
	for _, name := range slices.Sorted(maps.Keys(unionOf(bl, al))) {
		if bytes.Equal(bl[name], al[name]) {
			continue
		}
		for _, rule := range []json.RawMessage{bl[name], al[name]} {
			if rule != nil && !perCaller(rule) {
				return "limits." + name + " is not scoped by user, key or session"
			}
		}
	}
	return ""
}

// perCaller reports whether a limit's scope names a user, key or session.
func perCaller(rule json.RawMessage) bool {
	var r struct {
		Scope map[string]string `json:"scope"`
	}
	if json.Unmarshal(rule, &r) != nil {
		return false
	}
	return r.Scope["user"] != "" || r.Scope["key"] != "" || r.Scope["session"] != ""
}

// unionOf is the set of the keys of a and b.
func unionOf(a, b map[string]json.RawMessage) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
