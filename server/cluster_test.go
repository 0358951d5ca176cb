package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/replication"
	"github.com/kiroku-db/kiroku/wire"
)

const testAdminToken = "cluster-test-admin-token"

// testCluster is n members of a cluster in this process.
type testCluster struct {
	t     *testing.T
	base  string
	peers map[uint64]string
	run   map[uint64]*Running
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		l.Close()
	}
	return out
}

func startTestCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := &testCluster{t: t, base: t.TempDir(), peers: map[uint64]string{}, run: map[uint64]*Running{}}
	for i, a := range freeAddrs(t, n) {
		c.peers[uint64(i+1)] = a
	}
	keys := filepath.Join(c.base, "shared")
	if _, err := InitKeys(keys, auth.SchemeECDSA); err != nil {
		t.Fatal(err)
	}
	for id := range c.peers {
		dir := c.dir(id)
		if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"ledger-ecdsa.pem", "secrets.key"} {
			b, err := os.ReadFile(filepath.Join(keys, "keys", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "keys", f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c.start(id, false)
	}
	t.Cleanup(func() {
		for _, r := range c.run {
			r.Stop(time.Second)
		}
	})
	return c
}

func (c *testCluster) dir(id uint64) string { return filepath.Join(c.base, fmt.Sprint(id)) }

func (c *testCluster) options(id uint64, join bool) Options {
	return Options{DataDir: c.dir(id), AdminToken: testAdminToken, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &ClusterOptions{NodeID: id, Peers: c.peers, ClusterID: "test", Join: join,
			Raft: replication.Config{TickInterval: 50 * time.Millisecond}}}
}

func (c *testCluster) start(id uint64, join bool) {
	c.t.Helper()
	r, err := Start(context.Background(), c.options(id, join))
	if err != nil {
		c.t.Fatalf("member %d: %v", id, err)
	}
	c.run[id] = r
}

func (c *testCluster) stop(id uint64) {
	c.t.Helper()
	if err := c.run[id].Stop(time.Second); err != nil {
		c.t.Logf("stopping member %d: %v", id, err)
	}
	delete(c.run, id)
}

func (c *testCluster) servers() string {
	s := ""
	for id := uint64(1); id <= uint64(len(c.peers)); id++ {
		if a, ok := c.peers[id]; ok {
			if s != "" {
				s += ","
			}
			s += a
		}
	}
	return s
}

// leader waits for a member that serves, and returns its id.
func (c *testCluster) leader() uint64 {
	c.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for id, r := range c.run {
			if _, err := r.member.ledger(); err == nil {
				return id
			}
		}
	}
	c.t.Fatal("no member serves")
	return 0
}

// TestClusterServesThroughFailover: a client that knows one follower is
// sent to the leader; when the leader stops, a new one takes over with
// every acknowledged transaction, and the old one comes back as a
// follower that catches up.
func TestClusterServesThroughFailover(t *testing.T) {
	c := startTestCluster(t, 3)
	ctx := context.Background()
	lead := c.leader()
	follower := lead%3 + 1
	secret := make([]byte, 32)
	cl, err := client.Dial(client.Config{Server: c.peers[follower], Entity: "alice", Secret: secret, AdminToken: testAdminToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if cl.Server() != c.peers[lead] {
		t.Fatalf("the client calls %s, want the leader %s", cl.Server(), c.peers[lead])
	}
	const counter = "def invoke(ledger, args):\n    cur = ledger.get('n')\n    n = 1 if cur == None else cur['value'] + 1\n    ledger.put('n', n)\n    return n\n"
	if err := cl.RegisterContract(ctx, "counter", []byte(counter)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		if _, err := cl.Execute(ctx, "counter", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(lead)
	// A client of the remaining members only.
	var rest string
	for id, a := range c.peers {
		if id != lead {
			rest += a + ","
		}
	}
	cl2, err := client.Dial(client.Config{Server: rest, Entity: "alice", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	res, err := cl2.Execute(ctx, "counter", []byte(`{}`))
	if err != nil {
		t.Fatalf("after the leader stopped: %v", err)
	}
	if string(res.Result) != "21" {
		t.Fatalf("the counter after failover is %s, want 21: an acknowledged transaction was lost", res.Result)
	}
	c.start(lead, false)
	// The old leader catches up: hand it the leadership and read there.
	newLead := c.leader()
	conn, err := grpc.NewClient(c.peers[newLead], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testAdminToken)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err = api.NewClusterClient(conn).TransferLeader(actx, &api.TransferLeaderRequest{NodeId: lead})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		for id, r := range c.run {
			if s := r.member.current(); s != nil {
				st, _ := s.Runner().Status(ctx)
				t.Logf("member %d: %+v", id, st)
			}
		}
		t.Fatalf("transfer-leader to the restarted member: %v", err)
	}
	if got := c.leader(); got != lead {
		t.Fatalf("member %d serves after the transfer, want %d", got, lead)
	}
	vs, err := cl2.History(ctx, "n", ledger.ScanRange{End: -1})
	if err != nil || len(vs) != 21 {
		t.Fatalf("the restarted member, now leading, has %d versions of n (%v), want 21", len(vs), err)
	}
	if cl2.Server() != c.peers[lead] {
		t.Errorf("the client was not sent to the new leader: it calls %s", cl2.Server())
	}
	v, err := cl2.ValidateLedger(ctx, "n", 0, -1)
	if err != nil || !v.Ok {
		t.Fatalf("validate-ledger on the restarted member: %v %+v", err, v)
	}
}

// TestClusterFollowerAnswersWithLeader: a unary call to a follower is
// UNAVAILABLE with kind not_leader and the leader's address.
func TestClusterFollowerAnswersWithLeader(t *testing.T) {
	c := startTestCluster(t, 3)
	lead := c.leader()
	follower := lead%3 + 1
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.run[follower].member.mu.Lock()
		known := c.run[follower].member.leader
		c.run[follower].member.mu.Unlock()
		if known == lead || time.Now().After(deadline) {
			break
		}
	}
	conn, err := grpc.NewClient(c.peers[follower], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var trailer metadata.MD
	_, err = api.NewLedgerClient(conn).GetAsset(context.Background(), &api.GetAssetRequest{Id: "x"}, grpc.Trailer(&trailer))
	if code := statusCode(err); code != codes.Unavailable {
		t.Fatalf("a follower's answer: %v, want UNAVAILABLE", err)
	}
	if k := trailer.Get(wire.ErrorKindKey); len(k) != 1 || k[0] != wire.KindNotLeader {
		t.Fatalf("kind %v, want not_leader", k)
	}
	if l := trailer.Get(wire.LeaderKey); len(l) != 1 || l[0] != c.peers[lead] {
		t.Fatalf("leader %v, want %s", l, c.peers[lead])
	}
}

// TestClusterRefusesBadMembers: a member without the shared keys, with a
// peer list that disagrees with its directory's, or with a single
// server's directory, is refused with a typed error.
func TestClusterRefusesBadMembers(t *testing.T) {
	c := startTestCluster(t, 3)
	c.leader()
	c.stop(2)
	o := c.options(2, false)
	o.Cluster.Peers = map[uint64]string{1: c.peers[1], 2: c.peers[2], 3: c.peers[3], 4: "127.0.0.1:1"}
	if _, err := Start(context.Background(), o); !errors.Is(err, replication.ErrPeersMismatch) {
		t.Fatalf("other peers: %v, want ErrPeersMismatch", err)
	}
	o = c.options(2, false)
	o.Cluster.ClusterID = "other"
	if _, err := Start(context.Background(), o); !errors.Is(err, replication.ErrWrongCluster) {
		t.Fatalf("another cluster's name: %v, want ErrWrongCluster", err)
	}
	o = c.options(4, true)
	o.DataDir = t.TempDir()
	if _, err := Start(context.Background(), o); !errors.Is(err, ErrSharedKeysMissing) {
		t.Fatalf("no shared keys: %v, want ErrSharedKeysMissing", err)
	}
	single := t.TempDir()
	r := startServerIn(t, single)
	r.Stop(time.Second)
	o = c.options(2, false)
	o.DataDir = single
	if _, err := Start(context.Background(), o); !errors.Is(err, replication.ErrWrongCluster) {
		t.Fatalf("a single server's directory: %v, want ErrWrongCluster", err)
	}
}

func startServerIn(t *testing.T, dir string) *Running {
	r, err := Start(context.Background(), Options{DataDir: dir, Listen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestClusterMembership: a fourth member started with --join is added as
// a learner, promoted to a voter, receives the log, and is removed.
func TestClusterMembership(t *testing.T) {
	c := startTestCluster(t, 3)
	ctx := context.Background()
	lead := c.leader()
	cl, err := client.Dial(client.Config{Server: c.servers(), Entity: "bob", Secret: make([]byte, 32), AdminToken: testAdminToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	addr := freeAddrs(t, 1)[0]
	c.peers[4] = addr
	keys := filepath.Join(c.dir(4), "keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ledger-ecdsa.pem", "secrets.key"} {
		b, _ := os.ReadFile(filepath.Join(c.dir(1), "keys", f))
		if err := os.WriteFile(filepath.Join(keys, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	o := c.options(4, true)
	r, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	c.run[4] = r
	conn, err := grpc.NewClient(c.peers[lead], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := api.NewClusterClient(conn)
	if _, err := cc.AddNode(ctx, &api.AddNodeRequest{NodeId: 4, Address: addr}); statusCode(err) != codes.PermissionDenied {
		t.Fatalf("add-node without the admin token: %v, want PERMISSION_DENIED", err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testAdminToken)
	if _, err := cc.AddNode(actx, &api.AddNodeRequest{NodeId: 4, Address: addr, Learner: true}); err != nil {
		t.Fatalf("add-node as a learner: %v", err)
	}
	if _, err := cc.AddNode(actx, &api.AddNodeRequest{NodeId: 4, Address: addr}); err != nil {
		t.Fatalf("promoting the learner: %v", err)
	}
	st, err := cc.Status(ctx, &api.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 4 {
		t.Fatalf("members after add-node: %v", st.Members)
	}
	// The new member applies the log: its applied index reaches the
	// leader's commit.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s4, err := r.member.current().Runner().Status(ctx)
		if err == nil && s4.Applied >= st.Commit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member 4 applied %d of %d", s4.Applied, st.Commit)
		}
	}
	if _, err := cc.RemoveNode(actx, &api.RemoveNodeRequest{NodeId: 4}); err != nil {
		t.Fatalf("remove-node: %v", err)
	}
	if _, err := cc.RemoveNode(actx, &api.RemoveNodeRequest{NodeId: lead}); statusCode(err) != codes.FailedPrecondition {
		t.Fatalf("the leader removing itself: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := cl.Execute(ctx, "builtin.ycsb_c", []byte(`{"ids":["a","b"]}`)); err != nil && !errors.Is(err, ledger.ErrContractFailed) {
		t.Fatalf("a call after the changes: %v", err)
	}
}

func statusCode(err error) codes.Code { return status.Code(err) }
