package tally

// The one-minute quotas (tokens_per_minute, requests_per_minute) are
// sliding windows: at most the limit in any 60 seconds of event time, the
// definition the request path's admission rules use (sdk/go/admission's
// sliding window), so that a gateway refusing before the call and the
// aggregator flagging after it agree on what a minute is. A calendar
// minute would let close to twice the limit pass across its boundary.

// windowSeconds is the length of the sliding window, in seconds.
const windowSeconds = 60

// secCell is what a series counted in one second of event time.
type secCell struct {
	sec int64
	tok int64
	req int64
}

// secWindow holds a series' last minute of events by second, oldest
// first, with the sums over it. It holds one cell per second that had
// events (at most windowSeconds), so a quiet series costs little.
type secWindow struct {
	cells    []secCell
	tok, req int64
}

// add counts tok tokens and req requests (negative: taken back) at second
// sec. A second older than the window of the newest one is outside every
// window still to be evaluated and is ignored.
func (w *secWindow) add(sec, tok, req int64) {
	n := len(w.cells)
	if n > 0 && sec <= w.cells[n-1].sec-windowSeconds {
		return
	}
	i := n
	for i > 0 && w.cells[i-1].sec > sec {
		i--
	}
	if i > 0 && w.cells[i-1].sec == sec {
		w.cells[i-1].tok += tok
		w.cells[i-1].req += req
	} else {
		w.cells = append(w.cells, secCell{})
		copy(w.cells[i+1:], w.cells[i:])
		w.cells[i] = secCell{sec: sec, tok: tok, req: req}
	}
	w.tok += tok
	w.req += req
	// Seconds that left the newest second's window.
	newest := w.cells[len(w.cells)-1].sec
	drop := 0
	for drop < len(w.cells) && w.cells[drop].sec <= newest-windowSeconds {
		w.tok -= w.cells[drop].tok
		w.req -= w.cells[drop].req
		drop++
	}
	if drop > 0 {
		w.cells = append(w.cells[:0], w.cells[drop:]...)
	}
}

// used returns the window's sum in the quota's unit.
func (w *secWindow) used(requests bool) int64 {
	if requests {
		return w.req
	}
	return w.tok
}

// under returns the second from which the window is back at or under
// limit if nothing more is counted: when enough of its oldest seconds have
// left it.
func (w *secWindow) under(limit float64, requests bool) int64 {
	sum := float64(w.used(requests))
	for _, c := range w.cells {
		if sum <= limit {
			return c.sec + windowSeconds - 1
		}
		v := c.tok
		if requests {
			v = c.req
		}
		sum -= float64(v)
		if sum <= limit {
			return c.sec + windowSeconds
		}
	}
	if n := len(w.cells); n > 0 {
		return w.cells[n-1].sec + windowSeconds
	}
	return 0
}
