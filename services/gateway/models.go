package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"

	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// listModels answers GET /v1/models with the models this key may use:
// every model an upstream names exactly, every model an upstream serving
// patterns (`models: ["*"]`, `text-embedding-3-*`) lists in its own
// GET /models that its patterns match (asked at most every catalogTTL),
// and every exact name in the key's list that some upstream serves.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	rt := s.routes.Load()
	names := rt.exactModels()
	for _, pv := range rt.byName {
		names = append(names, pv.listed(r.Context(), s.log)...)
	}
	keyModels, _ := caller.Models()
	names = append(names, keyModels...)
	slices.Sort(names)
	names = slices.Compact(names)
	data := make([]modelObject, 0, len(names))
	for _, m := range names {
		if ups, _ := s.routes.Load().lookup(policy.DialectOpenAI, m); ups != nil && caller.MayUse(m) && !strings.ContainsAny(m, `*?[\`) {
			data = append(data, modelObject{ID: m, Object: "model", OwnedBy: "sluice"})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// getModel answers GET /v1/models/{model}.
func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	m := r.PathValue("model")
	if ups, _ := s.routes.Load().lookup(policy.DialectOpenAI, m); ups == nil || !caller.MayUse(m) {
		param := "model"
		ratelimit.WriteError(w, http.StatusNotFound, ratelimit.Error{Type: "invalid_request_error", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist or this API key may not use it.", m), Param: &param}, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(modelObject{ID: m, Object: "model", OwnedBy: "sluice"})
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// catalogTTL is how long an upstream's own model list is kept; a failed
// fetch is retried after catalogRetry, the previous list kept meanwhile.
const (
	catalogTTL     = 5 * time.Minute
	catalogRetry   = 30 * time.Second
	catalogTimeout = 5 * time.Second
	// maxCatalogBytes and maxCatalogModels bound what an upstream's list
	// may cost the gateway.
	maxCatalogBytes  = 4 << 20
	maxCatalogModels = 10_000
)

// catalog is what an upstream serving patterns answers to GET /models,
// the models its patterns match.
type catalog struct {
	mu     sync.Mutex
	models []string
	next   time.Time // when to ask again
}

// listed returns the models pv lists that its patterns serve, asking pv
// when its list is older than catalogTTL; nil when it serves no patterns.
func (pv *provider) listed(ctx context.Context, log *slog.Logger) []string {
	var patterns []string
	for _, m := range pv.cfg.Models {
		if strings.ContainsAny(m, `*?[\`) {
			patterns = append(patterns, m)
		}
	}
	if len(patterns) == 0 {
		return nil
	}
	c := &pv.catalog
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.After(c.next) {
		models, err := pv.fetchModels(ctx)
		if err != nil {
			log.Warn("gateway: could not list an upstream's models for /v1/models; its previous list is kept", "upstream", pv.cfg.Name, "err", err)
			c.next = now.Add(catalogRetry)
		} else {
			c.models, c.next = nil, now.Add(catalogTTL)
			for _, m := range models {
				if slices.ContainsFunc(patterns, func(p string) bool { ok, _ := path.Match(p, m); return ok }) {
					c.models = append(c.models, m)
				}
			}
		}
	}
	return slices.Clone(c.models)
}

// fetchModels asks pv for its models (OpenAI's GET /models).
func (pv *provider) fetchModels(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), catalogTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pv.cfg.BaseURL+"/models", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "sluice-gateway")
	if pv.key != "" {
		req.Header.Set("Authorization", "Bearer "+pv.key)
	}
	resp, err := pv.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /models answered %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxCatalogBytes)).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET /models: %w", err)
	}
	out := make([]string, 0, min(len(list.Data), maxCatalogModels))
	for _, d := range list.Data {
		if len(out) == maxCatalogModels {
			break
		}
		if d.ID != "" && len(d.ID) <= schemas.MaxModelLen {
			out = append(out, d.ID)
		}
	}
	return out, nil
}
