package frontend

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/priority"
)

// keyEntry is one tenant API key as the gateway's keys file lists it:
//
//	keys:
//	  - id: acme-prod              # named in events (api_key_id), logs and metrics
//	    sha256: 9f86d0818...       # hex SHA-256 of the key the application sends
//	    tenant: acme               # whom the tokens are charged to
//	    user: batch-jobs           # optional: the event's user (else the body's "user")
//	    models: [gpt-4o, "gpt-4o-mini*"]  # required; ["*"] for every model
//	    priority: normal           # optional default priority
//	    may_set_priority: false    # may the caller choose one (header x-sluice-priority)
//	    class: enterprise          # optional metrics label (tenants are not labels)
//
// The shared part (id, sha256, constant-time lookup, reloads) is
// internal/keyfile, as for ingest's keys.
type keyEntry struct {
	keyfile.Entry  `yaml:",inline"`
	Tenant         string   `yaml:"tenant"`
	User           string   `yaml:"user"`
	Models         []string `yaml:"models"`
	Priority       string   `yaml:"priority"`
	MaySetPriority bool     `yaml:"may_set_priority"`
	Class          string   `yaml:"class"`
}

// Caller is an authenticated tenant key: whom a request is charged to and
// what it may do.
type Caller struct {
	// KeyID is the key's id (the events' api_key_id).
	KeyID  string
	Tenant string
	// User is the key's user, empty when the key names none.
	User string
	// Priority is the key's default priority, empty for the tenant's.
	Priority schemas.Priority
	// MaySetPriority lets requests choose their priority.
	MaySetPriority bool
	// Class labels the tenant in metrics.
	Class string

	models   []string // exact names and patterns
	anyModel bool
	// endpoints are the URL paths (or path.Match patterns) the key may
	// call; nil is every endpoint. Only control-plane keys have them.
	endpoints []string
}

// MayCall reports whether the key may call the endpoint at urlPath.
func (c *Caller) MayCall(urlPath string) bool {
	if c == nil || c.endpoints == nil {
		return true
	}
	for _, e := range c.endpoints {
		if ok, _ := path.Match(e, urlPath); ok {
			return true
		}
	}
	return false
}

// Models lists the model names and patterns the key may use; any is true
// for a key that may use every model (models: ["*"]), and names is then nil.
func (c *Caller) Models() (names []string, any bool) { return c.models, c.anyModel }

// PriorityOf is the class a request of c runs under (priority.Effective):
// the key's own priority if its entry names one, else tenantClass (the
// policy's class of the key's tenant; empty is normal), moved by header
// (the request's priority.Header) — lowered by any caller, raised only by
// a key with may_set_priority. A nil c is a caller some proxy in front
// authenticated and named by header: its header is taken as given.
func (c *Caller) PriorityOf(tenantClass schemas.Priority, header string) (schemas.Priority, error) {
	base, g := tenantClass, priority.Grant{Max: schemas.PriorityCritical}
	if c != nil {
		if c.Priority != "" {
			base = c.Priority // ParseKeys validated it
		}
		if !c.MaySetPriority {
			g.Max = ""
		}
	}
	return priority.Effective(base, header, g)
}

// MayUse reports whether the key may call model.
func (c *Caller) MayUse(model string) bool {
	if c.anyModel {
		return true
	}
	for _, m := range c.models {
		if m == model {
			return true
		}
		if ok, _ := path.Match(m, model); ok {
			return true
		}
	}
	return false
}

// defaultClass is the metrics class of a key that names none.
const defaultClass = "default"

// ParseKeys reads a gateway keys file's content (see keyEntry for the
// format); every problem is reported with the entry's position and field.
// Set.Authenticate returns a key's Caller.
func ParseKeys(data []byte) (*keyfile.Set[Caller], error) {
	now := time.Now()
	return keyfile.Parse(data, func(where string, k *keyEntry) (*Caller, []error) {
		var errs []error
		bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(where+format, args...)) }
		c := &Caller{KeyID: k.ID, Tenant: k.Tenant, User: k.User, Priority: schemas.Priority(k.Priority),
			MaySetPriority: k.MaySetPriority, Class: k.Class}
		probe := schemas.UsageEvent{ID: "x", Time: now, Tenant: k.Tenant, Model: "x", APIKeyID: k.ID, User: k.User, Priority: c.Priority}
		if err := probe.Validate(); err != nil {
			if k.Tenant == "" {
				bad(".tenant: key %q names no tenant; every key charges one tenant", k.ID)
			} else {
				bad(": key %q: %v", k.ID, err)
			}
		}
		switch {
		case len(k.Models) == 0:
			bad(`.models: key %q lists no models; list those it may use (models: [gpt-4o, "gpt-4o-mini*"]) or write models: ["*"] for every model`, k.ID)
		case slices.Contains(k.Models, "*"):
			if len(k.Models) > 1 {
				bad(`.models: key %q mixes "*" (every model) with names; "*" must be the only entry`, k.ID)
			}
			c.anyModel = true
		default:
			for i, m := range k.Models {
				if _, err := path.Match(m, ""); m == "" || err != nil {
					bad(".models[%d]: %q is not a model name or pattern", i, m)
				}
			}
			c.models = k.Models
		}
		if c.Class == "" {
			c.Class = defaultClass
		}
		if len(c.Class) > 32 || !labelSafe(c.Class) {
			bad(".class: %q must be 1..32 letters, digits, _ or -", c.Class)
		}
		return c, errs
	})
}

func labelSafe(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return s != ""
}

// openKeys opens the keys file, watched for changes; onReload counts
// reloads.
func OpenKeys(path string, log *slog.Logger, onReload func(error)) (*keyfile.File[Caller], error) {
	return keyfile.Open(path, ParseKeys, log, onReload)
}

// KeyLine returns the keys file entry for a tenant key: its id, the
// SHA-256 of secret and the rest as given, for tools and tests that
// write a keys file (the demo). models nil means every model.
func KeyLine(id, secret, tenant string, models []string) string {
	sum := sha256.Sum256([]byte(secret))
	m := `["*"]`
	if models != nil {
		m = "["
		for i, x := range models {
			if i > 0 {
				m += ", "
			}
			m += fmt.Sprintf("%q", x)
		}
		m += "]"
	}
	return fmt.Sprintf("  - {id: %q, sha256: %s, tenant: %q, models: %s}\n", id, hex.EncodeToString(sum[:]), tenant, m)
}
