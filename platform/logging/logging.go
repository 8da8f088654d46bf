// Package logging builds the process logger (log/slog) from configuration:
// JSON for machines by default, text for a person at a terminal.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Config selects the log level and format.
type Config struct {
	Level  string `yaml:"level" help:"log level: debug, info, warn or error"`
	Format string `yaml:"format" help:"log format: json or text"`
}

// Defaults returns info-level JSON logs.
func Defaults() Config { return Config{Level: "info", Format: "json"} }

// Validate reports an unknown level or format.
func (c Config) Validate() error {
	if _, err := parseLevel(c.Level); err != nil {
		return err
	}
	switch c.Format {
	case "json", "text":
		return nil
	}
	return fmt.Errorf("log.format: %q is not one of json, text", c.Format)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", s)
	}
	return l, nil
}

// New returns a logger writing to w as configured. The config must have
// passed Validate; an unknown level falls back to info.
func New(c Config, w io.Writer) *slog.Logger {
	level, err := parseLevel(c.Level)
	if err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
