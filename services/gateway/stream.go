package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// relayStream passes an SSE answer on event by event, each flushed as
// soon as its closing blank line arrives (an event is held only until it
// is whole, never across events), reads the usage it reports, removes the
// usage chunk the gateway asked for (call.stripUsage), and counts the
// generated text in case no usage comes. It reports what the stream used:
// the provider's usage, or the prompt's count plus the text counted so
// far when the stream ended without one — cut by the client, the
// provider, a timeout or shutdown.
func (s *Server) relayStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, fam estimate.Family, prompt int64) {
	rc := http.NewResponseController(w)
	_ = rc.Flush() // the headers now: clients start their timers on them
	st := &streamState{w: w, rc: rc, strip: c.stripUsage(), fam: fam, max: s.cfg.MaxStreamEventBytes, dialect: c.dialect}
	s.endStream(r, c, st, st.run(resp.Body), prompt)
}

// endStream ends c's stream, relayed by st until readErr (nil at its
// normal end): how it ended, and what it used.
func (s *Server) endStream(r *http.Request, c *call, st *streamState, readErr error, prompt int64) {
	switch {
	case (readErr != nil || st.clientGone) && s.hardStop.Err() != nil:
		// Cut by the end of the shutdown drain (which also closes the
		// client's connection): not the provider's failure.
		c.mc.SetAttribute("cancelled", codeShutdown)
		c.end("", codeShutdown)
	case st.clientGone || r.Context().Err() != nil:
		c.mc.SetAttribute("cancelled", "client")
		c.end("", codeClientClosed)
	case readErr != nil:
		c.mc.SetAttribute("stream", "cut")
		if isTimeout(readErr) {
			c.end(schemas.OutcomeTimeout, "upstream_timeout")
		} else {
			c.end(schemas.OutcomeError, codeStreamCut)
		}
	}
	switch {
	case st.reported != nil && st.final:
		c.usage, c.source = *st.reported, usageReported
	case st.reported != nil:
		// The provider reported the prompt (Anthropic's message_start) or
		// the usage so far (Gemini's every event) but the stream ended
		// before the output's final count: the output is the larger of the
		// provider's last count and the text relayed, counted.
		c.usage, c.source = *st.reported, usageCounted
		c.usage.CompletionTokens, c.usage.Counted = max(c.usage.CompletionTokens, st.counted), true
	default:
		c.usage, c.source = middleware.Usage{PromptTokens: prompt, CompletionTokens: st.counted, Counted: true}, usageCounted
	}
	c.mc.Report(c.usage)
	c.end(schemas.OutcomeOK, "")
}

// streamState is one stream being relayed.
type streamState struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	strip   bool
	fam     estimate.Family
	max     int
	dialect string // whose events: OpenAI's, Anthropic's (anthropicEvent), Gemini's (geminiEvent)

	event       []byte            // the current event, held until its blank line
	passthrough bool              // the current event outgrew max: relayed as it comes
	reported    *middleware.Usage // what the provider reported so far
	final       bool              // reported is the call's whole usage
	counted     int64
	clientGone  bool
}

// readBuf is what one read of the upstream body may return; longer lines
// arrive in pieces and are joined in the event buffer.
const readBuf = 32 << 10

// run relays body until it ends, the client goes away or a read fails;
// it returns the read error (nil at the stream's normal end).
func (st *streamState) run(body io.Reader) error {
	br := bufio.NewReaderSize(body, readBuf)
	whole := true // the next piece starts a line
	for {
		piece, err := br.ReadSlice('\n')
		if len(piece) > 0 {
			blank := whole && (len(piece) == 1 || (len(piece) == 2 && piece[0] == '\r')) && piece[len(piece)-1] == '\n'
			switch {
			case st.passthrough:
				if !st.write(piece, blank) {
					return nil
				}
				if blank {
					st.passthrough = false
				}
			default:
				st.event = append(st.event, piece...)
				if blank {
					if !st.endEvent() {
						return nil
					}
				} else if len(st.event) > st.max {
					// Too large to hold: passed on unread; its usage, if
					// it carried any, is lost and the text not counted.
					st.passthrough = true
					ok := st.write(st.event, false)
					st.event = st.event[:0]
					if !ok {
						return nil
					}
				}
			}
			whole = piece[len(piece)-1] == '\n'
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if len(st.event) > 0 && !st.passthrough {
				st.endEvent() // a last event without its blank line
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// endEvent examines the whole event held and relays it (or drops the
// usage chunk the client did not ask for); false when the client is gone.
func (st *streamState) endEvent() bool {
	ev := st.event
	st.event = st.event[:0]
	drop := false
	data := eventData(ev)
	switch {
	case len(data) == 0 || data[0] != '{':
	case st.dialect == policy.DialectAnthropic:
		st.anthropicEvent(data)
	case st.dialect == policy.DialectGemini:
		st.geminiEvent(data)
	default:
		var d doc
		if json.Unmarshal(data, &d) == nil {
			if u := d.reported(); u != nil {
				usage := u.Usage()
				st.reported, st.final = &usage, true
				// The chunk the gateway asked for carries usage and no
				// choices; a provider that puts usage on a chunk with
				// content keeps it there, and the client gets it all.
				drop = st.strip && d.Type == "" && d.Response == nil && len(d.Choices) == 0
			}
			st.counted += d.count(st.fam)
		}
	}
	if drop {
		return true
	}
	return st.write(ev, true)
}

// write sends b to the client, flushing at an event's end.
func (st *streamState) write(b []byte, flush bool) bool {
	if _, err := st.w.Write(b); err != nil {
		st.clientGone = true
		return false
	}
	if flush {
		if err := st.rc.Flush(); err != nil {
			st.clientGone = true
			return false
		}
	}
	return true
}

// eventData returns an SSE event's data: its data lines' values joined by
// newlines (one line in OpenAI's streams, so usually a sub-slice of ev).
func eventData(ev []byte) []byte {
	var out []byte
	n := 0
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimRight(line, "\r")
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		if n == 0 {
			out = v
		} else {
			joined := make([]byte, 0, len(out)+1+len(v))
			joined = append(append(append(joined, out...), '\n'), v...)
			out = joined
		}
		n++
	}
	return out
}
