package ingest

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
)

// Config is the ingest service's section of the Sluice configuration.
type Config struct {
	Listen         string              `yaml:"listen" help:"address of the events API (POST /v1/events)"`
	GatewayKeys    platform.FileSource `yaml:"gateway_keys" help:"the keys gateways present to ingest (id, sha256, tenants each may send for)"`
	AllowAnonymous bool                `yaml:"allow_anonymous" help:"accept requests without an API key when no gateway_keys.file is set (development only)"`

	MaxBodyBytes         int64         `yaml:"max_body_bytes" help:"largest request body in bytes, after gzip decoding (413 above)"`
	HotRouteMaxBodyBytes int64         `yaml:"hot_route_max_body_bytes" help:"POST /v1/events requests in HTTP/1.1's plainest form (a Content-Length body up to this many bytes; no chunking, Expect or Upgrade; no Connection header but keep-alive) are read and answered by Sluice's own connection loop, which costs about a quarter less CPU per one-event request than net/http's; everything else, and the rest of its connection, goes to net/http. 0: net/http serves everything. At most 1048576"`
	DecodeMemoryBytes    int64         `yaml:"decode_memory_bytes" help:"memory all requests being read and decoded may allocate together, in bytes: each gzip inflater, every array a body is read into (under twice its decoded size) and the decoder's copy, charged before they are allocated; a request that does not fit gets 503 with Retry-After. At least 3 × max_body_bytes + 64 KiB. What the process holds beyond it: services/ingest/README.md"`
	MaxEventsPerRequest  int           `yaml:"max_events_per_request" help:"most events one request may carry (413 above)"`
	MaxEventAge          time.Duration `yaml:"max_event_age" help:"events whose time is further in the past are rejected (0: no limit)"`
	MaxEventFuture       time.Duration `yaml:"max_event_future" help:"events whose time is further in the future are rejected, naming this limit (0: no limit beyond the schema's cap at 2105-12-31T23:59:59Z, where ClickHouse DateTime ends)"`

	InflightEvents  int           `yaml:"inflight_events" help:"events produced but not yet acknowledged, across all requests; beyond it requests get 503"`
	ProduceTimeout  time.Duration `yaml:"produce_timeout" help:"how long a request waits for the broker's acknowledgement before answering 503"`
	DeliveryTimeout time.Duration `yaml:"delivery_timeout" help:"how long the producer keeps retrying one record before failing it"`
	RetryAfter      time.Duration `yaml:"retry_after" help:"Retry-After sent with 503 answers"`
	Linger          time.Duration `yaml:"linger" help:"how long the producer waits to fill a batch of requests of more than small_request_max_events events"`
	Compression     string        `yaml:"compression" help:"produce batch compression: lz4, zstd, snappy, gzip or none"`
	// The small-request settings trade CPU for latency where gateways send
	// one event per request; see docs/scaling.md and bench/README.md
	// "One-event requests".
	SmallRequestMaxEvents   int           `yaml:"small_request_max_events" help:"requests of at most this many events go to a producer of their own, with small_request_linger and small_request_compression, so that one-event requests answer in about a broker round trip instead of waiting out linger; they still share batches with concurrent requests; 0: every request uses the one producer"`
	SmallRequestLinger      time.Duration `yaml:"small_request_linger" help:"how long the small-request producer waits for concurrent requests to join a batch: a produce request costs the broker about the same CPU whatever it carries, so a fraction of a millisecond saves the broker a third of its CPU per one-event request under load, at the price of this much latency on every small request; 0: send as soon as buffered. At most linger"`
	SmallRequestCompression string        `yaml:"small_request_compression" help:"compression of the small-request producer's batches: lz4, zstd, snappy, gzip or none; empty: the same as compression. none saves ingest and the broker CPU per one-event request (bench/README.md) but stores those events uncompressed, several times the bytes on the broker's disk"`

	DedupWindow time.Duration `yaml:"dedup_window" help:"how long an acknowledged event id is remembered to drop duplicates"`
	DedupMaxIDs int           `yaml:"dedup_max_ids" help:"most ids remembered; the oldest is forgotten first (about 110 bytes each, whatever the ids' length: a 128-bit hash of tenant, id and estimated is remembered)"`

	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"on shutdown, how long in-flight requests and the producer get to finish"`

	// UsageAPI is GET /v1/usage for the tenants a key may report.
	UsageAPI usageapi.Config `yaml:"usage_api"`
	// FollowAdmin lays the admin API's tenants and plans over the usage
	// API's policy, as the gateway's follow_admin does.
	FollowAdmin bool `yaml:"follow_admin" help:"with usage_api.enabled: follow the admin topic (topics.admin) for the tenants and plans managed through the enforcer's admin API, laid over policy.file, so a tenant without use yet reads the quotas in force, its record's; needs signal_auth. Off: policy.file's quotas only"`
}

// DefaultConfig returns the defaults. 50,000 in-flight events keep a few
// hundred milliseconds of throughput in the producer at the target rate
// while bounding its memory to tens of megabytes.
func DefaultConfig() Config {
	return Config{
		Listen:                "127.0.0.1:8080",
		GatewayKeys:           platform.FileSource{Reload: 5 * time.Second},
		MaxBodyBytes:          8 << 20,
		HotRouteMaxBodyBytes:  64 << 10,
		DecodeMemoryBytes:     256 << 20,
		MaxEventsPerRequest:   5000,
		MaxEventAge:           72 * time.Hour,
		MaxEventFuture:        5 * time.Minute,
		InflightEvents:        50_000,
		ProduceTimeout:        10 * time.Second,
		DeliveryTimeout:       60 * time.Second,
		RetryAfter:            time.Second,
		Linger:                5 * time.Millisecond,
		Compression:           "lz4",
		SmallRequestMaxEvents: 16,
		SmallRequestLinger:    300 * time.Microsecond,
		DedupWindow:           10 * time.Minute,
		DedupMaxIDs:           500_000,
		ShutdownTimeout:       15 * time.Second,
		UsageAPI:              usageapi.DefaultConfig(),
	}
}

// Validate checks every field and names the limit it crossed.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen: %q is not host:port", c.Listen)
	}
	if c.GatewayKeys.File == "" && !c.AllowAnonymous {
		bad("gateway_keys.file: is required (or set allow_anonymous: true for development)")
	}
	if err := c.GatewayKeys.Validate("gateway_keys"); err != nil {
		errs = append(errs, err)
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 1<<30 {
		bad("max_body_bytes: %d is outside 1024..1073741824", c.MaxBodyBytes)
	}
	if c.HotRouteMaxBodyBytes < 0 || c.HotRouteMaxBodyBytes > 1<<20 {
		bad("hot_route_max_body_bytes: %d is outside 0..1048576", c.HotRouteMaxBodyBytes)
	}
	if least := decodeCostFactor*c.MaxBodyBytes + decodeOverhead; c.DecodeMemoryBytes < least || c.DecodeMemoryBytes > 1<<40 {
		bad("decode_memory_bytes: %d is outside %d (3 × max_body_bytes + 64 KiB, so that one largest request fits)..1099511627776", c.DecodeMemoryBytes, least)
	}
	if c.MaxEventsPerRequest < 1 || c.MaxEventsPerRequest > 100_000 {
		bad("max_events_per_request: %d is outside 1..100000", c.MaxEventsPerRequest)
	}
	if c.MaxEventAge < 0 || c.MaxEventFuture < 0 {
		bad("max_event_age, services.ingest.max_event_future: must not be negative (0 disables)")
	}
	if c.InflightEvents < c.MaxEventsPerRequest {
		bad("inflight_events: %d is below services.ingest.max_events_per_request (%d); a full request could never be admitted", c.InflightEvents, c.MaxEventsPerRequest)
	}
	if c.InflightEvents > 10_000_000 {
		bad("inflight_events: %d is above the maximum 10000000", c.InflightEvents)
	}
	if c.ProduceTimeout <= 0 {
		bad("produce_timeout: must be positive")
	}
	if c.DeliveryTimeout < c.ProduceTimeout {
		bad("delivery_timeout: %s is below services.ingest.produce_timeout (%s)", c.DeliveryTimeout, c.ProduceTimeout)
	}
	if c.RetryAfter < time.Second {
		bad("retry_after: %s is below the minimum 1s (Retry-After counts whole seconds)", c.RetryAfter)
	}
	if c.Linger < 0 || c.Linger > time.Second {
		bad("linger: %s is outside 0..1s", c.Linger)
	}
	if _, err := codec(c.Compression); err != nil {
		bad("compression: %v", err)
	}
	if c.SmallRequestMaxEvents < 0 || c.SmallRequestMaxEvents > 1000 {
		bad("small_request_max_events: %d is outside 0..1000", c.SmallRequestMaxEvents)
	}
	if c.SmallRequestLinger < 0 || c.SmallRequestLinger > c.Linger {
		bad("small_request_linger: %s is outside 0..linger (%s)", c.SmallRequestLinger, c.Linger)
	}
	if c.SmallRequestCompression != "" {
		if _, err := codec(c.SmallRequestCompression); err != nil {
			bad("small_request_compression: %v", err)
		}
	}
	if c.DedupWindow <= 0 {
		bad("dedup_window: must be positive")
	}
	if c.DedupMaxIDs < 1000 || c.DedupMaxIDs > 100_000_000 {
		bad("dedup_max_ids: %d is outside 1000..100000000", c.DedupMaxIDs)
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown_timeout: must be positive")
	}
	if c.UsageAPI.Enabled {
		if err := c.UsageAPI.Validate("usage_api"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// smallRequestCodec is the small-request producer's codec: its own
// setting, or compression's when that is empty.
func (c Config) smallRequestCodec() (kgo.CompressionCodec, error) {
	return codec(cmp.Or(c.SmallRequestCompression, c.Compression))
}

// codec maps the compression name to franz-go's codec. lz4 is the default
// because CPU, not bandwidth, bounds events/s on a small ingest node.
// Measured on 100-event batches of varied usage-event JSON (32 KiB): lz4
// 26 µs per batch at 5.1x, zstd (default level) 80–130 µs at 9x. At
// 200,000 events/s zstd would spend 8–13% of a 2-core node on compression,
// lz4 under 3%; pick zstd where broker disk or cross-zone traffic costs
// more than ingest CPU.
func codec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "none":
		return kgo.NoCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("%q is not one of lz4, zstd, snappy, gzip, none", name)
}
