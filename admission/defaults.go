package admission

import "fmt"

// orDefault sets *v to d when *v is the zero value: a Config field left
// unset.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// invalidf returns an error that wraps ErrInvalidConfig and says which
// field is wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}
