package interceptor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// streamLog records, per stream that reached a tier's handler, the ids of
// the requests the handler read and the Info in its context.
type streamLog struct {
	mu      sync.Mutex
	streams [][]string
	infos   []Info
}

func (l *streamLog) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	in, _ := FromContext(ss.Context())
	l.mu.Lock()
	n := len(l.streams)
	l.streams = append(l.streams, nil)
	l.infos = append(l.infos, in)
	l.mu.Unlock()
	return h(srv, &recordingStream{ServerStream: ss, log: l, n: n})
}

func (l *streamLog) get() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.streams)
}

type recordingStream struct {
	grpc.ServerStream
	log *streamLog
	n   int
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		if r, ok := m.(interface{ GetId() string }); ok {
			s.log.mu.Lock()
			s.log.streams[s.n] = append(s.log.streams[s.n], r.GetId())
			s.log.mu.Unlock()
		}
	}
	return err
}

// streamChain is stormguard on every hop, with a log of what each tier's
// stream handlers read.
func streamChain(t *testing.T, opts ...Option) (*testsvc.Chain, []*streamLog) {
	t.Helper()
	logs := []*streamLog{{}, {}, {}}
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(int) []grpc.DialOption {
			return mustNew(t, append([]Option{noWait}, opts...)...).DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption {
			i := mustNew(t)
			return []grpc.ServerOption{
				grpc.ChainUnaryInterceptor(i.UnaryServer()),
				grpc.ChainStreamInterceptor(i.StreamServer(), logs[tier].interceptor),
			}
		},
	})
	return c, logs
}

func ids(n int) []string {
	var s []string
	for i := range n {
		s = append(s, strconv.Itoa(i))
	}
	return s
}

func TestStreamRetryBeforeFirstResponse(t *testing.T) {
	t.Run("server stream", func(t *testing.T) {
		c, logs := streamChain(t)
		pay := c.Tier("payment")
		pay.SetStreamFault(testsvc.StreamFault{AfterSend: 0, Streams: 1})
		ss, err := c.Client().ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Id: "r", Count: 3})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int32
		for {
			m, err := ss.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			seqs = append(seqs, m.GetSeq())
		}
		if fmt.Sprint(seqs) != "[0 1 2]" {
			t.Fatalf("received seqs %v, want [0 1 2] once each", seqs)
		}
		if got := fmt.Sprint(logs[2].get()); got != "[[r] [r]]" {
			t.Fatalf("payment read %s, want the request once per attempt: [[r] [r]]", got)
		}
		if got, want := []int64{c.Tier("gateway").Received(testsvc.ServerStream), c.Tier("order").Received(testsvc.ServerStream)}, []int64{1, 1}; !slices.Equal(got, want) {
			t.Fatalf("gateway and order streams: got %v, want %v (only order retries)", got, want)
		}
	})

	t.Run("client stream", func(t *testing.T) {
		c, logs := streamChain(t)
		c.Tier("payment").SetStreamFault(testsvc.StreamFault{AfterRecv: 2, Streams: 1})
		cs, err := c.Client().ClientStream(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids(4) {
			if err := cs.Send(&testsvcv1.ClientStreamRequest{Id: id}); err != nil {
				t.Fatalf("Send %s: %v", id, err)
			}
		}
		resp, err := cs.CloseAndRecv()
		if err != nil {
			t.Fatalf("CloseAndRecv: %v", err)
		}
		if got := fmt.Sprint(resp.GetIds()); got != "[0 1 2 3]" {
			t.Fatalf("payment answered %s, want [0 1 2 3]", got)
		}
		got := logs[2].get()
		if len(got) != 2 || fmt.Sprint(got[0]) != "[0 1]" || fmt.Sprint(got[1]) != "[0 1 2 3]" {
			t.Fatalf("payment read %v, want [[0 1] [0 1 2 3]]: the failed attempt's reads, then all in order", got)
		}
	})

	t.Run("bidi", func(t *testing.T) {
		c, logs := streamChain(t)
		c.Tier("payment").SetStreamFault(testsvc.StreamFault{AfterRecv: 1, Streams: 1})
		bs, err := c.Client().Bidi(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids(3) {
			if err := bs.Send(&testsvcv1.BidiRequest{Id: id}); err != nil {
				t.Fatalf("Send %s: %v", id, err)
			}
			m, err := bs.Recv()
			if err != nil {
				t.Fatalf("Recv after %s: %v", id, err)
			}
			if m.GetId() != id {
				t.Fatalf("got the answer to %s, want %s", m.GetId(), id)
			}
		}
		if err := bs.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := bs.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("end: got %v, want io.EOF", err)
		}
		if got := fmt.Sprint(logs[2].get()); got != "[[0] [0 1 2]]" {
			t.Fatalf("payment read %s, want [[0] [0 1 2]]", got)
		}
	})
}

func TestStreamNoRetryAfterCommit(t *testing.T) {
	t.Run("server stream", func(t *testing.T) {
		c, _ := streamChain(t)
		pay := c.Tier("payment")
		pay.SetStreamFault(testsvc.StreamFault{AfterSend: 2})
		ss, err := c.Client().ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Id: "r", Count: 5})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int32
		for {
			m, err := ss.Recv()
			if err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("end: got %v, want Unavailable", err)
				}
				break
			}
			seqs = append(seqs, m.GetSeq())
		}
		if fmt.Sprint(seqs) != "[0 1]" {
			t.Fatalf("received %v, want [0 1] and no duplicates", seqs)
		}
		if got := pay.Received(testsvc.ServerStream); got != 1 {
			t.Fatalf("payment streams: got %d, want 1 (no retry after the commit)", got)
		}
	})

	t.Run("bidi", func(t *testing.T) {
		c, _ := streamChain(t)
		pay := c.Tier("payment")
		pay.SetStreamFault(testsvc.StreamFault{AfterSend: 1})
		bs, err := c.Client().Bidi(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, id := range ids(3) {
			if err := bs.Send(&testsvcv1.BidiRequest{Id: id}); err != nil {
				break
			}
			m, err := bs.Recv()
			if err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("got %v, want Unavailable", err)
				}
				break
			}
			got = append(got, m.GetId())
		}
		if fmt.Sprint(got) != "[0]" {
			t.Fatalf("received %v, want [0]", got)
		}
		if n := pay.Received(testsvc.Bidi); n != 1 {
			t.Fatalf("payment streams: got %d, want 1", n)
		}
	})
}

func TestStreamBufferLimitCommits(t *testing.T) {
	// Each request is about 10 bytes; 25 bytes hold two.
	c, logs := streamChain(t, WithReplayBufferSize(25))
	pay := c.Tier("payment")
	pay.SetStreamFault(testsvc.StreamFault{AfterRecv: 3, Streams: 1})
	cs, err := c.Client().ClientStream(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids(4) {
		if err := cs.Send(&testsvcv1.ClientStreamRequest{Id: id, Payload: []byte("12345678")}); err != nil {
			break // the committed stream may report the end early
		}
	}
	_, err = cs.CloseAndRecv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want the failure: the stream outgrew its buffer and committed", err)
	}
	if n := len(logs[2].get()); n != 1 {
		t.Fatalf("payment streams: got %d, want 1 (no replay once the buffer is exceeded)", n)
	}
}

func TestStreamPaymentDown(t *testing.T) {
	kinds := []struct {
		kind testsvc.Kind
		call func(ctx context.Context, cl testsvcv1.TestServiceClient) error
	}{
		{testsvc.ServerStream, func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
			ss, err := cl.ServerStream(ctx, &testsvcv1.ServerStreamRequest{Count: 2})
			if err != nil {
				return err
			}
			_, err = ss.Recv()
			return err
		}},
		{testsvc.ClientStream, func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
			cs, err := cl.ClientStream(ctx)
			if err != nil {
				return err
			}
			_ = cs.Send(&testsvcv1.ClientStreamRequest{Id: "a"})
			_, err = cs.CloseAndRecv()
			return err
		}},
		{testsvc.Bidi, func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
			bs, err := cl.Bidi(ctx)
			if err != nil {
				return err
			}
			_ = bs.Send(&testsvcv1.BidiRequest{Id: "a"})
			_, err = bs.Recv()
			return err
		}},
	}
	for _, k := range kinds {
		t.Run(k.kind.String(), func(t *testing.T) {
			c, _ := streamChain(t)
			c.Tier("payment").SetDown(codes.Unavailable)
			err := k.call(ctxTimeout(t, 10*time.Second), c.Client())
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("user got %v, want Unavailable", err)
			}
			var got []int64
			for _, tier := range c.Tiers() {
				got = append(got, tier.Received(k.kind))
			}
			if want := []int64{1, 1, 3}; !slices.Equal(got, want) {
				t.Fatalf("streams received (gateway, order, payment): got %v, want %v", got, want)
			}
		})
	}
}

// TestStreamMetadataAcrossTiers: a server stream carries the attempt
// metadata through all three tiers, and a retry is visible to payment.
func TestStreamMetadataAcrossTiers(t *testing.T) {
	c, logs := streamChain(t)
	c.Tier("payment").SetStreamFault(testsvc.StreamFault{AfterSend: 0, Streams: 1})
	ss, err := c.Client().ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := ss.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	var got [][]Info
	for _, l := range logs {
		l.mu.Lock()
		got = append(got, slices.Clone(l.infos))
		l.mu.Unlock()
	}
	want := [][]Info{
		{{Depth: 0}},
		{{Depth: 1}},
		{{Depth: 2}, {Depth: 2, Attempt: 1, UpstreamRetries: 1}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Info per tier: got %v, want %v", got, want)
	}
}
