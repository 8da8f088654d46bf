package frontend

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/keyfile"
)

// TopicKeys are the tenant keys issued through the admin API
// (internal/controlplane), which a gateway that follows the admin topic
// accepts beside its keys file.
//
// Precedence, the one rule (docs/controlplane.md): a key id is defined in
// one place. A control-plane key whose id the keys file also lists is a
// conflict: it is not accepted — the file's key is, as before the key was
// issued — and the conflict is reported at start, at every keys file
// reload and at every change of the control-plane keys (an error log, and
// sluice_gateway_key_conflicts) until one of the two goes.
type TopicKeys struct {
	src  *controlplane.Log
	file func() *keyfile.Set[Caller]
	log  *slog.Logger

	// mu serializes Refresh, so that two rebuilds cannot store out of order.
	mu        sync.Mutex
	set       atomic.Pointer[keyfile.Set[topicKey]]
	conflicts atomic.Pointer[[]string]
	gauge     prometheus.GaugeFunc
}

// topicKey is one accepted hash of a control-plane key: its current secret
// or, during a rotation's overlap, its previous one.
type topicKey struct {
	caller *Caller
	key    *controlplane.Key
	sha    string
}

// NewTopicKeys returns the keys of src, checked against the ids of the
// keys file file() returns; call Refresh after src or the file changed.
func NewTopicKeys(src *controlplane.Log, file func() *keyfile.Set[Caller], log *slog.Logger) *TopicKeys {
	t := &TopicKeys{src: src, file: file, log: log}
	t.set.Store(keyfile.NewSet[topicKey](nil, nil, nil))
	t.conflicts.Store(&[]string{})
	t.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_gateway_key_conflicts",
		Help: "Key ids both the keys file and the control plane (admin API) define; the control plane's key is not accepted until one goes (docs/controlplane.md)."},
		func() float64 { return float64(len(*t.conflicts.Load())) })
	return t
}

// Collector is the conflicts gauge, for the host to register.
func (t *TopicKeys) Collector() prometheus.Collector { return t.gauge }

// Refresh rebuilds the accepted keys from the log and reports conflicts
// with the keys file. Revoked keys are left out; expiry and a rotation's
// overlap are checked per request (Authenticate), so that a key ends on
// time without a rebuild.
func (t *TopicKeys) Refresh() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var fileIDs []string
	if f := t.file(); f != nil {
		fileIDs = f.IDs()
	}
	var ids []string
	var hashes [][sha256.Size]byte
	var vals []*topicKey
	conflicts := []string{}
	for _, k := range t.src.Keys("") {
		if _, found := slices.BinarySearch(fileIDs, k.ID); found {
			conflicts = append(conflicts, k.ID)
			continue
		}
		if k.Revoked {
			continue
		}
		c := CallerOf(k)
		for _, sha := range []string{k.SHA256, k.PreviousSHA256} {
			raw, err := hex.DecodeString(sha)
			if sha == "" || err != nil || len(raw) != sha256.Size {
				continue
			}
			ids, hashes = append(ids, k.ID), append(hashes, [sha256.Size]byte(raw))
			vals = append(vals, &topicKey{caller: c, key: k, sha: sha})
		}
	}
	t.set.Store(keyfile.NewSet(ids, hashes, vals))
	t.conflicts.Store(&conflicts)
	if len(conflicts) > 0 {
		t.log.Error("key ids defined both in tenant_keys.file and through the admin API: the admin API's keys of these ids are not accepted; remove one of the two (docs/controlplane.md)",
			"ids", conflicts)
	}
}

// Conflicts returns the conflicting ids of the last Refresh, sorted.
func (t *TopicKeys) Conflicts() []string { return slices.Clone(*t.conflicts.Load()) }

// Authenticate returns the caller of secret at now, or nil: unknown,
// revoked, expired, or a rotated-out secret past its overlap.
func (t *TopicKeys) Authenticate(secret string, now time.Time) *Caller {
	k := t.set.Load().Authenticate(secret)
	if k == nil || !k.key.ValidAt(k.sha, now) {
		return nil
	}
	return k.caller
}

// ByID returns the caller of key id of tenant if it is accepted at now, or
// nil.
func (t *TopicKeys) ByID(tenant, id string, now time.Time) *Caller {
	for _, k := range t.set.Load().Values() {
		if k.key.ID == id && k.key.Tenant == tenant && k.key.ValidAt(k.sha, now) {
			return k.caller
		}
	}
	return nil
}

// CallerOf returns the caller a control-plane key authenticates as: its
// tenant, models and endpoints, the default class and priority.
func CallerOf(k *controlplane.Key) *Caller {
	c := &Caller{KeyID: k.ID, Tenant: k.Tenant, Class: defaultClass}
	if slices.Contains(k.Models, "*") {
		c.anyModel = true
	} else {
		c.models = slices.Clone(k.Models)
	}
	if len(k.Endpoints) > 0 {
		c.endpoints = slices.Clone(k.Endpoints)
	}
	return c
}
