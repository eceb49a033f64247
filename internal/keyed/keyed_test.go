package keyed

import (
	"strconv"
	"sync"
	"testing"
)

func TestGetCreatesOnce(t *testing.T) {
	var m Map[*int]
	m.Max = 2
	made := 0
	mk := func() *int { made++; v := made; return &v }
	a := m.Get("a", mk)
	if m.Get("a", mk) != a || made != 1 {
		t.Fatalf("Get(a) twice: made %d values, want 1", made)
	}
	if v, ok := m.Load("a"); !ok || v != a {
		t.Fatal("Load(a) does not find a")
	}
	if _, ok := m.Load("b"); ok {
		t.Fatal("Load(b) finds a value never created")
	}
}

// A full Map evicts a value that is neither pinned nor used recently.
func TestEvictsUnusedNotPinned(t *testing.T) {
	pinned := map[string]bool{"p": true}
	var m Map[string]
	m.Max = 3
	m.Pinned = func(v string) bool { return pinned[v] }
	id := func(k string) func() string { return func() string { return k } }
	m.Get("p", id("p"))
	m.Get("hot", id("hot"))
	m.Get("cold", id("cold"))
	m.Get("hot", id("hot")) // used since insertion: a second chance
	m.Get("new", id("new"))
	if _, ok := m.Load("cold"); ok {
		t.Error("cold survived; want it evicted (not pinned, not used again)")
	}
	for _, k := range []string{"p", "hot", "new"} {
		if _, ok := m.Load(k); !ok {
			t.Errorf("%s was evicted", k)
		}
	}
	if m.Len() != 3 {
		t.Fatalf("Len %d, want 3", m.Len())
	}
}

// When every value is pinned, one is evicted all the same: the Map stays
// bounded.
func TestAllPinnedStaysBounded(t *testing.T) {
	var m Map[int]
	m.Max = 4
	m.Pinned = func(int) bool { return true }
	for i := range 100 {
		m.Get(strconv.Itoa(i), func() int { return i })
		if m.Len() > 4 {
			t.Fatalf("Len %d after %d keys, want at most 4", m.Len(), i+1)
		}
	}
}

func TestConcurrentGet(t *testing.T) {
	var m Map[int]
	m.Max = 16
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				k := strconv.Itoa((i * (g + 1)) % 40)
				if v := m.Get(k, func() int { return i }); v < 0 {
					t.Error("negative value")
				}
			}
		})
	}
	wg.Wait()
	if m.Len() > 16 {
		t.Fatalf("Len %d, want at most 16", m.Len())
	}
}
