package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// SectionKind is a kind of record whose body is a section of the policy
// file (docs/controlplane.md): a tenant, or a plan (a tenant template).
type SectionKind string

// The section kinds, each served under its Path.
const (
	// KindTenant: /admin/v1/tenants[/{name}[/audit]].
	KindTenant SectionKind = "tenant"
	// KindPlan: /admin/v1/plans[/{name}[/audit]].
	KindPlan SectionKind = "plan"
)

// Path is the collection route of k: GET lists (SectionsResponse), POST
// creates (CreateSectionRequest, answered by SectionResponse).
func (k SectionKind) Path() string { return "/admin/v1/" + string(k) + "s" }

// ItemPath is the route of one: GET reads (SectionResponse), PUT updates
// (UpdateSectionRequest), DELETE deletes (DeleteSectionRequest). Its
// {name} is the tenant's or plan's name.
func (k SectionKind) ItemPath() string { return k.Path() + "/{name}" }

// AuditPath is the route of one's audit trail: GET, AuditResponse.
func (k SectionKind) AuditPath() string { return k.ItemPath() + "/audit" }

// Action returns the audit trail's action of verb (create, update,
// delete, refused) on a record of k, such as tenant.update.
func (k SectionKind) Action(verb string) Action { return Action(string(k) + "." + verb) }

// Section is a tenant or plan as the admin API shows it.
type Section struct {
	Name string `json:"name"`
	// Body is the section as the policy file holds it under tenants: (or
	// plans:), as JSON: quotas (models:), admission limits (limits:),
	// budget, timezone, organization, plan, fail_mode, priority,
	// channels...
	Body json.RawMessage `json:"body"`
	Stamp
}

// CreateSectionRequest creates a tenant or plan.
type CreateSectionRequest struct {
	Name string `json:"name"`
	// From (tenants only) is a plan whose section the tenant starts from:
	// its fields are copied, then Body's fields replace them.
	From string          `json:"from,omitempty"`
	Body json.RawMessage `json:"body,omitempty"`
	// Reason is required, for the audit trail.
	Reason string `json:"reason"`
}

// UpdateSectionRequest replaces a tenant's or plan's section with Body.
type UpdateSectionRequest struct {
	// Version is the version the caller read; required.
	Version uint64          `json:"version"`
	Body    json.RawMessage `json:"body"`
	Reason  string          `json:"reason"`
}

// DeleteSectionRequest deletes a tenant or plan.
type DeleteSectionRequest struct {
	// Version is the version the caller read; required.
	Version uint64 `json:"version"`
	Reason  string `json:"reason"`
}

// SectionResponse answers a read, create, update or delete.
type SectionResponse struct {
	Section Section `json:"section"`
}

// SectionsResponse answers a list, sorted by name; never null.
type SectionsResponse struct {
	Sections []Section `json:"sections"`
}

// itemURL is the path of one tenant or plan (names are [A-Za-z0-9._:-]).
func itemURL(k SectionKind, name string) string { return k.Path() + "/" + url.PathEscape(name) }

// CreateSection creates a tenant or plan.
func (c *Client) CreateSection(ctx context.Context, k SectionKind, req CreateSectionRequest) (Section, error) {
	var r SectionResponse
	err := c.post(ctx, k.Path(), req, &r)
	return r.Section, err
}

// Sections lists the tenants or plans the token may see.
func (c *Client) Sections(ctx context.Context, k SectionKind) ([]Section, error) {
	var r SectionsResponse
	err := c.get(ctx, k.Path(), "", &r)
	return r.Sections, err
}

// Section reads one tenant or plan.
func (c *Client) Section(ctx context.Context, k SectionKind, name string) (Section, error) {
	var r SectionResponse
	err := c.get(ctx, itemURL(k, name), "", &r)
	return r.Section, err
}

// UpdateSection replaces a tenant's or plan's section.
func (c *Client) UpdateSection(ctx context.Context, k SectionKind, name string, req UpdateSectionRequest) (Section, error) {
	var r SectionResponse
	err := c.send(ctx, http.MethodPut, itemURL(k, name), req, &r)
	return r.Section, err
}

// DeleteSection deletes a tenant or plan.
func (c *Client) DeleteSection(ctx context.Context, k SectionKind, name string, req DeleteSectionRequest) (Section, error) {
	var r SectionResponse
	err := c.send(ctx, http.MethodDelete, itemURL(k, name), req, &r)
	return r.Section, err
}

// SectionAudit returns a tenant's or plan's audit trail, oldest first.
func (c *Client) SectionAudit(ctx context.Context, k SectionKind, name string) ([]AuditEntry, error) {
	var r AuditResponse
	err := c.get(ctx, itemURL(k, name)+"/audit", "", &r)
	return r.Entries, err
}

func (c *Client) send(ctx context.Context, method, path string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("adminapi: %s: %w", path, err)
	}
	return c.call(ctx, method, c.url(path, ""), bytes.NewReader(body), out)
}
