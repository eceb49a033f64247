package stormotel_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The chain tests start gRPC servers and clients.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
