package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// The 202 answer built by hand is byte for byte what reply encodes for the
// same counts, so clients parsing either see one format.
func TestReplyAcceptedMatchesEncodedResponse(t *testing.T) {
	zero := func() float64 { return 0 }
	s := &server{m: newMetrics(zero, zero, zero, zero)}
	for _, c := range []struct{ accepted, duplicates int }{{1, 0}, {1, 1}, {16, 3}, {16, 16}, {17, 0}, {1000, 37}, {5000, 5000}} {
		fast := httptest.NewRecorder()
		s.replyAccepted(fast, c.accepted, c.duplicates)
		slow := httptest.NewRecorder()
		s.reply(slow, http.StatusAccepted, &response{Accepted: c.accepted, Duplicates: c.duplicates})
		if fast.Code != http.StatusAccepted || !bytes.Equal(fast.Body.Bytes(), slow.Body.Bytes()) {
			t.Errorf("%+v: answer %d %q, want %d %q", c, fast.Code, fast.Body, slow.Code, slow.Body)
		}
		if cl := fast.Header().Get("Content-Length"); cl != strconv.Itoa(fast.Body.Len()) {
			t.Errorf("%+v: Content-Length %q for a body of %d bytes", c, cl, fast.Body.Len())
		}
		if ct := fast.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q, want application/json", ct)
		}
		var r response
		if err := json.Unmarshal(fast.Body.Bytes(), &r); err != nil || r.Accepted != c.accepted || r.Duplicates != c.duplicates || r.Rejected == nil {
			t.Errorf("%+v: decoded %+v, %v", c, r, err)
		}
	}
}
