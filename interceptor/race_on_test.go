//go:build race

package interceptor

// raceBuild: the race detector's instrumentation makes frames larger.
const raceBuild = true
