"""An "order" tier of the stormguard chain in Python, written from
docs/protocol.md (version 2.1) alone, for the interop check (make interop).

It serves TestService/Unary and forwards each request to --next (payment)
as raw bytes: no generated code, no protobuf. It reads the request keys
(section 3), applies the default tier policy (2.3), sends the request keys
of its attempts (2.2), retries UNAVAILABLE with full jitter (2.4) within
the deadline, honours pushback (4), and answers "do not retry" when it
gives up (4). grpcio sees no empty header block (section 9), so a unary
failure is never committed here (section 6).

It prints the address it listens on, then one line per request served:
"served N attempts M" (the totals so far).
"""

import argparse
import random
import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/stormguard.testsvc.v1.TestService/Unary"
MAX_DEPTH, MAX_ATTEMPT, MAX_UPSTREAM, MAX_ENVOY = 64, 100, 1000, 101
ATTEMPTS = 3
BASE, CAP = 0.050, 1.0  # seconds (2.4)


def parse_count(value, limit):
    """Section 3, rule 2: digits only, after trimming; long values clamp."""
    v = value.strip(" \t")
    if not v or any(c < "0" or c > "9" for c in v):
        return None
    if len(v) > 8:
        return limit
    return min(int(v), limit)


def cautious(values, limit, if_invalid):
    """Rules 1-4: the largest value; a malformed one counts as if_invalid."""
    best = 0
    for v in values:
        n = parse_count(v, limit)
        best = max(best, if_invalid if n is None else n)
    return best


def parse_info(metadata):
    """Section 2.1: (depth, attempt, upstream retries) of a request."""
    def get(key):
        return [v for k, v in metadata if k == key]

    attempt = max(cautious(get("x-retry-attempt"), MAX_ATTEMPT, 1),
                  cautious(get("grpc-previous-rpc-attempts"), MAX_ATTEMPT, 1))
    depth = cautious(get("x-call-depth"), MAX_DEPTH, MAX_DEPTH)
    upstream = cautious(get("x-upstream-retries"), MAX_UPSTREAM, 1) + attempt
    envoy = cautious(get("x-envoy-attempt-count"), MAX_ENVOY, 2)
    if envoy > 1:
        upstream += envoy - 1
    return depth, attempt, min(upstream, MAX_UPSTREAM)


def pushback(trailing):
    """Section 4: None (absent), -1 (do not retry) or milliseconds."""
    values = [v for k, v in (trailing or ()) if k == "grpc-retry-pushback-ms"]
    if not values:
        return None
    if len(values) > 1:
        return -1
    v = values[0].strip(" \t")
    digits = v[1:] if v[:1] in ("+", "-") else v
    if not digits or any(c < "0" or c > "9" for c in digits):
        return -1
    n = int(v)
    if n > 2**63 - 1 or n < -2**63:
        return -1
    return n


class Order(grpc.GenericRpcHandler):
    def __init__(self, next_addr):
        channel = grpc.insecure_channel(next_addr, options=[("grpc.enable_retries", 0)])
        self.next = channel.unary_unary(METHOD)  # bytes in, bytes out
        self.lock = threading.Lock()
        self.served = 0
        self.attempts = 0

    def service(self, details):
        if details.method == METHOD:
            return grpc.unary_unary_rpc_method_handler(self.unary)
        return None

    def count(self, served=0, attempts=0):
        with self.lock:
            self.served += served
            self.attempts += attempts
            print(f"served {self.served} attempts {self.attempts}", flush=True)

    def unary(self, request, ctx):
        depth, _, upstream = parse_info(ctx.invocation_metadata())
        allowed = 1 if upstream > 0 else ATTEMPTS  # 2.3, the default policy
        sent = [("x-call-depth", str(min(depth + 1, MAX_DEPTH)))]  # 2.2
        if upstream > 0:
            sent.append(("x-upstream-retries", str(upstream)))
        left = ctx.time_remaining()
        deadline = None if left is None else time.monotonic() + left
        n = 0
        try:
            while True:
                md = sent + ([("x-retry-attempt", str(n))] if n > 0 else [])
                timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
                n += 1
                try:
                    return self.next(request, metadata=md, timeout=timeout)
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:
                        ctx.abort(err.code(), err.details())  # not retried: no pushback
                    wait = self.wait(n, pushback(err.trailing_metadata()), allowed, deadline)
                    if wait is None:  # gave up: tell the tier above (section 4)
                        ctx.set_trailing_metadata((("grpc-retry-pushback-ms", "-1"),))
                        ctx.abort(err.code(), err.details())
                    time.sleep(wait)
        finally:
            self.count(served=1, attempts=n)

    @staticmethod
    def wait(n, pb, allowed, deadline):
        """The wait before attempt n + 1, or None to give up."""
        if (pb is not None and pb < 0) or n >= allowed:
            return None
        if pb is not None:
            wait = min(pb / 1000.0, CAP)
        else:
            wait = random.uniform(0, min(CAP, BASE * 2 ** (n - 1)))
        if deadline is not None and deadline - time.monotonic() <= wait:  # 2.4
            return None
        return wait


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--next", required=True)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), handlers=[Order(args.next)])
    port = server.add_insecure_port(args.listen)
    server.start()
    host = args.listen.rsplit(":", 1)[0]
    print(f"{host}:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    sys.exit(main())
