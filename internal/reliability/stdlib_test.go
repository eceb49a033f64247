package reliability

import (
	"go/build"
	"strings"
	"testing"
)

// The mechanism packages use the standard library only (and the
// module's internal packages, which must too): they stay usable without
// gRPC, and a user who imports one gets no dependency with it.
func TestMechanismsUseTheStandardLibraryOnly(t *testing.T) {
	const module = "github.com/stormguard/stormguard/"
	for _, pkg := range []string{"budget", "breaker", "adaptive", "admission", "hedge"} {
		seen := map[string]bool{}
		var walk func(path string)
		walk = func(path string) {
			if seen[path] || path == "C" {
				return
			}
			seen[path] = true
			p, err := build.Default.Import(path, "", 0)
			if err != nil {
				t.Fatalf("%s: import %s: %v", pkg, path, err)
			}
			if !p.Goroot && !strings.HasPrefix(path, module+pkg) && !strings.HasPrefix(path, module+"internal/") {
				t.Errorf("%s depends on %s, which is not in the standard library", pkg, path)
				return
			}
			for _, imp := range p.Imports {
				walk(imp)
			}
		}
		walk(module + pkg)
	}
}
