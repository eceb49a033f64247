package bench

import (
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// SlowQueue is the admission queue of the slow scenario's queue stack: a
// fixed cap of 8 requests in flight (twice payment's workers), and 16
// waiters beyond it, at most 20 ms each, 5 ms once backed up.
var SlowQueue = admission.Config{MaxInFlight: 8, QueueSize: 16, QueueTimeout: 20 * time.Millisecond, QueueTarget: 5 * time.Millisecond}

// slowQueueDesc describes SlowQueue.
func slowQueueDesc() string {
	return fmt.Sprintf("stormguard+admission, with a fixed cap and the optional queue on every tier's server: MaxInFlight %d, QueueSize %d, QueueTimeout %v, QueueTarget %v (CoDel timeouts, LIFO when backed up)",
		SlowQueue.MaxInFlight, SlowQueue.QueueSize, SlowQueue.QueueTimeout, SlowQueue.QueueTarget)
}

// slowStormguard builds the budget-and-breaker stormguard stack of the
// slow scenario with admission cfg on every tier's server.
func slowStormguard(p SlowParams, cfg admission.Config) func(*env) (testsvc.Config, error) {
	return func(e *env) (testsvc.Config, error) {
		if _, err := interceptor.New(interceptor.WithAdmission(cfg)); err != nil {
			return testsvc.Config{}, err
		}
		return testsvc.Config{
			DialOptions: func(hop int) []grpc.DialOption {
				set, _ := breaker.NewSet(breaker.Config{OnStateChange: func(_ string, _, to breaker.State) {
					if to == breaker.Open {
						e.opens.add(hop)
					}
				}}, 0)
				return interceptor.DialOptions(interceptor.WithBudget(budget.Config{}), interceptor.WithBreaker(set),
					interceptor.WithPerAttemptTimeout(p.PerAttempt[min(hop, 2)]))
			},
			ServerOptions: func(int) []grpc.ServerOption {
				// A fresh limiter per tier: WithAdmission builds it.
				return interceptor.ServerOptions(interceptor.WithAdmission(cfg))
			},
		}, nil
	}
}

// slowRecommended builds interceptor.Recommended() on every hop and
// server of the slow scenario, with its per-attempt timeouts.
func slowRecommended(p SlowParams) func(*env) (testsvc.Config, error) {
	return func(*env) (testsvc.Config, error) {
		return testsvc.Config{
			DialOptions: func(hop int) []grpc.DialOption {
				return interceptor.DialOptions(append(interceptor.Recommended(),
					interceptor.WithPerAttemptTimeout(p.PerAttempt[min(hop, 2)]))...)
			},
			ServerOptions: func(int) []grpc.ServerOption {
				return interceptor.ServerOptions(interceptor.Recommended()...)
			},
		}, nil
	}
}
