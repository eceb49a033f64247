package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/admission"
)

// BenchmarkServerInterceptor is the unary server interceptor alone, called
// directly with a request that carries attempt metadata and a deadline,
// without and with admission control: the cost admission adds per call,
// free of the transport's noise.
func BenchmarkServerInterceptor(b *testing.B) {
	for _, tt := range []struct {
		name string
		opts []Option
	}{
		{"admission=off", nil},
		{"admission=on", []Option{WithAdmission(admission.Config{})}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			i, err := New(tt.opts...)
			if err != nil {
				b.Fatal(err)
			}
			h := i.UnaryServer()
			info := &grpc.UnaryServerInfo{FullMethod: "/stormguard.testsvc.v1.TestService/Unary"}
			handler := func(context.Context, any) (any, error) { return nil, nil }
			base := metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataDepth, "1"))
			ctx, cancel := context.WithTimeout(base, time.Hour)
			defer cancel()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := h(ctx, nil, info, handler); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
