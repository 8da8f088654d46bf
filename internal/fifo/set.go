package fifo

// Set remembers the last Cap distinct keys, forgetting the oldest first:
// the bounded "have I seen this id?" memory of the enforcer and the alerter,
// which both skip a replayed signal by its deterministic id. It is not safe
// for concurrent use.
type Set[K comparable] struct {
	keys map[K]struct{}
	ring *Ring[K]
}

// NewSet returns a set that remembers at most capacity keys; a capacity
// below 1 remembers nothing, so Seen is always false.
func NewSet[K comparable](capacity int) *Set[K] {
	if capacity < 1 {
		return &Set[K]{}
	}
	return &Set[K]{keys: make(map[K]struct{}), ring: New[K](capacity)}
}

// Seen remembers k and reports whether it was remembered already.
func (s *Set[K]) Seen(k K) bool {
	if s.ring == nil {
		return false
	}
	if _, ok := s.keys[k]; ok {
		return true
	}
	if old, evicted := s.ring.Push(k); evicted {
		delete(s.keys, old)
	}
	s.keys[k] = struct{}{}
	return false
}

// Len returns how many keys the set remembers.
func (s *Set[K]) Len() int { return len(s.keys) }
