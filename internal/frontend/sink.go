package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/sdk/go/emitter"
)

// EventSink says where usage events go: ingest's API, Kafka, or nowhere,
// and how the Emitter buffers them (NewEmitter builds it). services/authz
// sends its refusal events with one.
type EventSink struct {
	Sink             string        `yaml:"sink" help:"where usage events go: ingest (HTTP, ingest_url), kafka (straight to topics.usage with the root kafka settings) or none (metering off)"`
	IngestURL        string        `yaml:"ingest_url" help:"base URL of Sluice's ingest API"`
	IngestAPIKeyFile string        `yaml:"ingest_api_key_file" help:"file holding the key ingest knows this gateway by (see services.ingest.keys_file)"`
	IngestAPIKeyEnv  string        `yaml:"ingest_api_key_env" help:"environment variable holding that key, instead of a file"`
	BufferEvents     int           `yaml:"buffer_events" help:"events held while Sluice is slow or away; beyond it new events are dropped and counted (sluice_emitter_dropped_events_total)"`
	FlushInterval    time.Duration `yaml:"flush_interval" help:"how long an event may wait for a batch to fill"`
	FlushTimeout     time.Duration `yaml:"flush_timeout" help:"on shutdown, after the requests in flight, how long buffered events get to reach Sluice"`
}

// Sinks.
const (
	SinkIngest = "ingest"
	SinkKafka  = "kafka"
	SinkNone   = "none"
)

// DefaultEventSink returns the usage sink's defaults: ingest's API on
// this host, with the Emitter's buffer and flush settings.
func DefaultEventSink() EventSink {
	return EventSink{
		Sink:          SinkIngest,
		IngestURL:     "http://127.0.0.1:8080",
		BufferEvents:  100_000,
		FlushInterval: 200 * time.Millisecond,
		FlushTimeout:  5 * time.Second,
	}
}

// Validate checks the usage settings, naming each as p.<setting>
// (p is the section, e.g. services.gateway.usage).
func (u EventSink) Validate(p string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch u.Sink {
	case SinkIngest:
		if b, err := url.Parse(u.IngestURL); err != nil || (b.Scheme != "http" && b.Scheme != "https") || b.Host == "" {
			bad(p+".ingest_url: %q is not an http(s) URL", u.IngestURL)
		}
		if u.IngestAPIKeyEnv != "" && u.IngestAPIKeyFile != "" {
			bad("%s: set ingest_api_key_env or ingest_api_key_file, not both", p)
		}
		if _, err := u.ingestKey(); err != nil {
			bad(p+".%w", err)
		}
	case SinkKafka, SinkNone:
	default:
		bad(p+".sink: %q is not one of ingest, kafka, none", u.Sink)
	}
	if u.Sink != SinkNone {
		if u.BufferEvents < 100 || u.BufferEvents > 10_000_000 {
			bad(p+".buffer_events: %d is outside 100..10000000", u.BufferEvents)
		}
		if u.FlushInterval < time.Millisecond || u.FlushInterval > time.Minute {
			bad(p+".flush_interval: %s is outside 1ms..1m", u.FlushInterval)
		}
		if u.FlushTimeout <= 0 {
			bad("%s.flush_timeout: must be positive", p)
		}
	}
	return errors.Join(errs...)
}

// ingestKey reads the key the gateway presents to ingest.
func (u EventSink) ingestKey() (string, error) {
	return Secret("ingest_api_key_env", u.IngestAPIKeyEnv, "ingest_api_key_file", u.IngestAPIKeyFile)
}

// secret reads a credential named by an environment variable or a file,
// naming the setting when it is missing or empty.
func Secret(envSetting, env, fileSetting, file string) (string, error) {
	switch {
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s: environment variable %s is not set or empty", envSetting, env)
		}
		return strings.TrimSpace(v), nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", fileSetting, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || len(v) > 4096 {
			return "", fmt.Errorf("%s: %s must hold one key (1..4096 bytes)", fileSetting, file)
		}
		return v, nil
	}
	return "", nil
}

// NewEmitter builds the Emitter of cfg's sink (nil for sink none) and the
// function that closes its sender once the Emitter is closed; its metrics
// go to env.Metrics labelled with service (see serviceMetrics).
// services/authz sends its refusal events with it.
func NewEmitter(cfg EventSink, service string, env platform.Env) (*emitter.Emitter, func(), error) {
	var sender emitter.Sender
	closeSender := func() {}
	switch cfg.Sink {
	case SinkNone:
		return nil, closeSender, nil
	case SinkKafka:
		if len(env.Kafka.Brokers) == 0 {
			return nil, nil, errors.New("usage.sink kafka: kafka.brokers is empty; name the brokers or use sink ingest")
		}
		if err := env.Topics.Check("usage"); err != nil {
			return nil, nil, fmt.Errorf("usage.sink kafka: %w", err)
		}
		kopts, err := env.Kafka.Options()
		if err != nil {
			return nil, nil, err
		}
		ks, err := emitter.NewKafkaSender(env.Topics.Usage, kopts...)
		if err != nil {
			return nil, nil, err
		}
		sender, closeSender = ks, ks.Close
	default:
		key, err := cfg.ingestKey()
		if err != nil {
			return nil, nil, err
		}
		sender = &emitter.HTTPSender{URL: strings.TrimRight(cfg.IngestURL, "/"), APIKey: key}
	}
	ecfg := emitter.DefaultConfig()
	ecfg.MaxBufferedEvents = cfg.BufferEvents
	ecfg.BatchSize = min(ecfg.BatchSize, cfg.BufferEvents)
	ecfg.FlushInterval = cfg.FlushInterval
	ecfg.Logger = env.Logger.With("component", "emitter")
	ecfg.Registerer = ServiceMetrics(env, service)
	em, err := emitter.New(sender, ecfg)
	if err != nil {
		closeSender()
		return nil, nil, err
	}
	return em, closeSender, nil
}

// CloseEmitter sends what em still holds, waiting at most timeout, then
// closes its sender; a nil em does nothing.
func CloseEmitter(ctx context.Context, em *emitter.Emitter, closeSender func(), timeout time.Duration, log *slog.Logger) {
	if em == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := em.Close(cctx); err != nil {
		log.Error("usage events were lost at shutdown", "err", err)
	}
	closeSender()
}
