package capped

import (
	"fmt"
	"sync"
	"testing"
)

// Add makes a value once per key, up to max keys; past them it returns
// other, without making one; Load sees what Add made.
func TestMapCapped(t *testing.T) {
	var m Map[string, int]
	made := 0
	newV := func() int { made++; return made }
	if v := m.Add("a", 2, -1, newV); v != 1 {
		t.Fatalf("a: %d, want 1", v)
	}
	if v := m.Add("a", 2, -1, newV); v != 1 || made != 1 {
		t.Fatalf("a again: %d (made %d), want 1 made once", v, made)
	}
	if v := m.Add("b", 2, -1, newV); v != 2 {
		t.Fatalf("b: %d, want 2", v)
	}
	for _, k := range []string{"c", "d"} {
		if v := m.Add(k, 2, -1, newV); v != -1 || made != 2 {
			t.Fatalf("%s past the cap: %d (made %d), want -1 and nothing made", k, v, made)
		}
	}
	if v, ok := m.Load("b"); !ok || v != 2 || m.Len() != 2 {
		t.Fatalf("Load(b) %d %v, Len %d; want 2 true 2", v, ok, m.Len())
	}
	if v := m.Add("a", 2, -1, newV); v != 1 {
		t.Fatalf("a, full: %d, want 1", v)
	}
	if _, ok := m.Load("c"); ok {
		t.Fatal("a key past the cap has a value")
	}
}

// Concurrent Adds of the same keys agree on one value per key (run with
// -race).
func TestMapConcurrent(t *testing.T) {
	var m Map[string, *int]
	var wg sync.WaitGroup
	got := make([][]*int, 4)
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				got[g] = append(got[g], m.Add(fmt.Sprint(i), 40, nil, func() *int { return new(int) }))
			}
		}()
	}
	wg.Wait()
	for i := range 50 {
		for g := 1; g < len(got); g++ {
			if got[g][i] != got[0][i] {
				t.Fatalf("key %d: two values", i)
			}
		}
		if (i < 40) != (got[0][i] != nil) {
			t.Fatalf("key %d: value %v, want one for the first 40 only", i, got[0][i])
		}
	}
}

// An Add whose first Load missed its key, while another Add made the
// key's value and so filled the map, gets that value, not other (CI
// found this interleaving once in TestMapConcurrent).
func TestMapFilledAfterMiss(t *testing.T) {
	var m Map[string, *int]
	v := m.Add("k", 1, nil, func() *int { return new(int) })
	if got := m.missed("k", 1, nil, func() *int { return new(int) }); got != v {
		t.Fatalf("missed after the map filled: %v, want %v", got, v)
	}
	if got := m.missed("other", 1, nil, func() *int { return new(int) }); got != nil {
		t.Fatalf("a new key past the cap: %v, want nil", got)
	}
}
