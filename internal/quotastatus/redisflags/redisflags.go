// Package redisflags reads the enforcement flags gateways see from Redis,
// in the layout of sdk/go/flags (one hash per tenant under a prefix): the
// quotastatus.FlagStore of the console and the usage API. It reads what
// the enforcer wrote, not the enforcer's memory, so it shows exactly what
// every gateway's Checker enforces.
package redisflags

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Store reads one flag layout. It is safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	layout flags.Layout
}

// New returns a Store reading the flags under prefix (the enforcer's
// key_prefix).
func New(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, layout: flags.Layout{Prefix: prefix}}
}

var _ quotastatus.FlagStore = (*Store)(nil)

// Flags returns tenant's flags active at now.
func (s *Store) Flags(ctx context.Context, tenant string, now time.Time) ([]quotastatus.Flag, error) {
	h, err := s.rdb.HGetAll(ctx, s.layout.TenantKey(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("redis flags of %s: %w", tenant, err)
	}
	return decode(h, now), nil
}

// maxTenantsPerRound bounds the pipelined reads of AllFlags.
const maxTenantsPerRound = 500

// AllFlags returns the active flags of every tenant with a flag hash.
func (s *Store) AllFlags(ctx context.Context, now time.Time) (map[string][]quotastatus.Flag, error) {
	var tenants []string
	seen := map[string]bool{}
	if err := s.layout.ScanTenants(ctx, s.rdb, func(t string) {
		if !seen[t] {
			seen[t] = true
			tenants = append(tenants, t)
		}
	}); err != nil {
		return nil, fmt.Errorf("redis flags: scan: %w", err)
	}
	out := map[string][]quotastatus.Flag{}
	for len(tenants) > 0 {
		n := min(len(tenants), maxTenantsPerRound)
		round := tenants[:n]
		tenants = tenants[n:]
		cmds := make([]*redis.MapStringStringCmd, len(round))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, t := range round {
				cmds[i] = p.HGetAll(ctx, s.layout.TenantKey(t))
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("redis flags: %w", err)
		}
		for i, t := range round {
			if fl := decode(cmds[i].Val(), now); len(fl) > 0 {
				out[t] = fl
			}
		}
	}
	return out, nil
}

// decode turns a flag hash into the active flags; the hash's bookkeeping
// fields (names starting with @ other than @key:) and values it cannot
// read are skipped, as a Checker skips them.
func decode(h map[string]string, now time.Time) []quotastatus.Flag {
	var out []quotastatus.Flag
	for field, v := range h {
		var f quotastatus.Flag
		switch {
		case strings.HasPrefix(field, flags.KeyFieldPrefix):
			f.APIKeyID = strings.TrimPrefix(field, flags.KeyFieldPrefix)
		case strings.HasPrefix(field, "@"):
			continue
		default:
			f.Model = field
		}
		fl, err := flags.Decode(v)
		if err != nil || !fl.Active(now) {
			continue
		}
		f.State, f.Kind, f.Quota, f.Reason = fl.State, fl.Kind, fl.Quota, fl.Reason
		f.RetryAfterSeconds = fl.RetryAfter.Seconds()
		if !fl.Until.IsZero() {
			u := fl.Until.UTC()
			f.Until = &u
		}
		if !fl.ResetsAt.IsZero() {
			r := fl.ResetsAt.UTC()
			f.ResetsAt = &r
		}
		out = append(out, f)
	}
	return out
}
