package engine

// recentIDs remembers the last n signal IDs, oldest forgotten first, so
// that a replayed signal is recognised without the set growing forever.
type recentIDs struct {
	set   map[string]struct{}
	order []string // a ring of the IDs in set, next overwrites the oldest
	next  int
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{set: make(map[string]struct{}, n), order: make([]string, n)}
}

// seen remembers id and reports whether it was already remembered. With a
// capacity of 0, or an empty id, nothing is remembered.
func (r *recentIDs) seen(id string) bool {
	if len(r.order) == 0 || id == "" {
		return false
	}
	if _, ok := r.set[id]; ok {
		return true
	}
	if old := r.order[r.next]; old != "" {
		delete(r.set, old)
	}
	r.order[r.next] = id
	r.next = (r.next + 1) % len(r.order)
	r.set[id] = struct{}{}
	return false
}
