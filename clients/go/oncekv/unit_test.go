package oncekv

// Tests that need no cluster: the hand-written encoding, error classes and the window.

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The bytes must be what protoc-generated code writes for the same fields.
func TestWireEncodingMatchesProtobuf(t *testing.T) {
	nonce := bytes.Repeat([]byte{0xab}, 16)
	got := (&registerRequest{nonce: nonce}).marshal()
	want := append([]byte{0x0a, 16}, nonce...)
	if !bytes.Equal(got, want) {
		t.Fatalf("RegisterRequest: % x, want % x", got, want)
	}
	got = (&sessionRequest{clientID: 300, secret: []byte{1, 2}}).marshal()
	want = []byte{0x08, 0xac, 0x02, 0x12, 2, 1, 2}
	if !bytes.Equal(got, want) {
		t.Fatalf("SessionKeepAliveRequest: % x, want % x", got, want)
	}
}

func TestRegisterResponseDecodes(t *testing.T) {
	in := &registerResponse{clientID: 1 << 40, secret: bytes.Repeat([]byte{7}, 16), ttlMs: 60000, window: 128}
	// A header (field 1) and a fixed64 field the decoder does not know come first.
	b := append([]byte{0x0a, 2, 0x08, 1, 0x31, 1, 2, 3, 4, 5, 6, 7, 8}, in.marshal()...)
	var out registerResponse
	if err := out.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if out.clientID != in.clientID || !bytes.Equal(out.secret, in.secret) || out.ttlMs != in.ttlMs || out.window != in.window {
		t.Fatalf("decoded %+v, want %+v", out, in)
	}
	for _, cut := range []int{1, 3, 5} { // in a tag's value, a length, a fixed64
		if err := out.unmarshal(b[:cut]); err == nil {
			t.Fatalf("a message cut at %d bytes decoded", cut)
		}
	}
	if err := out.unmarshal([]byte{0x12, 200}); err == nil {
		t.Fatal("a length past the end decoded")
	}
}

func TestClassify(t *testing.T) {
	md := func(detail string) metadata.MD { return metadata.Pairs(keyErrorDetail, detail) }
	cases := []struct {
		err     error
		trailer metadata.MD
		want    errorClass
	}{
		{status.Error(codes.Unavailable, "x"), md("not-leader"), classRetry},
		{status.Error(codes.DeadlineExceeded, "x"), md("timeout"), classRetry},
		{status.Error(codes.NotFound, "x"), md("session-expired"), classExpired},
		{status.Error(codes.NotFound, "etcdserver: requested lease not found"), md("lease-not-found"), classAnswer},
		{status.Error(codes.Unavailable, "transport is closing"), nil, classRetry},
		{status.Error(codes.InvalidArgument, "x"), nil, classAnswer},
		{status.Error(codes.Internal, "x"), md("bug"), classAnswer},
		{status.Error(codes.InvalidArgument, "etcdserver: revision of auth store is old"), md("auth"), classDoor},
		{status.Error(codes.PermissionDenied, "etcdserver: permission denied"), md("permission-denied"), classDoor},
		{status.Error(codes.ResourceExhausted, "x"), md("window-exceeded"), classDoor},
	}
	for _, c := range cases {
		if got := classify(c.err, nil, c.trailer); got != c.want {
			t.Errorf("%v with %v: class %d, want %d", c.err, c.trailer, got, c.want)
		}
	}
}

// A seq is handed out only while fewer than `window` are outstanding past the first
// incomplete one; completing that one makes room.
func TestWindowWaitsForRoom(t *testing.T) {
	sess, err := newSession(context.Background(), &registerResponse{clientID: 1, secret: make([]byte, 16), ttlMs: 1000, window: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := sess.take(context.Background())
	b, _ := sess.take(context.Background())
	if a != 1 || b != 2 {
		t.Fatalf("seqs %d, %d", a, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := sess.take(ctx); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("third take with a full window: %v", err)
	}
	// Completing seq 2 leaves 1 outstanding: still no room for 3 (3 >= 1 + 2).
	sess.complete(b)
	got := make(chan uint64, 1)
	go func() {
		seq, _ := sess.take(context.Background())
		got <- seq
	}()
	select {
	case seq := <-got:
		t.Fatalf("took %d while seq 1 was outstanding", seq)
	case <-time.After(50 * time.Millisecond):
	}
	if fi := sess.firstIncomplete(); fi != 1 {
		t.Fatalf("first incomplete %d", fi)
	}
	sess.complete(a)
	select {
	case seq := <-got:
		if seq != 3 {
			t.Fatalf("took %d, want 3", seq)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no room after seq 1 completed")
	}
	sess.kill()
	if _, err := sess.take(context.Background()); err != errSessionDead {
		t.Fatalf("take on a dead session: %v", err)
	}
}

func TestOutcomeUnknownIsFindable(t *testing.T) {
	var err error = &OutcomeUnknownError{Method: "/etcdserverpb.KV/Put", ClientID: 3, Seq: 9, Cause: context.DeadlineExceeded}
	if !IsOutcomeUnknown(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("not found through errors.As / errors.Is")
	}
	// Unknown keeps clientv3 from resending it or rewriting it into a context error.
	if status.Code(err) != codes.Unknown {
		t.Fatalf("code %v", status.Code(err))
	}
}

func TestBackoffStaysInBounds(t *testing.T) {
	s := NewSession(Options{})
	for n := 1; n < 40; n++ {
		d := s.backoff(n)
		if d < s.opts.BackoffBase/2 || d > s.opts.BackoffCap {
			t.Fatalf("backoff(%d) = %v", n, d)
		}
	}
	if s.attemptTimeout(10) != 4*s.opts.AttemptTimeout {
		t.Fatalf("attempt timeout %v", s.attemptTimeout(10))
	}
}
