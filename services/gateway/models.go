package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// listModels answers GET /v1/models with the models this key may use:
// every model an upstream names exactly, and every exact name in the
// key's list that some upstream's pattern serves. Models reachable only
// through patterns on both sides cannot be listed.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	names := s.routes.Load().exactModels()
	keyModels, _ := caller.Models()
	names = append(names, keyModels...)
	slices.Sort(names)
	names = slices.Compact(names)
	data := make([]modelObject, 0, len(names))
	for _, m := range names {
		if ups, _ := s.routes.Load().lookup(m); ups != nil && caller.MayUse(m) && !strings.ContainsAny(m, `*?[\`) {
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
	if ups, _ := s.routes.Load().lookup(m); ups == nil || !caller.MayUse(m) {
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
