package oncekv

// Exactly-once under etcd auth, against the shared test cluster. Auth is switched on
// for one test and off again when it ends (the tests of this package run one at a
// time), with users and roles named after the test so a rerun starts clean.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/clientv3"
)

// withAuth turns auth on for the rest of t: a root user and a user allowed to read and
// write under prefix. It returns the user's name and password and a root client of the
// whole cluster; when t ends, auth goes off and the users and roles go.
func withAuth(t *testing.T, prefix string) (user, password string, root *clientv3.Client) {
	t.Helper()
	admin := direct(t)
	ctx := ctxT(t, 60*time.Second)
	suffix := fmt.Sprint(time.Now().UnixNano())
	user, password = "writer-"+suffix, "writer-pw"
	rootPassword := "root-pw-" + suffix
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", rootPassword); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, user); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, user, password); return err },
		func() error { _, err := admin.UserGrantRole(ctx, user, user); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth set-up step %d: %v", i+1, err)
		}
	}
	root = newClientAs(t, cluster.endpoints, nil, "root", rootPassword)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := root.AuthDisable(ctx); err != nil {
			t.Errorf("switching auth off again: %v (later tests will fail)", err)
			return
		}
		_, _ = admin.UserDelete(ctx, user)
		_, _ = admin.RoleDelete(ctx, user)
		_, _ = admin.UserDelete(ctx, "root")
	})
	return user, password, root
}

// A put's reply is lost and, before the retry, an unrelated auth change makes clientv3's
// token stale. The retry is refused ("revision of auth store is old") before the cluster
// looks at its seq. Handed back as is, that refusal would make clientv3 renew its token
// and send the put again as a new call, under a new seq: applied twice. The interceptor
// reports the put's outcome as unknown instead, and it stays applied once.
func TestAuthChangeAfterLostReplyAppliesOnce(t *testing.T) {
	needCluster(t)
	prefix := uniqueKey(t) + "/"
	user, password, root := withAuth(t, prefix)
	p := newProxy(t, cluster.endpoints[0])
	cli := newClientAs(t, []string{p.addr()}, NewSession(quietSession), user, password)
	key := prefix + "k"
	if _, err := cli.Put(ctxT(t, 20*time.Second), prefix+"first", "x"); err != nil {
		t.Fatalf("first put: %v", err)
	}
	applied := false
	cut := p.swallowNextReply(func() {
		applied = waitFor(func() bool { return version(t, root, key) >= 1 })
		// Any change to users or roles moves the auth revision on.
		if _, err := root.RoleAdd(ctxT(t, 10*time.Second), user+"-other"); err != nil {
			t.Errorf("role add: %v", err)
		}
	})
	_, err := cli.Put(ctxT(t, 30*time.Second), key, "v")
	waitCut(t, cut)
	if !applied {
		t.Fatal("the put was not applied before the connection was cut")
	}
	if v := version(t, root, key); v != 1 {
		t.Fatalf("version %d after one put, want 1 (applied twice); the put returned %v", v, err)
	}
	if !IsOutcomeUnknown(err) {
		t.Fatalf("put: %v, want an *OutcomeUnknownError (the first attempt ran, the retry was refused)", err)
	}
	_, _ = root.RoleDelete(ctxT(t, 10*time.Second), user+"-other")
}
