package gubernatorbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"

	"github.com/sluicehq/sluice/bench/sidebyside"
	"github.com/sluicehq/sluice/platform/itest"
)

// GubernatorVersion is the release measured, built from the module proxy
// with its own go.mod (go install ...@version): in this module its
// dependencies would be raised to Sluice's, and its daemon then fails at
// start (OpenTelemetry schema URLs in conflict).
const GubernatorVersion = "v2.13.0"

// gubernatorDaemon starts one gubernator daemon, configured by its GUBER_
// environment as its README and example.conf say: gRPC and HTTP on
// loopback, member-list discovery with itself as the known node (a
// cluster of one), the default cache (50,000 limits) and workers (one per
// core), tracing off. It returns its gRPC address and pid.
func gubernatorDaemon(b *testing.B) (string, int) {
	b.Helper()
	bin := sidebyside.PeerBinary(b, "gubernator", "github.com/gubernator-io/gubernator/v2/cmd/gubernator", GubernatorVersion)
	grpcAddr, ml := itest.FreeAddr(b), itest.FreeAddr(b)
	proc := sidebyside.StartPeer(b, bin,
		"GUBER_GRPC_ADDRESS="+grpcAddr, "GUBER_ADVERTISE_ADDRESS="+grpcAddr, "GUBER_HTTP_ADDRESS="+itest.FreeAddr(b),
		"GUBER_PEER_DISCOVERY_TYPE=member-list", "GUBER_MEMBERLIST_ADDRESS="+ml, "GUBER_MEMBERLIST_BIND_ADDRESS="+ml,
		"GUBER_MEMBERLIST_KNOWN_NODES="+ml, "GUBER_LOG_LEVEL=warn", "OTEL_TRACES_EXPORTER=none")
	c, err := guber.DialV1Server(grpcAddr, nil)
	if err != nil {
		b.Fatal(err)
	}
	itest.EventuallyNoError(b, 30*time.Second, "gubernator healthy with one peer", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err := c.HealthCheck(ctx, &guber.HealthCheckReq{})
		if err != nil {
			return err
		}
		if h.Status != "healthy" || h.PeerCount != 1 {
			return fmt.Errorf("status %q, %d peers", h.Status, h.PeerCount)
		}
		return nil
	})
	return grpcAddr, proc.Pid
}

// gubernatorSide sends each decision to the daemon as one GetRateLimits
// call of two limits: the window as gubernator's TOKEN_BUCKET (a count
// that resets duration after its first hit: a fixed window) and the bucket
// as its LEAKY_BUCKET (burst limit, leaking limit per duration). Unlike
// Sluice's Admit, the two are not all-or-nothing: a hit refused by one is
// still counted by the other.
func gubernatorSide(b *testing.B, name, addr string, pid int, ru sidebyside.Rules, behavior guber.Behavior) sidebyside.Side {
	b.Helper()
	c, err := guber.DialV1Server(addr, nil)
	if err != nil {
		b.Fatal(err)
	}
	scope := itest.Unique(b, "")
	return sidebyside.Side{
		Name: name, Servers: []int{pid}, Window: sidebyside.FixedReset,
		Decide: func(ctx context.Context, k int) (bool, int64, bool, error) {
			key := scope + sidebyside.KeyName(k)
			resp, err := c.GetRateLimits(ctx, &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{
				{Name: "window", UniqueKey: key, Hits: 1, Limit: ru.WindowLimit, Duration: ru.Window.Milliseconds(),
					Algorithm: guber.Algorithm_TOKEN_BUCKET, Behavior: behavior},
				{Name: "bucket", UniqueKey: key, Hits: 1, Limit: sidebyside.BucketBurst, Duration: sidebyside.BucketPeriod.Milliseconds(),
					Algorithm: guber.Algorithm_LEAKY_BUCKET, Behavior: behavior},
			}})
			if err != nil {
				return false, 0, false, err
			}
			if len(resp.Responses) != 2 {
				return false, 0, false, errors.New("gubernator answered " + strconv.Itoa(len(resp.Responses)) + " of 2 limits")
			}
			w, bk := resp.Responses[0], resp.Responses[1]
			if w.Error != "" || bk.Error != "" {
				return false, 0, false, errors.New(w.Error + bk.Error)
			}
			return w.Status == guber.Status_UNDER_LIMIT && bk.Status == guber.Status_UNDER_LIMIT, w.ResetTime, false, nil
		},
	}
}
