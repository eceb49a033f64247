package testsvc

import (
	"context"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// MetadataSentPrefix starts the keys of the response header by which the
// stats service of a standalone tier reports the attempts it sent to the
// next tier, one key per kind: "x-testsvc-sent-unary" and so on.
// GetStatsResponse has no field for them, and a tier whose next tier is
// killed is the only one that can count them.
const MetadataSentPrefix = "x-testsvc-sent-"

// NewTier returns a tier that is not part of a Chain, for running one tier
// of the chain as a process of its own: it forwards every call to next
// (nil for the last tier, which answers), counts the calls it receives and
// applies its faults exactly as a tier of a Chain does. seed seeds its
// random fault source.
//
// The caller owns the server and the connection to the next tier: put
// AdmissionOptions first among the server's options, then its own, and
// Register the services. To count what this tier sends to the next one, make
// a stand-in for the next tier with NewTier(nextName, nil, 0), put its
// CountingDialOptions last on the connection, and pass it to Register.
//
// Kill and Restart manage the bufconn server of a Chain's tier: a standalone
// tier has none; stop its process (or its grpc.Server) instead. Its faults
// (SetDown, SetFlaky, SetLatency, SetCapacity) work as in a Chain.
func NewTier(name string, next testsvcv1.TestServiceClient, seed uint64) *Tier {
	return &Tier{name: name, next: next, faults: newFaults(seed)}
}

// AdmissionOptions returns the server options that count every arriving
// call and apply the tier's faults. They must come before any other
// interceptor of the server, as on a Chain's tiers: a broken tier fails
// before its own code runs.
func (t *Tier) AdmissionOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(t.admitUnary),
		grpc.ChainStreamInterceptor(t.admitStream),
	}
}

// CountingDialOptions returns the dial options that count, in t.Attempts,
// every attempt a client connection sends to t. Put them last, so that they
// run after any retry interceptor and see each attempt.
func (t *Tier) CountingDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(t.countAttemptUnary),
		grpc.WithChainStreamInterceptor(t.countAttemptStream),
	}
}

// Register registers the tier's test service and stats service on srv.
// sentTo, if not nil, is the stand-in for the next tier whose Attempts count
// what this tier sent to it; GetStats then reports those counts in its
// response header (see MetadataSentPrefix and SentFromHeader).
func (t *Tier) Register(srv *grpc.Server, sentTo *Tier) {
	testsvcv1.RegisterTestServiceServer(srv, &handler{tier: t})
	testsvcv1.RegisterStatsServiceServer(srv, &standaloneStats{statsHandler: statsHandler{tier: t}, sentTo: sentTo})
}

type standaloneStats struct {
	statsHandler
	sentTo *Tier
}

func (s *standaloneStats) GetStats(ctx context.Context, req *testsvcv1.GetStatsRequest) (*testsvcv1.GetStatsResponse, error) {
	if s.sentTo != nil {
		md := metadata.MD{}
		for k := range numKinds {
			md.Set(MetadataSentPrefix+k.String(), strconv.FormatInt(s.sentTo.Attempts(k), 10))
		}
		if err := grpc.SetHeader(ctx, md); err != nil {
			return nil, err
		}
	}
	return s.statsHandler.GetStats(ctx, req)
}

// SentFromHeader returns the attempts of kind k that a standalone tier
// reported sending to the next tier, from the header of its GetStats
// response (grpc.Header), and whether the header had them.
func SentFromHeader(header metadata.MD, k Kind) (int64, bool) {
	v := header.Get(MetadataSentPrefix + k.String())
	if len(v) != 1 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}
