package busy

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// table is a markdown table.
type table struct {
	head []string
	rows [][]string
}

func newTable(head ...string) *table { return &table{head: head} }

func (t *table) row(cells ...any) {
	r := make([]string, len(cells))
	for i, c := range cells {
		r[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, r)
}

// write prints the table; the first column is left-aligned, the others
// (figures) right-aligned.
func (t *table) write(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
	sep := make([]string, len(t.head))
	for i := range sep {
		sep[i] = "---:"
		if i == 0 {
			sep[i] = "---"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

func pct(f float64) string {
	if f < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", 100*f)
}

// pct2 shows two decimals, for success near 100 %.
func pct2(f float64) string {
	if f < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f %%", 100*f)
}

func rate(f float64) string { return fmt.Sprintf("%.0f", f) }

// goodput shows the median goodput and, over several runs, its range.
func goodput(f Figures) string {
	if f.Runs < 2 {
		return rate(f.Goodput)
	}
	return fmt.Sprintf("%.0f (%.0f-%.0f)", f.Goodput, f.GoodputMin, f.GoodputMax)
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// ratioRange shows the median goodput over base and, over several runs,
// the range.
func ratioRange(f Figures, base float64) string {
	if f.Runs < 2 || base <= 0 {
		return ratio(f.Goodput, base)
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", f.Goodput/base, f.GoodputMin/base, f.GoodputMax/base)
}

func ms(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

// refusals shows a stack's refusals with their kinds (each a median on
// its own) and, when a run had more than the median, the most; "n/a"
// where they were not counted (see Figures.Counted).
func refusals(f Figures) string {
	if !f.Counted {
		return "n/a"
	}
	var kinds []string
	for _, k := range []struct {
		n    int64
		name string
	}{{f.Admission, "shed"}, {f.Throttled, "throttled"}, {f.RetryDenied, "retry denied"}} {
		if k.n > 0 {
			kinds = append(kinds, fmt.Sprintf("%d %s", k.n, k.name))
		}
	}
	return count(f.Refusals, f.RefusalsMax, kinds)
}

// downs shows a stack's "down" events as refusals shows refusals.
func downs(f Figures) string {
	if !f.Counted {
		return "n/a"
	}
	var kinds []string
	if f.TargetDown > 0 {
		kinds = append(kinds, fmt.Sprintf("%d target down", f.TargetDown))
	}
	if f.NotServing > 0 {
		kinds = append(kinds, fmt.Sprintf("%d not serving", f.NotServing))
	}
	return count(f.Downs, f.DownsMax, kinds)
}

// count shows a median count, its kinds and the most of any run.
func count(n, most int64, kinds []string) string {
	s := fmt.Sprint(n)
	if len(kinds) > 0 {
		s += " (" + strings.Join(kinds, ", ") + ")"
	}
	if most > n {
		s += fmt.Sprintf(", max %d", most)
	}
	return s
}

// deadline shows a request deadline; 0 is none.
func deadline(d time.Duration) string {
	if d == 0 {
		return "no deadline"
	}
	return fmt.Sprintf("deadline %v", d)
}
