package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// cookieName names the session cookie.
const cookieName = "sluice_console"

// maxSessions bounds the logins held in memory; beyond it the one closest
// to expiry is dropped (its operator logs in again).
const maxSessions = 1000

// session is one logged-in operator: the admin token they typed, kept in
// memory only, the client that acts with it, and who the enforcer says
// the token is (its role decides what the pages offer; the enforcer
// enforces it anyway).
type session struct {
	client  *adminapi.Client
	who     adminapi.WhoAmIResponse
	expires time.Time
}

// mayAct reports whether the session may see and change the fleet's
// breakers, flags and overrides: operators only.
func (s *session) mayAct() bool { return s.who.Role == adminapi.RoleOperator }

// maySee reports whether the session may see tenant's page: a tenant
// administrator sees its own tenant only.
func (s *session) maySee(tenant string) bool {
	return s.who.Role != adminapi.RoleTenantAdmin || s.who.Tenant == tenant
}

// mayManage reports whether the session may manage tenant: issue, rotate
// and revoke its API keys, and change its sub-budgets (limits scoped by
// user, key or session) where the admin API defines it; an operator may
// change the whole of it (mayAct).
func (s *session) mayManage(tenant string) bool {
	return s.who.Role == adminapi.RoleOperator || (s.who.Role == adminapi.RoleTenantAdmin && s.who.Tenant == tenant)
}

// sessions are the console's logins, by random id.
type sessions struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[string]session
}

func newSessions(ttl time.Duration, maxN int) *sessions {
	return &sessions{ttl: ttl, max: maxN, now: time.Now, m: map[string]session{}}
}

// add stores a session and returns its id.
func (ss *sessions) add(c *adminapi.Client, who adminapi.WhoAmIResponse) string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.m) >= ss.max {
		var oldest string
		for k, v := range ss.m {
			if oldest == "" || v.expires.Before(ss.m[oldest].expires) {
				oldest = k
			}
		}
		delete(ss.m, oldest)
	}
	ss.m[id] = session{client: c, who: who, expires: ss.now().Add(ss.ttl)}
	return id
}

// get returns the live session of r, nil for none.
func (ss *sessions) get(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[ck.Value]
	if !ok || !ss.now().Before(s.expires) {
		return nil
	}
	return &s
}

func (ss *sessions) remove(r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		ss.mu.Lock()
		delete(ss.m, ck.Value)
		ss.mu.Unlock()
	}
}

// expireLoop drops expired sessions every interval until ctx ends.
func (ss *sessions) expireLoop(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, func() {
		now := ss.now()
		ss.mu.Lock()
		defer ss.mu.Unlock()
		for k, v := range ss.m {
			if !now.Before(v.expires) {
				delete(ss.m, k)
			}
		}
	})
}

func (s *server) loginForm(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "login", http.StatusOK, loginPage{Next: safeNext(r.URL.Query().Get("next"))})
}

// loginPage is the login form's data.
type loginPage struct {
	Next, Error string
}

// login checks the token against the enforcer's admin API, which says who
// it is, and opens a session.
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	token := r.PostFormValue("token")
	next := safeNext(r.PostFormValue("next"))
	if token == "" {
		s.render(w, r, "login", http.StatusBadRequest, loginPage{Next: next, Error: "Enter an admin API token (one of services.enforcer.admin.tokens)."})
		return
	}
	c, err := adminapi.NewClient(s.adminURL, token, s.admin)
	if err != nil {
		s.render(w, r, "login", http.StatusBadRequest, loginPage{Next: next, Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	who, err := c.WhoAmI(ctx)
	if err != nil {
		var ae *adminapi.Error
		msg := fmt.Sprintf("The enforcer's admin API at %s did not answer (%v); is the enforcer running with admin.listen?", s.adminURL, err)
		status := http.StatusBadGateway
		if errors.As(err, &ae) && (ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden) {
			msg, status = "The enforcer does not know this token.", http.StatusUnauthorized
		}
		s.render(w, r, "login", status, loginPage{Next: next, Error: msg})
		return
	}
	id := s.sessions.add(c, who)
	if who.Role == adminapi.RoleTenantAdmin && next == "/" {
		next = tenantURL(who.Tenant)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/", HttpOnly: true, Secure: s.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.cfg.SessionTTL.Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *server) logout(w http.ResponseWriter, r *http.Request) {
	s.sessions.remove(r)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this site: a path, never a URL
// elsewhere.
func safeNext(next string) string {
	if len(next) < 1 || next[0] != '/' || (len(next) > 1 && (next[1] == '/' || next[1] == '\\')) {
		return "/"
	}
	return next
}
