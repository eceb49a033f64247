// Package reliability holds the load, chaos and adversarial tests of the
// full stormguard stack on the internal/testsvc chain. It has no code of
// its own: see the tests. The short form runs in `make test`; the long
// form with -reliability.long or STORMGUARD_RELIABILITY_LONG=1.
package reliability
