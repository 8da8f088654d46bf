package flags

import (
	"context"
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
