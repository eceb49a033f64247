package testsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// admit counts an arriving call and applies the tier's faults. It runs
// before any interceptor the caller installed: a broken tier fails before
// its own code runs.
// Calls to other services (the stats service) pass untouched.
func (t *Tier) admit(ctx context.Context, fullMethod string) (release func(), err error) {
	k, ok := kindOf(fullMethod)
	if !ok {
		return func() {}, nil
	}
	t.received[k].Add(1)
	release, err = t.faults.admit(time.Now())
	if err != nil {
		return release, err
	}
	if d := t.faults.wait(); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			release()
			return func() {}, status.FromContextError(ctx.Err()).Err()
		}
	}
	return release, nil
}

func (t *Tier) admitUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	release, err := t.admit(ctx, info.FullMethod)
	if err == nil {
		var resp any
		resp, err = h(ctx, req)
		release()
		if err == nil {
			return resp, nil
		}
	}
	t.failed.Add(1)
	return nil, err
}

func (t *Tier) admitStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	release, err := t.admit(ss.Context(), info.FullMethod)
	if err == nil {
		err = h(srv, ss)
		release()
		if err == nil {
			return nil
		}
	}
	t.failed.Add(1)
	return err
}

func (t *Tier) countAttemptUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if k, ok := kindOf(method); ok {
		t.attempts[k].Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (t *Tier) countAttemptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if k, ok := kindOf(method); ok {
		t.attempts[k].Add(1)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// downstreamErr passes a downstream failure up with its code and message.
func downstreamErr(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}

// handler serves the test service for one tier: the last tier answers,
// every other tier forwards to the next with the incoming context.
type handler struct {
	testsvcv1.UnimplementedTestServiceServer
	tier *Tier
}

func (h *handler) Unary(ctx context.Context, req *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	if next := h.tier.next; next != nil {
		resp, err := next.Unary(ctx, req)
		if err != nil {
			return nil, downstreamErr(err)
		}
		return resp, nil
	}
	if err := h.tier.faults.serve(); err != nil {
		return nil, err
	}
	return &testsvcv1.UnaryResponse{Id: req.GetId(), Payload: req.GetPayload(), ServedBy: h.tier.name}, nil
}

func (h *handler) ServerStream(req *testsvcv1.ServerStreamRequest, stream grpc.ServerStreamingServer[testsvcv1.ServerStreamResponse]) error {
	if next := h.tier.next; next != nil {
		down, err := next.ServerStream(stream.Context(), req)
		if err != nil {
			return downstreamErr(err)
		}
		return relay(down.Recv, stream.Send)
	}
	n := max(req.GetCount(), 1)
	sf := h.tier.streamFault.Load()
	fault, faulty := sf.take()
	for i := range n {
		if faulty && int(i) >= fault.AfterSend {
			if err := sf.fire(); err != nil {
				return err
			}
			faulty = false // another stream took the last failure
		}
		m := &testsvcv1.ServerStreamResponse{Id: req.GetId(), Payload: req.GetPayload(), Seq: i, ServedBy: h.tier.name}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

func (h *handler) ClientStream(stream grpc.ClientStreamingServer[testsvcv1.ClientStreamRequest, testsvcv1.ClientStreamResponse]) error {
	next := h.tier.next
	if next == nil {
		resp := &testsvcv1.ClientStreamResponse{ServedBy: h.tier.name}
		sf := h.tier.streamFault.Load()
		fault, faulty := sf.take()
		for {
			if faulty && len(resp.Ids) >= fault.AfterRecv {
				if err := sf.fire(); err != nil {
					return err
				}
				faulty = false // another stream took the last failure
			}
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return stream.SendAndClose(resp)
			}
			if err != nil {
				return err
			}
			resp.Ids = append(resp.Ids, m.GetId())
		}
	}
	down, err := next.ClientStream(stream.Context())
	if err != nil {
		return downstreamErr(err)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := down.Send(m); err != nil {
			// io.EOF: the downstream ended the stream; its status
			// comes from CloseAndRecv.
			break
		}
	}
	resp, err := down.CloseAndRecv()
	if err != nil {
		return downstreamErr(err)
	}
	return stream.SendAndClose(resp)
}

func (h *handler) Bidi(stream grpc.BidiStreamingServer[testsvcv1.BidiRequest, testsvcv1.BidiResponse]) error {
	next := h.tier.next
	if next == nil {
		var seq int32
		sf := h.tier.streamFault.Load()
		fault, faulty := sf.take()
		if faulty && fault.AfterRecv == 0 && fault.AfterSend == 0 {
			if err := sf.fire(); err != nil {
				return err
			}
			faulty = false // another stream took the last failure
		}
		for received := 1; ; received++ {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if faulty && fault.AfterRecv > 0 && received >= fault.AfterRecv {
				if err := sf.fire(); err != nil {
					return err
				}
				faulty = false // another stream took the last failure
			}
			if faulty && fault.AfterRecv == 0 && int(seq) >= fault.AfterSend {
				if err := sf.fire(); err != nil {
					return err
				}
				faulty = false // another stream took the last failure
			}
			resp := &testsvcv1.BidiResponse{Id: m.GetId(), Payload: m.GetPayload(), Seq: seq, ServedBy: h.tier.name}
			seq++
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	down, err := next.Bidi(ctx)
	if err != nil {
		return downstreamErr(err)
	}
	// Upstream -> downstream in a goroutine; it ends when the caller
	// half-closes, the downstream send fails, or the call ends (which
	// unblocks stream.Recv once this handler returns).
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				_ = down.CloseSend()
				return
			}
			if err := down.Send(m); err != nil {
				return
			}
		}
	}()
	return relay(down.Recv, stream.Send)
}

// relay passes responses from a downstream stream up until it ends, and
// returns its status.
func relay[T any](recv func() (*T, error), send func(*T) error) error {
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return downstreamErr(err)
		}
		if err := send(m); err != nil {
			return err
		}
	}
}

type statsHandler struct {
	testsvcv1.UnimplementedStatsServiceServer
	tier *Tier
}

func (s *statsHandler) GetStats(context.Context, *testsvcv1.GetStatsRequest) (*testsvcv1.GetStatsResponse, error) {
	resp := &testsvcv1.GetStatsResponse{Tier: s.tier.name, Received: map[string]int64{}, Failed: s.tier.Failed()}
	for k := range numKinds {
		resp.Received[k.String()] = s.tier.Received(k)
	}
	return resp, nil
}

// BidiRoundTrips opens a bidi stream on cl, sends req and waits for its
// answer n times, then half-closes and waits for the clean end: the unit
// of work of the stream benchmarks.
func BidiRoundTrips(ctx context.Context, cl testsvcv1.TestServiceClient, req *testsvcv1.BidiRequest, n int) error {
	s, err := cl.Bidi(ctx)
	if err != nil {
		return err
	}
	for range n {
		if err := s.Send(req); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("testsvc: stream did not end cleanly: %v", err)
	}
	return nil
}
