package oncekv

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The request metadata of a tracked write (crates/oncekv-proto/src/metadata.rs).
const (
	keyClientID        = "oncekv-client-id"
	keySecret          = "oncekv-session-secret"
	keySeq             = "oncekv-seq"
	keyFirstIncomplete = "oncekv-first-incomplete"
	// keyErrorDetail names, in an error's trailers, why the cluster refused a request
	// (crates/oncekv-proto/src/detail.rs): machine-readable, so nothing parses prose.
	keyErrorDetail = "oncekv-error"
)

const detailSessionExpired = "session-expired"

// The details whose request may succeed if sent again, unchanged, a little later.
var retryableDetails = map[string]bool{
	"not-leader":       true,
	"no-leader":        true,
	"timeout":          true,
	"peer-unreachable": true,
	"stopping":         true,
}

// The details of refusals given before the cluster looks at a write's seq: auth (a stale
// or invalid token, a permission the user lost) and a full window. They answer the
// attempt that got them and say nothing about an earlier attempt of the same seq.
var doorDetails = map[string]bool{
	"auth":              true,
	"permission-denied": true,
	"window-exceeded":   true,
}

// trackedMethods are the writes: each runs once under a session. Every Txn is tracked,
// even a read-only one: telling them apart would mean decoding the request, and tracking
// a read costs only a saved response.
var trackedMethods = map[string]bool{
	"/etcdserverpb.KV/Put":            true,
	"/etcdserverpb.KV/DeleteRange":    true,
	"/etcdserverpb.KV/Txn":            true,
	"/etcdserverpb.KV/Compact":        true,
	"/etcdserverpb.Lease/LeaseGrant":  true,
	"/etcdserverpb.Lease/LeaseRevoke": true,
	"/v3lockpb.Lock/Lock":             true,
	"/v3lockpb.Lock/Unlock":           true,
	"/v3electionpb.Election/Campaign": true,
	"/v3electionpb.Election/Proclaim": true,
	"/v3electionpb.Election/Resign":   true,
}

// blockingMethods wait on the cluster by design (for a lock, for leadership): no attempt
// timeout cuts them short, and time spent waiting does not count against the retry budget.
var blockingMethods = map[string]bool{
	"/v3lockpb.Lock/Lock":             true,
	"/v3electionpb.Election/Campaign": true,
}

// How many times one write may move to a fresh session because its session expired
// before the write could have been applied.
const maxFreshSessions = 3

// OutcomeUnknownError is the error of a write that was sent but whose outcome the client
// can no longer learn: its session expired while it was in flight, or its retries ran out
// (time, context) before an answer came. It may or may not have been applied, exactly
// once at most: it is never sent again. Test for it with errors.As or IsOutcomeUnknown.
//
// Its gRPC status code is Unknown. That code also keeps clientv3 from handling the error:
// clientv3 resends a call that failed with DeadlineExceeded or Canceled while the
// caller's context is still live, and rewrites those codes into context errors, which
// would lose this type. Cause (see Unwrap) still tells a deadline from the rest:
// errors.Is(err, context.DeadlineExceeded) works.
type OutcomeUnknownError struct {
	Method   string // full gRPC method, e.g. /etcdserverpb.KV/Put
	ClientID uint64 // the session it was sent under
	Seq      uint64 // its sequence number in that session
	Cause    error  // the last attempt's error, or the context's
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("oncekv: outcome unknown: %s (session %d, seq %d) may or may not have been applied: %v",
		e.Method, e.ClientID, e.Seq, e.Cause)
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Cause }

// GRPCStatus lets gRPC and clientv3 read the error as a status (code Unknown).
func (e *OutcomeUnknownError) GRPCStatus() *status.Status {
	return status.New(codes.Unknown, e.Error())
}

// IsOutcomeUnknown reports whether err is, or wraps, an *OutcomeUnknownError.
func IsOutcomeUnknown(err error) bool {
	var u *OutcomeUnknownError
	return errors.As(err, &u)
}

// trackingKey marks a context that is already inside this interceptor, so that the
// interceptor installed twice on one connection stamps a write once, not twice.
type trackingKey struct{}

// UnaryClientInterceptor returns the interceptor. Prefer WithExactlyOnce, which installs
// it where clientv3 needs it.
func (s *Session) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return s.intercept
}

func (s *Session) intercept(ctx context.Context, method string, req, reply interface{},
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !trackedMethods[method] || ctx.Value(trackingKey{}) != nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	ctx = context.WithValue(ctx, trackingKey{}, struct{}{})
	start := time.Now()
	for fresh := 0; ; fresh++ {
		sess, err := s.acquire(ctx, cc)
		if err != nil {
			return err
		}
		seq, err := sess.take(ctx)
		if err == errSessionDead && fresh < maxFreshSessions {
			continue
		}
		if err != nil {
			return err
		}
		unsent, err := s.send(ctx, start, sess, seq, method, req, reply, cc, invoker, opts)
		if !unsent || fresh >= maxFreshSessions {
			return err
		}
		// The session expired before any attempt of this write could have been applied:
		// it is safe to run it under a new session, with a new sequence number.
	}
}

// send runs the attempts of seq. unsent reports that the session expired before any
// attempt could have been applied (then err is that refusal).
func (s *Session) send(ctx context.Context, start time.Time, sess *session, seq uint64, method string,
	req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) (unsent bool, err error) {
	blocking := blockingMethods[method]
	budgetStart := start
	// mayHaveRun: an earlier attempt of seq reached, or may have reached, the cluster
	// without being refused for want of a session. From then on a lost session makes the
	// outcome unknown.
	mayHaveRun := false
	unknown := func(cause error) error {
		sess.complete(seq)
		return &OutcomeUnknownError{Method: method, ClientID: sess.id, Seq: seq, Cause: cause}
	}
	for attempt := 1; ; attempt++ {
		// first-incomplete is read per attempt: it only grows, and a fresher one lets the
		// cluster drop saved responses sooner.
		actx := metadata.AppendToOutgoingContext(ctx,
			keyClientID, strconv.FormatUint(sess.id, 10),
			keySecret, sess.secretHex,
			keySeq, strconv.FormatUint(seq, 10),
			keyFirstIncomplete, strconv.FormatUint(sess.firstIncomplete(), 10))
		cancel := func() {}
		if !blocking {
			actx, cancel = context.WithTimeout(actx, s.attemptTimeout(attempt))
		}
		var header, trailer metadata.MD
		callOpts := append(append(make([]grpc.CallOption, 0, len(opts)+2), opts...),
			grpc.Header(&header), grpc.Trailer(&trailer))
		attemptStart := time.Now()
		err := invoker(actx, method, req, reply, cc, callOpts...)
		cancel()
		if err == nil {
			sess.complete(seq)
			return false, nil
		}
		switch classify(err, header, trailer) {
		case classDoor:
			if mayHaveRun {
				// An earlier attempt may have run: this refusal cannot say it did not.
				// (Returned as is, clientv3 would renew a stale token and send the write
				// again as a new call, under a new seq: applied twice.)
				return false, unknown(err)
			}
			sess.complete(seq)
			return false, err
		case classAnswer:
			// The cluster's answer, returned unchanged: etcd's code and message, so
			// clientv3's rpctypes errors still match.
			sess.complete(seq)
			return false, err
		case classExpired:
			s.expire(sess)
			if !mayHaveRun {
				return true, err
			}
			return false, unknown(err)
		}
		mayHaveRun = true
		if ctx.Err() != nil {
			return false, unknown(ctx.Err())
		}
		if cc.GetState() == connectivity.Shutdown {
			// The client was closed under the write: no attempt can follow.
			return false, unknown(err)
		}
		if blocking && time.Since(attemptStart) > s.opts.AttemptTimeout {
			// A Lock or Campaign that waited a long while and then lost its connection:
			// the waiting was its job, not a failure to charge against the budget.
			budgetStart = time.Now()
		}
		delay := s.backoff(attempt)
		if time.Since(budgetStart)+delay > s.opts.MaxRetryTime {
			return false, unknown(err)
		}
		if !sleep(ctx, delay) {
			return false, unknown(ctx.Err())
		}
	}
}

type errorClass int

const (
	classAnswer  errorClass = iota // final: return it
	classRetry                     // resend the same request
	classExpired                   // the session is gone
	classDoor                      // refused before the seq was looked at (doorDetails)
)

func classify(err error, header, trailer metadata.MD) errorClass {
	switch detail := detailOf(trailer, header); {
	case detail == detailSessionExpired:
		return classExpired
	case retryableDetails[detail]:
		return classRetry
	case doorDetails[detail]:
		return classDoor
	case detail != "":
		return classAnswer
	}
	// No detail: the failure is the transport's (or a server that is not oncekv's).
	// Resending under the same seq is always safe, so everything that may be transient is
	// retried; Canceled covers a connection torn down under the call.
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return classRetry
	}
	return classAnswer
}

// detailOf reads oncekv's error detail. An error-only reply puts its metadata in the
// trailers; the headers are checked too, in case a proxy split them.
func detailOf(trailer, header metadata.MD) string {
	for _, md := range []metadata.MD{trailer, header} {
		if v := md.Get(keyErrorDetail); len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// attemptTimeout is the limit of attempt n (from 1): the base, doubled per retry, at most
// four times the base.
func (s *Session) attemptTimeout(n int) time.Duration {
	t := s.opts.AttemptTimeout
	for i := 1; i < n && i < 3; i++ {
		t *= 2
	}
	return t
}

// backoff is the pause after attempt n: BackoffBase doubled per retry up to BackoffCap,
// then a random point in its upper half, so clients that failed together do not retry
// together.
func (s *Session) backoff(n int) time.Duration {
	d := s.opts.BackoffBase
	for i := 1; i < n && d < s.opts.BackoffCap; i++ {
		d *= 2
	}
	if d > s.opts.BackoffCap {
		d = s.opts.BackoffCap
	}
	half := d / 2
	return half + time.Duration(rand.Int63n(int64(half)+1))
}

// sleep waits d, or less if ctx ends first (then it returns false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// contextStatus is ctx's error as the gRPC status clientv3 expects (it maps these codes
// back to the context's error). Only for writes that were never sent.
func contextStatus(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, ctx.Err().Error())
	}
	return status.Error(codes.Canceled, ctx.Err().Error())
}
