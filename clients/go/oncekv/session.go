// Package oncekv gives etcd's Go client (go.etcd.io/etcd/clientv3, the 3.4 line)
// exactly-once writes against an oncekv cluster.
//
// etcd's client sends a write at most once when it can tell the write was not sent, and
// otherwise leaves a failed write to the caller, who can only resend it and risk applying
// it twice. oncekv's session protocol removes the risk: each write carries a client
// session id and secret and a sequence number, a retry resends the same number, and the
// cluster answers a duplicate with the saved response instead of applying it again.
//
// This package is a gRPC unary client interceptor that speaks that protocol:
//
//	cli, sess, err := oncekv.New(clientv3.Config{Endpoints: eps}, oncekv.Options{})
//	defer cli.Close()
//	defer sess.Close() // before cli.Close: it ends the session over the client's connection
//	_, err = cli.Put(ctx, "k", "v") // applied exactly once, or an *OutcomeUnknownError
//
// Tracked (written once) are KV Put, DeleteRange, Txn and Compact, Lease LeaseGrant and
// LeaseRevoke, and the Lock and Election services' writes. Reads, watches and lease
// keep-alives pass through untouched.
package oncekv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Options tunes a Session. The zero value gives the defaults.
type Options struct {
	// MaxRetryTime bounds how long one write is retried (default 30s). The call's
	// context deadline bounds it too, whichever ends first. A write that was sent and is
	// still unanswered when it runs out fails with an *OutcomeUnknownError.
	MaxRetryTime time.Duration
	// AttemptTimeout is how long one attempt may wait for its answer before it is
	// abandoned and resent under the same sequence number (default 2s; it doubles for
	// each retry, up to four times this). Lock and Campaign, which wait by design, have
	// no per-attempt limit.
	AttemptTimeout time.Duration
	// BackoffBase and BackoffCap shape the pause between attempts: BackoffBase doubled
	// for each retry, capped at BackoffCap, then jittered (defaults 25ms and 1s).
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// KeepAliveInterval is how often the session is kept alive (default: a third of the
	// TTL the cluster announces).
	KeepAliveInterval time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxRetryTime <= 0 {
		o.MaxRetryTime = 30 * time.Second
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 2 * time.Second
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = 25 * time.Millisecond
	}
	if o.BackoffCap < o.BackoffBase {
		o.BackoffCap = time.Second
		if o.BackoffCap < o.BackoffBase {
			o.BackoffCap = o.BackoffBase
		}
	}
	return o
}

// Session is one client's exactly-once state: the cluster session it writes under
// (registered lazily by the first tracked write, and again after the cluster expired
// it), its sequence numbers and its keep-alive. Use one Session per clientv3.Client.
type Session struct {
	opts Options

	mu sync.Mutex
	// cur is the live cluster session; nil before the first write, after an expiry and
	// after Close.
	cur *session
	// registering is non-nil while one caller registers; it is closed when that ends, so
	// the others wait for it instead of opening sessions of their own.
	registering chan struct{}
	// nonce is the nonce of the registration under way, or of the last one that failed:
	// the next attempt resends it, so a registration whose reply was lost gives back the
	// session the cluster opened instead of leaking it and opening another.
	nonce []byte
	// cc is the connection of the first tracked write; registrations, keep-alives and
	// Close go over it, so they carry the same credentials (clientv3 adds its auth token
	// to every call on that connection) and the cluster ties the session to that user.
	cc            *grpc.ClientConn
	closed        bool
	registrations int
}

// session is one registration: what the cluster gave, and the sequence numbers used under
// it. Sequence numbers belong to a registration; a new one starts again from 1.
type session struct {
	id        uint64
	secret    []byte
	secretHex string
	ttl       time.Duration
	window    uint64
	// token is the auth token metadata of the write that registered it, if the caller
	// put one in its context; keep-alives and Close resend it.
	token []string

	mu      sync.Mutex
	next    uint64              // the next seq to hand out (from 1)
	pending map[uint64]struct{} // handed out, no final outcome yet
	// room is closed, and replaced, whenever a seq completes or the session dies: a
	// write waiting for window room then looks again.
	room chan struct{}
	dead bool
	stop chan struct{} // closed when the keep-alive must end
}

// NewSession makes a Session. Nothing is sent until the first tracked write.
func NewSession(opts Options) *Session {
	return &Session{opts: opts.withDefaults()}
}

// New makes a clientv3 client whose writes go through a new Session. Close the Session
// before the client.
func New(cfg clientv3.Config, opts Options) (*clientv3.Client, *Session, error) {
	s := NewSession(opts)
	cfg.DialOptions = append(append([]grpc.DialOption(nil), cfg.DialOptions...), WithExactlyOnce(s))
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return cli, s, nil
}

// WithExactlyOnce is the dial option that installs s in a clientv3.Config's DialOptions.
//
// It chains the interceptor (grpc.WithChainUnaryInterceptor) rather than setting it
// (grpc.WithUnaryInterceptor): clientv3 sets its own retrying interceptor with
// WithUnaryInterceptor and appends Config.DialOptions after it, so a second
// WithUnaryInterceptor would silently replace clientv3's (and with it clientv3's read
// retries and auth-token refresh). Chained, s runs inside clientv3's interceptor, on
// every attempt it makes.
func WithExactlyOnce(s *Session) grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(s.UnaryClientInterceptor())
}

// ClientID is the cluster session's id, if one is registered now.
func (s *Session) ClientID() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || s.cur.isDead() {
		return 0, false
	}
	return s.cur.id, true
}

// ErrClosed is returned by writes through a Session after its Close.
var ErrClosed = status.Error(codes.FailedPrecondition, "oncekv: session closed")

// Close stops the keep-alive and ends the cluster session, freeing its saved responses.
// Writes still in flight under it then fail with an *OutcomeUnknownError, or ErrClosed if
// they were not sent yet; later writes fail with ErrClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	cur, cc := s.cur, s.cc
	s.cur = nil
	s.mu.Unlock()
	if cur == nil || cc == nil {
		return nil
	}
	cur.kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var trailer metadata.MD
	err := cc.Invoke(cur.outgoing(ctx), methodClose, &sessionRequest{clientID: cur.id, secret: cur.secret},
		&emptyResponse{}, grpc.ForceCodec(wireCodec{}), grpc.Trailer(&trailer))
	if err != nil && detailOf(trailer, nil) == detailSessionExpired {
		return nil // already gone: what Close wanted
	}
	return err
}

// acquire returns the live cluster session, registering one if there is none.
func (s *Session) acquire(ctx context.Context, cc *grpc.ClientConn) (*session, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if s.cc == nil {
			s.cc = cc
		}
		if s.cur != nil && !s.cur.isDead() {
			cur := s.cur
			s.mu.Unlock()
			return cur, nil
		}
		if wait := s.registering; wait != nil {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, contextStatus(ctx)
			}
		}
		done := make(chan struct{})
		s.registering = done
		if s.nonce == nil {
			nonce := make([]byte, 16)
			if _, err := rand.Read(nonce); err != nil {
				s.registering = nil
				close(done)
				s.mu.Unlock()
				return nil, status.Errorf(codes.Internal, "oncekv: drawing a registration nonce: %v", err)
			}
			s.nonce = nonce
		}
		nonce := s.nonce
		regCC := s.cc
		s.mu.Unlock()

		sess, err := s.register(ctx, regCC, nonce)

		s.mu.Lock()
		s.registering = nil
		close(done)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.nonce = nil // the next registration wants a new session, so a new nonce
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		s.cur = sess
		s.registrations++
		s.mu.Unlock()
		go s.keepAlive(regCC, sess)
		return sess, nil
	}
}

// register calls Session/Register, retrying what may succeed later with the same nonce.
func (s *Session) register(ctx context.Context, cc *grpc.ClientConn, nonce []byte) (*session, error) {
	deadline := time.Now().Add(s.opts.MaxRetryTime)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, s.attemptTimeout(attempt))
		var header, trailer metadata.MD
		resp := &registerResponse{}
		err := cc.Invoke(actx, methodRegister, &registerRequest{nonce: nonce}, resp,
			grpc.ForceCodec(wireCodec{}), grpc.Header(&header), grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			return newSession(ctx, resp)
		}
		if classify(err, header, trailer) != classRetry || ctx.Err() != nil {
			if ctx.Err() != nil {
				return nil, contextStatus(ctx)
			}
			return nil, err
		}
		delay := s.backoff(attempt)
		if time.Now().Add(delay).After(deadline) || !sleep(ctx, delay) {
			return nil, err
		}
	}
}

func newSession(ctx context.Context, r *registerResponse) (*session, error) {
	if r.clientID == 0 || len(r.secret) != 16 || r.window == 0 || r.ttlMs == 0 {
		return nil, status.Errorf(codes.Internal,
			"oncekv: malformed registration reply (client id %d, %d-byte secret, window %d, ttl %d ms)",
			r.clientID, len(r.secret), r.window, r.ttlMs)
	}
	var token []string
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		token = md.Get("token")
	}
	return &session{
		id:        r.clientID,
		secret:    r.secret,
		secretHex: hex.EncodeToString(r.secret),
		ttl:       time.Duration(r.ttlMs) * time.Millisecond,
		window:    r.window,
		token:     token,
		next:      1,
		pending:   make(map[uint64]struct{}),
		room:      make(chan struct{}),
		stop:      make(chan struct{}),
	}, nil
}

// keepAlive extends sess every interval until it is closed, expires, or the connection
// is shut down.
func (s *Session) keepAlive(cc *grpc.ClientConn, sess *session) {
	interval := s.opts.KeepAliveInterval
	if interval <= 0 {
		interval = sess.ttl / 3
	}
	if interval < 10*time.Millisecond {
		interval = 10 * time.Millisecond
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-sess.stop:
			return
		case <-ticker.C:
		}
		if cc.GetState() == connectivity.Shutdown {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		var header, trailer metadata.MD
		err := cc.Invoke(sess.outgoing(ctx), methodKeepAlive,
			&sessionRequest{clientID: sess.id, secret: sess.secret}, &emptyResponse{},
			grpc.ForceCodec(wireCodec{}), grpc.Header(&header), grpc.Trailer(&trailer))
		cancel()
		if err != nil && classify(err, header, trailer) == classExpired {
			s.expire(sess)
			return
		}
		// Any other failure is retried at the next tick: a session outlives a few missed
		// keep-alives (the interval is a third of its TTL).
	}
}

// expire forgets sess after the cluster said it is gone; the next write registers anew.
func (s *Session) expire(sess *session) {
	sess.kill()
	s.mu.Lock()
	if s.cur == sess {
		s.cur = nil
	}
	s.mu.Unlock()
}

// outgoing adds the registering call's auth token, if it carried one in its context.
func (sess *session) outgoing(ctx context.Context) context.Context {
	for _, t := range sess.token {
		ctx = metadata.AppendToOutgoingContext(ctx, "token", t)
	}
	return ctx
}

func (sess *session) isDead() bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.dead
}

// kill marks sess dead, stops its keep-alive and wakes writes waiting for window room.
func (sess *session) kill() {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.dead {
		return
	}
	sess.dead = true
	close(sess.stop)
	close(sess.room)
	sess.room = make(chan struct{})
}

var errSessionDead = errors.New("oncekv: session expired before the write got a sequence number")

// take hands out the next seq, waiting while `window` of them are already outstanding
// past the first incomplete one (the cluster refuses a seq that far ahead).
func (sess *session) take(ctx context.Context) (uint64, error) {
	for {
		sess.mu.Lock()
		if sess.dead {
			sess.mu.Unlock()
			return 0, errSessionDead
		}
		if sess.next < sess.firstIncompleteLocked()+sess.window {
			seq := sess.next
			sess.next++
			sess.pending[seq] = struct{}{}
			sess.mu.Unlock()
			return seq, nil
		}
		room := sess.room
		sess.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return 0, contextStatus(ctx)
		}
	}
}

// complete records that seq has its final outcome (an answer, or given up as unknown):
// it is never sent again, and the cluster may drop its saved response.
func (sess *session) complete(seq uint64) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	delete(sess.pending, seq)
	if !sess.dead {
		close(sess.room)
		sess.room = make(chan struct{})
	}
}

func (sess *session) firstIncomplete() uint64 {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.firstIncompleteLocked()
}

// The smallest seq without a final outcome. A linear scan: at most `window` are pending.
func (sess *session) firstIncompleteLocked() uint64 {
	first := sess.next
	for seq := range sess.pending {
		if seq < first {
			first = seq
		}
	}
	return first
}

func (s *Session) String() string {
	if id, ok := s.ClientID(); ok {
		return fmt.Sprintf("oncekv session %d", id)
	}
	return "oncekv session (not registered)"
}
