package fifo

import (
	"fmt"
	"testing"
)

// TestRingKeepsTheNewestInOrder pushes past the capacity, through growth
// and wrap-around, with pops in between, against a slice model.
func TestRingKeepsTheNewestInOrder(t *testing.T) {
	for _, capacity := range []int{1, 3, 64, 65, 200} {
		r := New[int](capacity)
		var model []int
		for i := 0; i < 1000; i++ {
			old, evicted := r.Push(i)
			model = append(model, i)
			if len(model) > capacity {
				if !evicted || old != model[0] {
					t.Fatalf("cap %d push %d: evicted %v %d, want %d", capacity, i, evicted, old, model[0])
				}
				model = model[1:]
			} else if evicted {
				t.Fatalf("cap %d push %d: evicted %d from a ring not full", capacity, i, old)
			}
			if i%7 == 0 {
				v, ok := r.Pop()
				if !ok || v != model[0] {
					t.Fatalf("cap %d pop after %d: %d %v, want %d", capacity, i, v, ok, model[0])
				}
				model = model[1:]
			}
			if r.Len() != len(model) {
				t.Fatalf("cap %d after %d: Len %d, want %d", capacity, i, r.Len(), len(model))
			}
			if f, ok := r.Front(); len(model) > 0 && (!ok || f != model[0]) {
				t.Fatalf("cap %d after %d: Front %d %v, want %d", capacity, i, f, ok, model[0])
			}
		}
		if len(r.buf) > capacity {
			t.Fatalf("cap %d: buffer grew to %d", capacity, len(r.buf))
		}
	}
}

func TestEmptyRing(t *testing.T) {
	r := New[string](0)
	if r.Cap() != 1 {
		t.Fatalf("Cap = %d, want the minimum of 1", r.Cap())
	}
	if _, ok := r.Front(); ok {
		t.Fatal("Front of an empty ring")
	}
	if _, ok := r.Pop(); ok {
		t.Fatal("Pop of an empty ring")
	}
}

func TestRingAllOldestFirst(t *testing.T) {
	r := New[int](3)
	for i := range 5 {
		r.Push(i)
	}
	var got []int
	for v := range r.All() {
		got = append(got, v)
	}
	if fmt.Sprint(got) != "[2 3 4]" {
		t.Fatalf("All = %v, want [2 3 4]", got)
	}
}
