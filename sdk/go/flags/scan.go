package flags

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ScanKeys calls fn with every key matching pattern (a SCAN MATCH
// pattern): on each master of a Redis Cluster, since a cluster's SCAN
// covers only the node it reaches, or on the one server otherwise. fn is
// never called concurrently; a key may be seen twice, as with SCAN.
func ScanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(key string)) error {
	scan := func(ctx context.Context, c redis.Cmdable, fn func(string)) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			fn(iter.Val())
		}
		return iter.Err()
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, rdb, fn)
	}
	var mu sync.Mutex
	return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return scan(ctx, node, func(k string) {
			mu.Lock()
			defer mu.Unlock()
			fn(k)
		})
	})
}

// ScanTenants calls fn with every tenant that has a flag hash under l, on
// every master of a Redis Cluster (see ScanKeys).
func (l Layout) ScanTenants(ctx context.Context, rdb redis.UniversalClient, fn func(tenant string)) error {
	return ScanKeys(ctx, rdb, l.TenantPattern(), func(key string) {
		if t, ok := l.TenantFromKey(key); ok {
			fn(t)
		}
	})
}

// UnlinkKeys removes every key matching pattern (see ScanKeys), one
// UNLINK per key, 1,000 per pipeline (a cluster refuses one UNLINK of
// keys in several slots): a deployment's or a test's whole prefix, a
// million keys included, in few round trips.
func UnlinkKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) error {
	var batch []string
	var errs []error
	drop := func() {
		if len(batch) > 0 {
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			}); err != nil {
				errs = append(errs, fmt.Errorf("unlink %d keys matching %s: %w", len(batch), pattern, err))
			}
			batch = batch[:0]
		}
	}
	err := ScanKeys(ctx, rdb, pattern, func(k string) {
		batch = append(batch, k)
		if len(batch) == 1000 {
			drop()
		}
	})
	drop()
	if err != nil {
		errs = append(errs, fmt.Errorf("scan %s: %w", pattern, err))
	}
	return errors.Join(errs...)
}
