// Package messagetest gives the channels' tests a message.Renderer: the
// built-in templates, English for tenants that set no language, links
// as each test wants them.
package messagetest

import (
	"testing"

	"github.com/sluicehq/sluice/services/alerter/message"
)

// Renderer returns a Renderer of the built-in templates with links,
// listing at most 10 alerts a message; it fails t when they do not parse.
func Renderer(t testing.TB, links message.Links) *message.Renderer {
	t.Helper()
	r, err := message.New("en", "", links, 10)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
