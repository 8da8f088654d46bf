// Package channeltest holds what the channel kinds' tests share around
// their stand-in receivers (a robot, a bot, a webhook endpoint): serving
// one for the length of a test with a sender pointed at it, and failing
// its first requests so that the retry path is taken.
package channeltest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Start serves h for the length of the test and returns the sender that
// newSender builds for url, the server's URL followed by path, with the
// server's client. An error from newSender fails t: the tests that call
// Start expect their settings to be accepted.
func Start[S any](t testing.TB, h http.Handler, path string, newSender func(url string, c *http.Client) (S, error)) S {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := newSender(srv.URL+path, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Outage is how many more requests a stand-in receiver answers with an
// HTTP error before it works again, as a receiver that is briefly down
// does. It is not safe for concurrent use: a stand-in calls Answer under
// its own lock.
type Outage int

// Answer answers the request with status and reports true while the
// outage lasts, counting the request; once it is over it reports false and
// writes nothing.
func (o *Outage) Answer(w http.ResponseWriter, status int) bool {
	if *o <= 0 {
		return false
	}
	*o--
	http.Error(w, http.StatusText(status), status)
	return true
}
