package budget

import "errors"

// ErrRefused is the error a caller reports when a Limiter refused a retry.
// The limiters themselves answer TryRetry with a bool; the sentinel lets
// an error chain say why it stopped (errors.Is(err, budget.ErrRefused)).
var ErrRefused = errors.New("budget: retry refused")
