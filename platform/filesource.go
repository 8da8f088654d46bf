package platform

import (
	"errors"
	"fmt"
	"time"
)

// FileSource is a file a service follows: read at start and re-read when
// it changes, such as the quota policy (the root policy section) and the
// tenant keys (tenant_keys). One type for every such section, so that
// they are spelled and validated alike.
type FileSource struct {
	File   string        `yaml:"file" help:"path of the file (empty: none)"`
	Reload time.Duration `yaml:"reload" help:"how often the file is checked for changes"`
}

// DefaultReload is how often a followed file is checked by default.
const DefaultReload = 2 * time.Second

// Validate checks s as the section at path (e.g. "policy"), naming each
// field with it.
func (s FileSource) Validate(path string) error {
	var errs []error
	if len(s.File) > 4096 {
		errs = append(errs, fmt.Errorf("%s.file: %d bytes is longer than 4096", path, len(s.File)))
	}
	if s.Reload < 100*time.Millisecond || s.Reload > time.Hour {
		errs = append(errs, fmt.Errorf("%s.reload: %s is outside 100ms..1h", path, s.Reload))
	}
	return errors.Join(errs...)
}
