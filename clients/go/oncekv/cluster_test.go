package oncekv

// Tests against a real oncekv cluster: `oncekv dev --nodes 3`, started once for the whole
// run. The binary is $ONCEKV_BIN, else the repository's target/debug/oncekv, else
// target/release/oncekv; without one these tests skip (the unit tests still run).
//
// The faults come from a small TCP proxy between client and cluster that lets a request
// through, drops the reply and then cuts the connection: the one failure etcd's client
// cannot resolve by itself, since the write was applied but the client never heard so.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/etcdserver/api/v3rpc/rpctypes"
	pb "go.etcd.io/etcd/etcdserver/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The cluster's settings. The TTL is short so the keep-alive test can outlast it; the
// window is small so concurrent writes must wait for room.
const (
	sessionTTL    = 4 * time.Second
	sessionWindow = 4
)

var cluster struct {
	endpoints []string // host:port of each member's client port
	skip      string   // why the cluster tests skip, if they do
	log       *lockedBuffer
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	bin, err := findBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bin == "" {
		cluster.skip = "no oncekv binary: set ONCEKV_BIN or build target/debug/oncekv or target/release/oncekv"
		return m.Run()
	}
	stop, err := startCluster(bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting %s dev: %v\n", bin, err)
		return 1
	}
	code := m.Run()
	stop()
	return code
}

func findBinary() (string, error) {
	if bin := os.Getenv("ONCEKV_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("ONCEKV_BIN: %v", err)
		}
		return bin, nil
	}
	// The package lives in clients/go/oncekv of the repository; GOPATH may reach it
	// through a symbolic link, so resolve that first.
	wd, err := os.Getwd()
	if err != nil {
		return "", nil
	}
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		wd = real
	}
	root := filepath.Join(wd, "..", "..", "..")
	for _, p := range []string{"target/debug/oncekv", "target/release/oncekv"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return filepath.Join(root, p), nil
		}
	}
	return "", nil
}

var memberLine = regexp.MustCompile(`^\s*n\d+: clients https?://(\S+)\s+peers`)

// startCluster runs `oncekv dev --nodes 3` and waits for its member lines.
func startCluster(bin string) (stop func(), err error) {
	cmd := exec.Command(bin, "dev", "--nodes", "3",
		"--session-ttl", fmt.Sprint(int(sessionTTL/time.Second)),
		"--session-window", fmt.Sprint(sessionWindow))
	cmd.SysProcAttr = childAttr()
	cluster.log = &lockedBuffer{}
	cmd.Stderr = cluster.log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	found := make(chan []string, 1)
	go func() {
		var eps []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			cluster.log.Write([]byte(sc.Text() + "\n"))
			if m := memberLine.FindStringSubmatch(sc.Text()); m != nil {
				eps = append(eps, m[1])
				if len(eps) == 3 {
					found <- eps
				}
			}
		}
		// Keep reading until the process ends, so it never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case eps := <-found:
		cluster.endpoints = eps
	case <-time.After(90 * time.Second):
		stop()
		return nil, fmt.Errorf("no member lines within 90 s; output:\n%s", cluster.log.String())
	}
	// The first write can meet a leader that is still settling; a plain client retries.
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.endpoints, DialTimeout: 10 * time.Second, LogConfig: quietLog()})
	if err != nil {
		stop()
		return nil, err
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cli.Put(ctx, "warm-up", "x")
		cancel()
		if err == nil {
			return stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("no write succeeded within 30 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// clientv3 3.4 logs every failed attempt at warn level; the tests cause many on purpose.
func quietLog() *zap.Config {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	return &cfg
}

func needCluster(t *testing.T) {
	t.Helper()
	if cluster.skip != "" {
		t.Skip(cluster.skip)
	}
}

// newClient is a clientv3 client of eps, through sess when it is not nil.
func newClient(t *testing.T, eps []string, sess *Session) *clientv3.Client {
	t.Helper()
	return newClientAs(t, eps, sess, "", "")
}

// newClientAs is newClient with a user's credentials (none when user is empty).
func newClientAs(t *testing.T, eps []string, sess *Session, user, password string) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 10 * time.Second, LogConfig: quietLog(),
		Username: user, Password: password}
	if sess != nil {
		cfg.DialOptions = []grpc.DialOption{WithExactlyOnce(sess)}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() {
		if sess != nil {
			_ = sess.Close()
		}
		_ = cli.Close()
	})
	return cli
}

// direct is a plain client of the whole cluster, for looking at what was applied.
func direct(t *testing.T) *clientv3.Client {
	return newClient(t, cluster.endpoints, nil)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func version(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].Version
}

// waitFor polls cond for up to 10 s.
func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// uniqueKey keeps tests apart in the one shared cluster.
func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// Sessions in the proxy tests keep alive rarely, so that no keep-alive crosses the proxy
// while it is waiting for the request it means to drop the reply of. They finish well
// within the TTL.
var quietSession = Options{KeepAliveInterval: time.Hour}

// ---- the proxy ----

// proxy forwards TCP to one member. Armed, it lets the next request through, then drops
// everything the server sends back, runs the hook (which checks that the request was
// applied), and cuts the connection.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	armed bool
	sent  bool // client bytes went through since arming
	hook  func()
	cut   chan struct{}
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// swallowNextReply arms the proxy; the channel closes once the connection was cut.
func (p *proxy) swallowNextReply(hook func()) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.sent, p.hook = true, false, hook
	p.cut = make(chan struct{})
	return p.cut
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.clientToServer(c, s)
		go p.serverToClient(c, s)
	}
}

func (p *proxy) clientToServer(c, s net.Conn) {
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.armed {
				p.sent = true
			}
			p.mu.Unlock()
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) serverToClient(c, s net.Conn) {
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 32<<10)
	dropping := false
	for {
		n, err := s.Read(buf)
		if n > 0 && !dropping {
			p.mu.Lock()
			if p.armed && p.sent {
				// The first reply bytes after the request: from here on nothing reaches
				// the client. The cut waits for the hook, so the request has certainly
				// been applied before the client can try again.
				dropping = true
				p.armed = false
				hook, cut := p.hook, p.cut
				go func() {
					if hook != nil {
						hook()
					}
					_ = c.Close()
					_ = s.Close()
					close(cut)
				}()
			}
			p.mu.Unlock()
			if !dropping {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func waitCut(t *testing.T, cut <-chan struct{}) {
	t.Helper()
	select {
	case <-cut:
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy never cut the connection (the request did not go through it?)")
	}
}

// A put whose reply is lost is retried by the interceptor under the same seq, and the
// cluster absorbs the duplicate: version 1. The same loss with the plain client is an
// error, and the resend a naive caller makes is applied a second time: version 2.
func TestLostReplyPutAppliesOnce(t *testing.T) {
	needCluster(t)
	check := direct(t)
	value := strings.Repeat("v", 300)

	run := func(sess *Session) (error, int64, bool) {
		p := newProxy(t, cluster.endpoints[0])
		cli := newClient(t, []string{p.addr()}, sess)
		key := uniqueKey(t)
		// A first write opens the connection (and registers the session), so that the
		// armed proxy sees only the put under test.
		if _, err := cli.Put(ctxT(t, 20*time.Second), key+"-first", "x"); err != nil {
			t.Fatalf("first put: %v", err)
		}
		applied := false
		cut := p.swallowNextReply(func() {
			applied = waitFor(func() bool { return version(t, check, key) >= 1 })
		})
		_, err := cli.Put(ctxT(t, 30*time.Second), key, value)
		waitCut(t, cut)
		if err != nil && sess == nil {
			// What a naive etcd user does with a failed write: send it again.
			if _, err2 := cli.Put(ctxT(t, 30*time.Second), key, value); err2 != nil {
				t.Fatalf("plain client's resend: %v", err2)
			}
		}
		return err, version(t, check, key), applied
	}

	err, v, applied := run(NewSession(quietSession))
	if !applied {
		t.Fatal("tracked: the put was not applied before the connection was cut")
	}
	if err != nil {
		t.Fatalf("tracked put: %v", err)
	}
	if v != 1 {
		t.Fatalf("tracked put: version %d after one put, want 1 (applied twice)", v)
	}

	err, v, applied = run(nil)
	if !applied {
		t.Fatal("plain: the put was not applied before the connection was cut")
	}
	if err == nil {
		t.Fatal("plain put: no error although its reply was dropped")
	}
	t.Logf("plain client's error for the lost reply: %v", err)
	if v != 2 {
		t.Fatalf("plain put resent once: version %d, want 2 (the fault did not bite)", v)
	}
}

// A txn's retried duplicate gets the original's saved answer: its comparison ran once,
// against the key before the put.
func TestLostReplyTxnAnswersOnce(t *testing.T) {
	needCluster(t)
	check := direct(t)
	p := newProxy(t, cluster.endpoints[1])
	sess := NewSession(quietSession)
	cli := newClient(t, []string{p.addr()}, sess)
	key := uniqueKey(t)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key+"-first", "x"); err != nil {
		t.Fatal(err)
	}
	applied := false
	cut := p.swallowNextReply(func() {
		applied = waitFor(func() bool { return version(t, check, key) >= 1 })
	})
	resp, err := cli.Txn(ctxT(t, 30*time.Second)).
		If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, strings.Repeat("t", 300))).
		Else(clientv3.OpGet(key)).
		Commit()
	waitCut(t, cut)
	if !applied {
		t.Fatal("the txn was not applied before the connection was cut")
	}
	if err != nil {
		t.Fatalf("txn: %v", err)
	}
	if !resp.Succeeded {
		t.Fatal("txn answered Succeeded=false: the retry was evaluated again instead of deduplicated")
	}
	if v := version(t, check, key); v != 1 {
		t.Fatalf("version %d, want 1", v)
	}
}

// LeaseGrant with an explicit ID, reply lost: the interceptor's retry succeeds, where
// the plain client's resend meets "lease already exists".
func TestLostReplyLeaseGrantWithID(t *testing.T) {
	needCluster(t)
	check := direct(t)
	grant := func(sess *Session, id int64) (error, error) {
		p := newProxy(t, cluster.endpoints[2])
		cli := newClient(t, []string{p.addr()}, sess)
		if _, err := cli.Put(ctxT(t, 20*time.Second), uniqueKey(t), "x"); err != nil {
			t.Fatal(err)
		}
		cut := p.swallowNextReply(func() {
			waitFor(func() bool {
				ttl, err := check.TimeToLive(ctxT(t, 5*time.Second), clientv3.LeaseID(id))
				return err == nil && ttl.TTL > 0
			})
		})
		// clientv3's Lease API picks IDs itself; the raw stub sends the one we choose,
		// through the same connection and interceptors.
		lease := pb.NewLeaseClient(cli.ActiveConnection())
		req := &pb.LeaseGrantRequest{TTL: 60, ID: id}
		_, err := lease.LeaseGrant(ctxT(t, 30*time.Second), req)
		waitCut(t, cut)
		var again error
		if err != nil {
			_, again = lease.LeaseGrant(ctxT(t, 30*time.Second), req)
			again = rpctypes.Error(again)
		}
		return err, again
	}
	base := time.Now().UnixNano() & 0x7fffffff0000
	if err, _ := grant(NewSession(quietSession), base+1); err != nil {
		t.Fatalf("tracked LeaseGrant with an ID: %v", err)
	}
	err, again := grant(nil, base+2)
	if err == nil {
		t.Fatal("plain LeaseGrant: no error although its reply was dropped")
	}
	if again != rpctypes.ErrLeaseExist {
		t.Fatalf("plain LeaseGrant resent: %v, want %v", again, rpctypes.ErrLeaseExist)
	}
}

// A session lost while its write is in flight: the write fails as outcome unknown (here
// it was in fact applied), it is not resent, and the next write opens a new session.
func TestSessionLostInFlightIsOutcomeUnknown(t *testing.T) {
	needCluster(t)
	check := direct(t)
	p := newProxy(t, cluster.endpoints[0])
	sess := NewSession(quietSession)
	cli := newClient(t, []string{p.addr()}, sess)
	key := uniqueKey(t)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key+"-first", "x"); err != nil {
		t.Fatal(err)
	}
	old := currentSession(t, sess)
	cut := p.swallowNextReply(func() {
		waitFor(func() bool { return version(t, check, key) >= 1 })
		closeRemotely(t, old)
	})
	_, err := cli.Put(ctxT(t, 30*time.Second), key, strings.Repeat("u", 300))
	waitCut(t, cut)
	var unknown *OutcomeUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("put under a closed session: %v, want an *OutcomeUnknownError", err)
	}
	if unknown.ClientID != old.id || unknown.Seq == 0 || !strings.Contains(unknown.Method, "Put") {
		t.Fatalf("unexpected fields: %+v", unknown)
	}
	t.Logf("error: %v", err)
	if v := version(t, check, key); v != 1 {
		t.Fatalf("version %d, want 1 (applied once, never resent)", v)
	}
	if _, err := cli.Put(ctxT(t, 20*time.Second), key, "after"); err != nil {
		t.Fatalf("put after the session was lost: %v", err)
	}
	if id, _ := sess.ClientID(); id == old.id {
		t.Fatalf("still session %d after it was closed", id)
	}
	if v := version(t, check, key); v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
}

// A session that expired between writes: the next write cannot have run under it, so the
// interceptor moves it to a new session without troubling the caller.
func TestExpiredSessionBetweenWritesReregisters(t *testing.T) {
	needCluster(t)
	check := direct(t)
	sess := NewSession(Options{})
	cli := newClient(t, cluster.endpoints, sess)
	key := uniqueKey(t)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key, "1"); err != nil {
		t.Fatal(err)
	}
	old := currentSession(t, sess)
	closeRemotely(t, old)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key, "2"); err != nil {
		t.Fatalf("put after the session was closed remotely: %v", err)
	}
	if id, ok := sess.ClientID(); !ok || id == old.id {
		t.Fatalf("session %d (ok %v), want a new one", id, ok)
	}
	if v := version(t, check, key); v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
}

// The background keep-alive holds the session across an idle spell longer than its TTL.
func TestKeepAliveHoldsSession(t *testing.T) {
	needCluster(t)
	sess := NewSession(Options{})
	cli := newClient(t, cluster.endpoints, sess)
	key := uniqueKey(t)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key, "1"); err != nil {
		t.Fatal(err)
	}
	first, _ := sess.ClientID()
	time.Sleep(sessionTTL + 3*time.Second)
	if _, err := cli.Put(ctxT(t, 20*time.Second), key, "2"); err != nil {
		t.Fatal(err)
	}
	second, _ := sess.ClientID()
	sess.mu.Lock()
	registrations := sess.registrations
	sess.mu.Unlock()
	if first != second || registrations != 1 {
		t.Fatalf("sessions %d then %d, %d registrations: the keep-alive did not hold it", first, second, registrations)
	}
	// A session closed by its owner is gone on the cluster too: its keep-alive is refused.
	cur := currentSession(t, sess)
	if err := sess.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := keepAliveRemotely(t, cur); err == nil {
		t.Fatal("keep-alive of a closed session succeeded")
	}
	if _, err := cli.Put(ctxT(t, 5*time.Second), key, "3"); err != ErrClosed {
		t.Fatalf("put after Close: %v, want ErrClosed", err)
	}
}

// Many writes at once through a window of 4: all succeed, each once, on one session.
func TestConcurrentWritesRespectWindow(t *testing.T) {
	needCluster(t)
	check := direct(t)
	sess := NewSession(Options{})
	cli := newClient(t, cluster.endpoints, sess)
	key := uniqueKey(t)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			_, err := cli.Put(ctxT(t, 60*time.Second), key, fmt.Sprint(i))
			errs <- err
		}(i)
		go func(i int) {
			defer wg.Done()
			_, err := cli.Put(ctxT(t, 60*time.Second), fmt.Sprintf("%s/%d", key, i), "x")
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent put: %v", err)
		}
	}
	if v := version(t, check, key); v != n {
		t.Fatalf("version %d after %d puts", v, n)
	}
	cur := currentSession(t, sess)
	cur.mu.Lock()
	used, pending := cur.next-1, len(cur.pending)
	cur.mu.Unlock()
	if used != 2*n || pending != 0 {
		t.Fatalf("%d seqs used, %d pending; want %d and 0", used, pending, 2*n)
	}
}

// The cluster's refusals come back unchanged, so clientv3's error values still match.
func TestAnswersPassThroughUnchanged(t *testing.T) {
	needCluster(t)
	sess := NewSession(Options{})
	cli := newClient(t, cluster.endpoints, sess)
	_, err := cli.Put(ctxT(t, 20*time.Second), uniqueKey(t), "x", clientv3.WithLease(clientv3.LeaseID(0x7eadbeef)))
	if err != rpctypes.ErrLeaseNotFound {
		t.Fatalf("put with an unknown lease: %v, want %v", err, rpctypes.ErrLeaseNotFound)
	}
	// Reads and a lease granted and revoked go through too.
	lease, err := cli.Grant(ctxT(t, 20*time.Second), 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctxT(t, 20*time.Second), lease.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctxT(t, 20*time.Second), lease.ID); err != rpctypes.ErrLeaseNotFound {
		t.Fatalf("second revoke: %v, want %v", err, rpctypes.ErrLeaseNotFound)
	}
	if _, err := cli.Get(ctxT(t, 20*time.Second), "warm-up"); err != nil {
		t.Fatal(err)
	}
}

// ---- helpers that act on the cluster behind a Session's back ----

func currentSession(t *testing.T, s *Session) *session {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		t.Fatal("no session registered")
	}
	return s.cur
}

func sessionCall(t *testing.T, method string, sess *session) error {
	conn, err := grpc.Dial(cluster.endpoints[0], grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return conn.Invoke(ctx, method, &sessionRequest{clientID: sess.id, secret: sess.secret},
		&emptyResponse{}, grpc.ForceCodec(wireCodec{}))
}

// closeRemotely ends sess on the cluster as another client could (with its secret).
func closeRemotely(t *testing.T, sess *session) {
	t.Helper()
	if err := sessionCall(t, methodClose, sess); err != nil {
		t.Fatalf("closing session %d: %v", sess.id, err)
	}
}

func keepAliveRemotely(t *testing.T, sess *session) error {
	return sessionCall(t, methodKeepAlive, sess)
}
