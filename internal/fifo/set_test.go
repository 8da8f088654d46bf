package fifo

import "testing"

func TestSetForgetsTheOldestFirst(t *testing.T) {
	s := NewSet[string](2)
	for _, id := range []string{"a", "b"} {
		if s.Seen(id) {
			t.Fatalf("%s seen before it was added", id)
		}
	}
	if !s.Seen("a") {
		t.Fatal("a forgotten while the set had room")
	}
	s.Seen("c") // evicts a, the oldest
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want the capacity 2", s.Len())
	}
	if s.Seen("a") {
		t.Fatal("a still remembered after two newer keys filled the set")
	}
	off := NewSet[string](0)
	first, second := off.Seen("x"), off.Seen("x")
	if first || second {
		t.Fatal("a zero-capacity set remembered a key")
	}
}
