package ingest

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/policy"
)

// openUsageAPI builds GET /v1/usage on policy.file and, with follow_admin,
// the admin topic's tenants and plans laid over it (read to the end before
// the API answers); follow keeps both current until its context ends.
func openUsageAPI(ctx context.Context, cfg Config, env platform.Env) (api *usageapi.API, follow func(context.Context) error, closeAPI func(), err error) {
	log := env.Logger.With("component", "usage-api")
	if !cfg.FollowAdmin {
		a, err := usageapi.Open(cfg.UsageAPI, env, log)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("services.ingest.%w", err)
		}
		return a, a.Run, a.Close, nil
	}
	if env.Policy.File == "" {
		return nil, nil, nil, fmt.Errorf("services.ingest.follow_admin: policy.file is required: the records are laid over it")
	}
	pw, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("policy.file: %w", err)
	}
	f, stop, err := controlplane.FollowPolicy(ctx, "ingest", env, pw, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("services.ingest.follow_admin: %w", err)
	}
	if err := f.CatchUp(ctx); err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("services.ingest.follow_admin: read admin topic %s: %w", env.Topics.Admin, err)
	}
	a := usageapi.OpenOn(cfg.UsageAPI, env, pw, log)
	follow = func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return pw.Run(gctx) })
		g.Go(func() error { return f.Run(gctx) })
		return g.Wait()
	}
	return a, follow, func() { a.Close(); stop() }, nil
}
