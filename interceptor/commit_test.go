package interceptor

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Tests of gRFC A6's commit rule and of the stream's Header, Trailer and
// Context against a real gRPC server over bufconn: what gRPC tells a
// client about response headers is the point, so no fake stands in.

// stubService is a TestService whose handlers are func fields; calls
// counts the handler runs of every kind together.
type stubService struct {
	testsvcv1.UnimplementedTestServiceServer
	calls atomic.Int32

	unary  func(n int, ctx context.Context) error
	stream func(n int, ss grpc.ServerStream) error
}

func (s *stubService) Unary(ctx context.Context, req *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	n := int(s.calls.Add(1))
	if err := s.unary(n, ctx); err != nil {
		return nil, err
	}
	return &testsvcv1.UnaryResponse{Id: req.GetId()}, nil
}

func (s *stubService) ServerStream(_ *testsvcv1.ServerStreamRequest, ss grpc.ServerStreamingServer[testsvcv1.ServerStreamResponse]) error {
	return s.stream(int(s.calls.Add(1)), ss)
}

func (s *stubService) ClientStream(ss grpc.ClientStreamingServer[testsvcv1.ClientStreamRequest, testsvcv1.ClientStreamResponse]) error {
	return s.stream(int(s.calls.Add(1)), ss)
}

func (s *stubService) Bidi(ss grpc.BidiStreamingServer[testsvcv1.BidiRequest, testsvcv1.BidiResponse]) error {
	return s.stream(int(s.calls.Add(1)), ss)
}

// startStub serves svc over bufconn and returns a client through
// stormguard's interceptors with opts.
func startStub(t *testing.T, svc *stubService, opts ...Option) testsvcv1.TestServiceClient {
	t.Helper()
	srv := grpc.NewServer()
	testsvcv1.RegisterTestServiceServer(srv, svc)
	lis := serveBufconn(t, srv)
	cc := dialBufconn(t, lis, "stub", mustNew(t, append([]Option{noWait}, opts...)...).DialOptions()...)
	return testsvcv1.NewTestServiceClient(cc)
}

var errStubDown = status.Error(codes.Unavailable, "stub down")

// kindCalls runs one call of each kind to its end and returns its error.
var kindCalls = []struct {
	name string
	call func(ctx context.Context, cl testsvcv1.TestServiceClient) error
}{
	{"unary", func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
		_, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "a"})
		return err
	}},
	{"server stream", func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
		ss, err := cl.ServerStream(ctx, &testsvcv1.ServerStreamRequest{Id: "a", Count: 1})
		if err != nil {
			return err
		}
		for {
			if _, err := ss.Recv(); err != nil {
				return err
			}
		}
	}},
	{"client stream", func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
		cs, err := cl.ClientStream(ctx)
		if err != nil {
			return err
		}
		_ = cs.Send(&testsvcv1.ClientStreamRequest{Id: "a"})
		_, err = cs.CloseAndRecv()
		return err
	}},
	{"bidi", func(ctx context.Context, cl testsvcv1.TestServiceClient) error {
		bs, err := cl.Bidi(ctx)
		if err != nil {
			return err
		}
		_ = bs.Send(&testsvcv1.BidiRequest{Id: "a"})
		_ = bs.CloseSend()
		for {
			if _, err := bs.Recv(); err != nil {
				return err
			}
		}
	}},
}

// TestCommitOnResponseHeaders: a server that sent its response headers
// and then failed with UNAVAILABLE ran its handler once, as under
// grpc-go's own retry (it ran 3 times: headers never committed a unary
// call, and a stream only on a message or an application's Header call);
// the same failure as a trailers-only response (no headers sent) is still
// retried.
func TestCommitOnResponseHeaders(t *testing.T) {
	for _, k := range kindCalls {
		t.Run(k.name+"/headers sent", func(t *testing.T) {
			svc := &stubService{
				unary: func(_ int, ctx context.Context) error {
					if err := grpc.SendHeader(ctx, metadata.Pairs("x-stub", "1")); err != nil {
						t.Errorf("SendHeader: %v", err)
					}
					return errStubDown
				},
				stream: func(_ int, ss grpc.ServerStream) error {
					if err := ss.SendHeader(metadata.Pairs("x-stub", "1")); err != nil {
						t.Errorf("SendHeader: %v", err)
					}
					return errStubDown
				},
			}
			err := k.call(ctxTimeout(t, 10*time.Second), startStub(t, svc))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v, want Unavailable", err)
			}
			if n := svc.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1: response headers commit the call", n)
			}
			var se *Error
			if errors.As(err, &se) && se.Reason != StopCommitted {
				t.Fatalf("stop reason %v, want %v", se.Reason, StopCommitted)
			}
		})
		t.Run(k.name+"/trailers only", func(t *testing.T) {
			fail := func(int, context.Context) error { return errStubDown }
			svc := &stubService{unary: fail, stream: func(int, grpc.ServerStream) error { return errStubDown }}
			err := k.call(ctxTimeout(t, 10*time.Second), startStub(t, svc))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v, want Unavailable", err)
			}
			if n := svc.calls.Load(); n != DefaultMaxAttempts {
				t.Fatalf("handler ran %d times, want %d: a trailers-only failure is retried", n, DefaultMaxAttempts)
			}
		})
	}
}

// attemptStream is a server-stream handler that fails its first run
// trailers-only and then answers with headers, one message and a
// trailer, each carrying the run's number.
func attemptStream(n int, ss grpc.ServerStream) error {
	if n == 1 {
		return errStubDown
	}
	md := metadata.Pairs("x-attempt", strconv.Itoa(n))
	ss.SetTrailer(md)
	if err := ss.SendHeader(md); err != nil {
		return err
	}
	return ss.SendMsg(&testsvcv1.ServerStreamResponse{Seq: int32(n)})
}

// TestStreamHeaderFollowsRetry: Header called before RecvMsg returned the
// failed first attempt's missing header while RecvMsg then delivered the
// second attempt's message; Header, the message and Trailer must all come
// from the attempt that answered. Also with RecvMsg running concurrently
// with Header.
func TestStreamHeaderFollowsRetry(t *testing.T) {
	for _, concurrent := range []bool{false, true} {
		t.Run("concurrent="+strconv.FormatBool(concurrent), func(t *testing.T) {
			svc := &stubService{stream: attemptStream}
			ss, err := startStub(t, svc).ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Id: "a", Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var seqs []int32
			var end error
			recv := func() {
				defer wg.Done()
				for {
					m, err := ss.Recv()
					if err != nil {
						end = err
						return
					}
					seqs = append(seqs, m.GetSeq())
				}
			}
			wg.Add(1)
			if concurrent {
				go recv()
			}
			md, err := ss.Header()
			if err != nil {
				t.Fatalf("Header: %v", err)
			}
			if !concurrent {
				recv()
			}
			wg.Wait()
			if got := md.Get("x-attempt"); len(got) != 1 || got[0] != "2" {
				t.Fatalf("Header: x-attempt %v, want [2], the attempt that answered", got)
			}
			if !errors.Is(end, io.EOF) || len(seqs) != 1 || seqs[0] != 2 {
				t.Fatalf("received %v then %v, want [2] then EOF", seqs, end)
			}
			if got := ss.Trailer().Get("x-attempt"); len(got) != 1 || got[0] != "2" {
				t.Fatalf("Trailer: x-attempt %v, want [2]", got)
			}
			if n := svc.calls.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}

// TestStreamContextCommits: Context returned the first attempt's context,
// which the transparent retry then cancelled while the stream went on
// delivering messages. As with grpc-go's own retry, calling Context now
// commits the stream: the context the caller holds stays the stream's.
func TestStreamContextCommits(t *testing.T) {
	svc := &stubService{stream: attemptStream}
	ss, err := startStub(t, svc).ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Id: "a", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	sctx := ss.Context()
	_, err = ss.Recv()
	if err == nil && sctx.Err() != nil {
		t.Fatalf("stream delivered a message, but the context from Context() is done: %v", sctx.Err())
	}
	if status.Code(err) != codes.Unavailable || svc.calls.Load() != 1 {
		t.Fatalf("got %v after %d handler runs, want the first attempt's Unavailable: Context commits the stream", err, svc.calls.Load())
	}
}
