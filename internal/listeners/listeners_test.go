package listeners

import (
	"slices"
	"testing"
)

// TestList: functions run in the order added; a second Add under the same
// comparable key replaces the first; nil and non-comparable keys always
// add; an empty List calls nothing.
func TestList(t *testing.T) {
	var l List[func() string]
	var got []string
	each := func() {
		got = got[:0]
		l.Each(func(f func() string) { got = append(got, f()) })
	}
	each()
	if len(got) != 0 {
		t.Fatalf("empty list called %q", got)
	}
	type key struct{ name string }
	k := &key{"k"}
	l.Add(k, func() string { return "first k" })
	l.Add(nil, func() string { return "nil 1" })
	l.Add(k, func() string { return "second k" }) // replaces "first k", in its place
	l.Add(&key{"k"}, func() string { return "other pointer" })
	l.Add(nil, func() string { return "nil 2" })
	l.Add([]int{1}, func() string { return "slice 1" }) // not comparable: never matches
	l.Add([]int{1}, func() string { return "slice 2" })
	each()
	want := []string{"second k", "nil 1", "other pointer", "nil 2", "slice 1", "slice 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
