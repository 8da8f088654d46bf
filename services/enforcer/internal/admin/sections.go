package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
)

// SectionStore is where tenants and plans defined at runtime live: the
// admin topic, as the enforcer's replica reads it.
type SectionStore interface {
	// Section returns the tenant or plan name, deleted or not, or nil.
	Section(kind controlplane.Kind, name string) *controlplane.Section
	// Sections returns the tenants or plans in force.
	Sections(kind controlplane.Kind) []*controlplane.Section
	// PutSection writes s as the version after read (0: none yet) and
	// returns once it is in force on this replica; a change that read an
	// older version is refused with controlplane.ErrStale.
	PutSection(ctx context.Context, kind controlplane.Kind, s *controlplane.Section, read uint64, request string) error
	// Overlay returns the tenants and plans in force.
	Overlay() policy.Overlay
	// CheckOverlay returns why the policy file with o laid over it would
	// not validate (each problem naming its field), or nil.
	CheckOverlay(o policy.Overlay) error
	// Synced returns once the store holds every record the topic held at
	// the replica's start.
	Synced(ctx context.Context) error
}

// SectionAuditReader reads the audit entries of a tenant (or plan: its
// name is in the tenant column); *audit.Log is the real one.
type SectionAuditReader interface {
	ByTenant(ctx context.Context, tenant string) ([]audit.Entry, error)
}

// WithSections serves the tenant and plan routes (adminapi.KindTenant,
// adminapi.KindPlan) from store, with the audit trail read from trail.
func (a *API) WithSections(store SectionStore, trail SectionAuditReader) *API {
	a.sections, a.sectionAudit = store, trail
	return a
}

func (a *API) sectionRoutes(mux *http.ServeMux) {
	for _, k := range []adminapi.SectionKind{adminapi.KindTenant, adminapi.KindPlan} {
		route := func(pattern string, h func(http.ResponseWriter, *http.Request, adminapi.SectionKind)) {
			mux.Handle(pattern, a.syncedOn(a.sections.Synced, func(w http.ResponseWriter, r *http.Request) { h(w, r, k) }))
		}
		route("GET "+k.Path(), a.listSections)
		route("POST "+k.Path(), a.createSection)
		route("GET "+k.ItemPath(), func(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) {
			if s := a.visibleSection(w, r, k); s != nil {
				writeJSON(w, http.StatusOK, adminapi.SectionResponse{Section: s.API()})
			}
		})
		route("PUT "+k.ItemPath(), a.changeSection)
		route("DELETE "+k.ItemPath(), a.changeSection)
		route("GET "+k.AuditPath(), a.sectionTrail)
	}
}

func (a *API) listSections(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) {
	p := principalOf(r)
	out := []adminapi.Section{}
	for _, s := range a.sections.Sections(controlplane.Kind(k)) {
		if p.mayTouch(s.Name) {
			out = append(out, s.API())
		}
	}
	writeJSON(w, http.StatusOK, adminapi.SectionsResponse{Sections: out})
}

// visibleSection returns the tenant or plan the path names, or answers
// 404: another tenant is as unknown to a tenant admin as one that does not
// exist, so that names cannot be probed.
func (a *API) visibleSection(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) *controlplane.Section {
	name := r.PathValue("name")
	s := a.sections.Section(controlplane.Kind(k), name)
	if s == nil || s.Deleted || !principalOf(r).mayTouch(name) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("name: no %s %q", k, name))
		return nil
	}
	return s
}

func (a *API) createSection(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) {
	var req adminapi.CreateSectionRequest
	if !decodeBody(w, r, &req) {
		return
	}
	body, err := sectionBody(req.Body)
	errs := []error{err, checkReason(req.Reason)}
	if req.From != "" {
		pl := a.sections.Section(controlplane.KindPlan, req.From)
		switch {
		case k != adminapi.KindTenant:
			errs = append(errs, errors.New("from: only a tenant is created from a plan"))
		case pl == nil || pl.Deleted:
			errs = append(errs, fmt.Errorf("from: no plan %q (create it first: POST %s)", req.From, adminapi.KindPlan.Path()))
		case err == nil:
			body, err = overlaid(pl.Body, body)
			errs = append(errs, err)
		}
	}
	now := a.now().UTC()
	p := principalOf(r)
	s := &controlplane.Section{Section: adminapi.Section{Name: req.Name, Body: body, Stamp: adminapi.MadeBy(p.name, now)}}
	errs = append(errs, s.Validate())
	if err := errors.Join(errs...); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	cur := a.sections.Section(controlplane.Kind(k), req.Name)
	if cur != nil && !cur.Deleted {
		writeError(w, http.StatusConflict, fmt.Sprintf("name: %s %q exists; update it (PUT with its version)", k, req.Name))
		return
	}
	var read uint64
	if cur != nil {
		read = cur.Version
	}
	if a.putSection(w, r, k, k.Action("create"), cur, s, read, req.Reason) {
		writeJSON(w, http.StatusOK, adminapi.SectionResponse{Section: s.API()})
	}
}

// changeSection updates (PUT: UpdateSectionRequest) or deletes (DELETE:
// DeleteSectionRequest, a subset of it) the tenant or plan the path names.
func (a *API) changeSection(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) {
	var req adminapi.UpdateSectionRequest
	if !decodeBody(w, r, &req) {
		return
	}
	cur := a.visibleSection(w, r, k)
	if cur == nil || !a.freshVersion(w, string(k), cur.Name, k.ItemPath(), cur.Version, req.Version) {
		return
	}
	del := r.Method == http.MethodDelete
	body, err := sectionBody(req.Body)
	if del && len(req.Body) > 0 {
		err = errors.New("body: a deletion takes none")
	}
	if err := errors.Join(err, checkReason(req.Reason)); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if p := principalOf(r); p.role == adminapi.RoleTenantAdmin {
		if why := controlplane.SubBudgetsOnly(cur.Body, body); why != "" {
			writeError(w, http.StatusForbidden, "authorization: token "+p.name+" changes only its tenant's sub-budgets (limits scoped by user, key or session): "+why)
			return
		}
	}
	next := *cur
	next.UpdatedAt, next.UpdatedBy = a.now().UTC(), principalOf(r).name
	verb := "update"
	if del {
		next.Deleted, verb = true, "delete"
	} else {
		next.Body = body
	}
	if a.putSection(w, r, k, k.Action(verb), cur, &next, req.Version, req.Reason) {
		writeJSON(w, http.StatusOK, adminapi.SectionResponse{Section: next.API()})
	}
}

// putSection checks that the policy file with the change laid over it
// validates (a bad change is answered 400, naming the field), then audits
// it and writes it (auditedPut).
func (a *API) putSection(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind, action adminapi.Action,
	before, after *controlplane.Section, read uint64, reason string) bool {
	o := a.sections.Overlay()
	o.Tenants, o.Plans = clone(o.Tenants), clone(o.Plans)
	into := o.Tenants
	if k == adminapi.KindPlan {
		into = o.Plans
	}
	if after.Deleted {
		delete(into, after.Name)
	} else {
		into[after.Name] = after.Body
	}
	if err := a.sections.CheckOverlay(o); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	details, _ := json.Marshal(keyDetails{Version: read + 1, Changes: controlplane.SectionDiff(before, after)})
	e := audit.Entry{Actor: principalOf(r).name, Action: string(action), Tenant: after.Name, Reason: reason, Details: string(details)}
	return a.auditedPut(w, r, e, k.Action("refused"), string(k)+" "+after.Name, func(ctx context.Context, request string) error {
		return a.sections.PutSection(ctx, controlplane.Kind(k), after, read, request)
	})
}

// clone returns a copy of m, never nil.
func clone(m map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(m))
	maps.Copy(out, m)
	return out
}

func (a *API) sectionTrail(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) {
	s := a.visibleSection(w, r, k)
	if s == nil {
		return
	}
	if a.sectionAudit == nil {
		writeError(w, http.StatusServiceUnavailable, "audit log: not readable by this enforcer")
		return
	}
	entries, err := a.sectionAudit.ByTenant(r.Context(), s.Name)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "audit log: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, adminapi.AuditResponse{Entries: trailOf(entries, string(k)+".", k.Action("refused"), s.Name)})
}

// sectionBody returns body in policy.Canonical form ({} for none).
func sectionBody(body json.RawMessage) (json.RawMessage, error) {
	if len(body) == 0 {
		return json.RawMessage(`{}`), nil
	}
	c, err := policy.Canonical(body)
	if err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	return c, nil
}

// overlaid returns base's fields with over's laid over them, field by
// field at the top level: a tenant created from a plan.
func overlaid(base, over json.RawMessage) (json.RawMessage, error) {
	var b, o map[string]json.RawMessage
	if err := json.Unmarshal(base, &b); err != nil {
		return nil, fmt.Errorf("from: the plan's body: %w", err)
	}
	if err := json.Unmarshal(over, &o); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	if b == nil {
		b = map[string]json.RawMessage{}
	}
	maps.Copy(b, o)
	raw, _ := json.Marshal(b)
	return policy.Canonical(raw)
}
