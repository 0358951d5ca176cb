package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/replication"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/grpcnet"
)

// ClusterOptions make the server one member of a replicated cluster
// (package replication): the embedded engine's log is the cluster's Raft
// log, the member that leads executes every call, and the others apply
// the log (hot standby) and answer calls with the leader's address
// (NotLeaderError), which the Go SDK follows.
type ClusterOptions struct {
	// NodeID is this member's id: one of Peers unless Join.
	NodeID uint64
	// Peers maps each member's id to its gRPC address, on which it serves
	// both clients and its peers. Unless Join, they are the cluster's
	// first voters, recorded in the member's directory on first start; a
	// later start with other ids is refused (replication.ErrPeersMismatch).
	// A member added later (AddNode) is known by the address its change
	// carries.
	Peers map[uint64]string
	// ClusterID names the cluster; "" means "kiroku". A directory of
	// another cluster is refused (replication.ErrWrongCluster), and so is
	// traffic from one.
	ClusterID string
	// Join starts a member that `kiroku cluster add-node` adds to a
	// running cluster: it starts no cluster of its own and waits to be
	// added. Peers must name every current member (it accepts traffic
	// only from the members it knows) and this one.
	Join bool
	// Raft tunes the Raft node (ticks, elections, message bounds, the
	// log's fsync policy); ID, Peers, Dir and ClusterID are set from the
	// fields above. PreVote and CheckQuorum are always on.
	Raft replication.Config
}

// clusterDir is where a member keeps its Raft log and engine, under the
// data directory.
const clusterDir = "cluster"

// peerBatchBytes bounds one message between members: an append of
// replication.Config.MaxSizePerMsg (1 MiB) of entries plus one engine
// record (up to 2 MiB). A member's gRPC server takes messages this large;
// a client's request is still held to Transport.MaxRequestBytes.
const peerBatchBytes = 4 << 20

// ErrSharedKeysMissing: a cluster member started without the keys every
// member shares.
var ErrSharedKeysMissing = errors.New("server: a cluster member needs the cluster's shared keys in its data directory")

// NotLeaderError is a cluster member's refusal of a call because it does
// not lead: nothing was done. Address is the leader's, if the member
// knows one. It is a storage.ErrNotLeader.
type NotLeaderError struct {
	Node    uint64 // this member
	Leader  uint64 // 0: none known (an election is under way)
	Address string
	cause   error
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return fmt.Sprintf("member %d does not lead the cluster and knows no leader yet; try again shortly", e.Node)
	}
	return fmt.Sprintf("member %d does not lead the cluster; member %d at %s does", e.Node, e.Leader, e.Address)
}

// Is makes a NotLeaderError a storage.ErrNotLeader.
func (e *NotLeaderError) Is(target error) bool { return target == storage.ErrNotLeader }

func (e *NotLeaderError) Unwrap() error { return e.cause }

// member runs a server's cluster member: the replicated engine
// (replication.Silo), the transport to its peers, and the ledger while it
// leads. A member whose engine lost the leadership it held is opened
// again, as a follower that applies the log from its start.
type member struct {
	c         ClusterOptions
	o         Options
	log       *slog.Logger
	tr        *grpcnet.Transport
	openLedge func(storage.Backend) (*ledger.Ledger, error)
	stop      chan struct{}
	done      chan struct{}
	// failed receives the error that stopped the member for good (a log
	// it cannot make durable): the server must stop.
	failed chan error

	mu      sync.Mutex
	started bool
	silo    *replication.Silo
	led     *ledger.Ledger // while it leads and its ledger is open
	leader  uint64
	addrs   map[uint64]string
}

// checkKeys refuses a member without the shared key files: each member
// creating its own would sign proofs with keys the others lack and seal
// clients' secrets with a key no other member can open.
func checkClusterKeys(keyDir string, o Options) error {
	names := []string{"secrets.key", "ledger-ecdsa.pem"}
	if o.ProofScheme.String() == "hmac" {
		names[1] = "ledger-hmac.key"
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(keyDir, n)); err != nil {
			return fmt.Errorf("%w: %s: %v (create them once with `kiroku keys init --data-dir DIR` and copy DIR/keys to every member)",
				ErrSharedKeysMissing, filepath.Join(keyDir, n), err)
		}
	}
	return nil
}

// openMember opens the member's engine and Raft node and its transport;
// run starts it once the server serves.
func openMember(o Options, openLedger func(storage.Backend) (*ledger.Ledger, error)) (*member, error) {
	c := *o.Cluster
	c.Peers = maps.Clone(c.Peers) // the caller's map stays theirs
	if c.ClusterID == "" {
		c.ClusterID = "kiroku"
	}
	if c.NodeID == 0 {
		return nil, fmt.Errorf("%w: a cluster member needs a node id", replication.ErrConfig)
	}
	if _, ok := c.Peers[c.NodeID]; !ok && !c.Join {
		return nil, fmt.Errorf("%w: node %d is not among the peers %v", replication.ErrConfig, c.NodeID, slices.Sorted(maps.Keys(c.Peers)))
	}
	if _, err := os.Stat(filepath.Join(o.DataDir, "engine")); err == nil {
		return nil, fmt.Errorf("%w: %s holds a single server's engine; a cluster member starts from an empty data directory",
			replication.ErrWrongCluster, o.DataDir)
	}
	m := &member{c: c, o: o, log: o.Logger, openLedge: openLedger, stop: make(chan struct{}), done: make(chan struct{}),
		failed: make(chan error, 1), addrs: map[uint64]string{}}
	peers := map[transport.NodeID]string{}
	for id, a := range c.Peers {
		m.addrs[id] = a
		if id != c.NodeID {
			peers[transport.NodeID(id)] = a
		}
	}
	var err error
	m.tr, err = grpcnet.New(grpcnet.Config{NodeID: transport.NodeID(c.NodeID), ClusterID: c.ClusterID, Peers: peers,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond, QueueBytes: 256 << 20,
		BatchBytes: peerBatchBytes - 1024, KeepaliveTime: 10 * time.Second}, memberHandler{m})
	if err != nil {
		return nil, err
	}
	s, err := m.openSilo()
	if err != nil {
		m.tr.Close()
		return nil, err
	}
	m.silo = s
	return m, nil
}

func (m *member) openSilo() (*replication.Silo, error) {
	nc := m.c.Raft
	nc.ID, nc.ClusterID, nc.Dir = m.c.NodeID, m.c.ClusterID, filepath.Join(m.o.DataDir, clusterDir)
	nc.PreVote, nc.CheckQuorum = true, true
	nc.Peers = nil
	if !m.c.Join {
		nc.Peers = slices.Sorted(maps.Keys(m.c.Peers))
	}
	ec := m.o.Engine
	ec.Dir = filepath.Join(nc.Dir, "engine")
	if ec.Logf == nil {
		ec.Logf = func(format string, args ...any) { m.log.Info(fmt.Sprintf(format, args...)) }
	}
	s, err := replication.OpenSilo(replication.SiloConfig{Node: nc, Engine: ec})
	if err != nil {
		return nil, err
	}
	s.Node().SetObserver(memberObserver{s, m})
	s.Node().SetTransport(m.tr)
	return s, nil
}

// memberObserver passes the node's news to its Silo, and keeps the
// leader and the members' addresses for the member.
type memberObserver struct {
	*replication.Silo
	m *member
}

func (o memberObserver) RoleChanged(leader, term uint64) {
	o.m.mu.Lock()
	o.m.leader = leader
	o.m.mu.Unlock()
	o.Silo.RoleChanged(leader, term)
}

func (o memberObserver) MembershipChanged(cc pb.ConfChangeV2) {
	addr := string(cc.Context)
	for _, ch := range cc.Changes {
		switch ch.Type {
		case pb.ConfChangeAddNode, pb.ConfChangeAddLearnerNode:
			if addr == "" || ch.NodeID == o.m.c.NodeID {
				continue
			}
			o.m.mu.Lock()
			o.m.addrs[ch.NodeID] = addr
			o.m.mu.Unlock()
			if err := o.m.tr.AddPeer(transport.NodeID(ch.NodeID), addr); err != nil && !errors.Is(err, transport.ErrClosed) {
				o.m.log.Warn("cluster: adding a peer", "node", ch.NodeID, "addr", addr, "err", err)
			}
		}
	}
}

// run keeps the member going: it opens the ledger when the engine leads,
// and opens the member again when its engine lost its office. It ends
// with stop, or when the node failed (failed is sent the cause).
func (m *member) run() {
	defer close(m.done)
	s := m.silo
	s.Start()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-s.Lost():
			m.mu.Lock()
			m.led, m.silo = nil, nil
			m.mu.Unlock()
			failure := s.Runner().Err()
			cerr := s.Close()
			if failure != nil {
				// The log could not be made durable: fsync errors are
				// fatal, never retried. Nothing more is acknowledged.
				m.log.Error("cluster: the member's Raft log failed; the member stops", "err", failure)
				m.failed <- fmt.Errorf("server: cluster member %d stopped: %w", m.c.NodeID, failure)
				return
			}
			if cerr != nil {
				m.log.Warn("cluster: closing the member", "err", cerr)
			}
			m.log.Info("cluster: the engine lost its leadership or the member stopped leading; applying the log again as a follower")
			for {
				ns, err := m.openSilo()
				if err == nil {
					s = ns
					break
				}
				m.log.Error("cluster: reopening the member", "err", err)
				select {
				case <-m.stop:
					return
				case <-time.After(time.Second):
				}
			}
			m.mu.Lock()
			m.silo = s
			m.mu.Unlock()
			s.Start()
		case <-tick.C:
			m.mu.Lock()
			need := m.led == nil && s.Leading()
			m.mu.Unlock()
			if !need {
				continue
			}
			l, err := m.openLedge(s.DB())
			if err != nil {
				m.log.Warn("cluster: opening the ledger on the new leader", "err", err)
				continue
			}
			m.mu.Lock()
			if m.silo == s {
				m.led = l
			}
			m.mu.Unlock()
			st, _ := s.Runner().Status(context.Background())
			m.log.Info("cluster: this member leads and serves", "node", m.c.NodeID, "term", st.Term, "durable_epoch", s.DB().DurableEpoch())
		}
	}
}

// close stops the member and closes its engine, node and transport.
func (m *member) close() error {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	if started {
		<-m.done
	}
	m.mu.Lock()
	s := m.silo
	m.silo, m.led = nil, nil
	m.mu.Unlock()
	var errs []error
	if s != nil {
		errs = append(errs, s.Close())
	}
	errs = append(errs, m.tr.Close())
	return errors.Join(errs...)
}

// start starts the member's node and its loop (run).
func (m *member) start() {
	m.mu.Lock()
	m.started = true
	m.mu.Unlock()
	go m.run()
}

// ledger is the ledger while the member leads, or a NotLeaderError.
func (m *member) ledger() (*ledger.Ledger, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.led != nil {
		return m.led, nil
	}
	return nil, m.notLeaderLocked(nil)
}

// notLeader wraps cause (a storage.ErrNotLeader of the engine's) with
// the leader the member knows.
func (m *member) notLeader(cause error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.notLeaderLocked(cause)
}

func (m *member) notLeaderLocked(cause error) error {
	e := &NotLeaderError{Node: m.c.NodeID, cause: cause}
	if m.leader != m.c.NodeID {
		e.Leader, e.Address = m.leader, m.addrs[m.leader]
	}
	if e.Address == "" {
		e.Leader = 0
	}
	return e
}

// confirm makes sure the member still leads before a read: a leader cut
// off from its peers may not know yet that another was elected, and
// must not answer from its state. It costs a round of heartbeats (Raft's
// ReadIndex), no log write.
func (m *member) confirm(ctx context.Context) error {
	m.mu.Lock()
	s := m.silo
	m.mu.Unlock()
	if s == nil {
		return m.notLeader(nil)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.Runner().ReadIndex(ctx); err != nil {
		if ctx.Err() != nil {
			return status.Errorf(codes.Unavailable, "member %d could not confirm it leads: %v", m.c.NodeID, err)
		}
		return m.notLeader(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.silo != s || m.led == nil {
		return m.notLeaderLocked(nil)
	}
	return nil
}

// current is the member's Silo, or nil while it is being opened again.
func (m *member) current() *replication.Silo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.silo
}

// memberHandler delivers the peers' traffic to the member's current
// node; while the member is opened again, messages are dropped (Raft
// sends again).
type memberHandler struct{ m *member }

func (h memberHandler) Receive(from transport.NodeID, msgs [][]byte) {
	if s := h.m.current(); s != nil {
		s.Runner().Handler().Receive(from, msgs)
	}
}

var errMemberOpening = errors.New("server: the cluster member is being opened")

func (h memberHandler) Serve(ctx context.Context, from transport.NodeID, req []byte) ([]byte, error) {
	if s := h.m.current(); s != nil {
		return s.Runner().Handler().Serve(ctx, from, req)
	}
	return nil, errMemberOpening
}

func (h memberHandler) ReceiveStream(ctx context.Context, from transport.NodeID, r io.Reader) error {
	if s := h.m.current(); s != nil {
		return s.Runner().Handler().ReceiveStream(ctx, from, r)
	}
	return errMemberOpening
}

// ---- the Cluster service ----------------------------------------------------

// clusterService serves api.Cluster for a member.
type clusterService struct {
	api.UnimplementedClusterServer
	m     *member
	admin func(context.Context) error
}

func roleName(st replication.Status) string {
	switch st.State.String() {
	case "StateLeader":
		return "leader"
	case "StateFollower":
		return "follower"
	case "StateCandidate":
		return "candidate"
	case "StatePreCandidate":
		return "pre-candidate"
	}
	return st.State.String()
}

func (cs *clusterService) Status(ctx context.Context, _ *api.ClusterStatusRequest) (*api.ClusterStatus, error) {
	m := cs.m
	s := m.current()
	if s == nil {
		return nil, status.Error(codes.Unavailable, "the member is being opened again; ask shortly")
	}
	st, err := s.Runner().Status(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "member %d: %v", m.c.NodeID, err)
	}
	m.mu.Lock()
	out := &api.ClusterStatus{ClusterId: m.c.ClusterID, NodeId: m.c.NodeID, Role: roleName(st), Term: st.Term, Leader: st.Leader,
		Commit: st.Commit, Applied: st.Applied, LastIndex: st.LastIx, DurableEpoch: s.DB().DurableEpoch(), Serving: m.led != nil && m.silo == s}
	for _, id := range st.Voters {
		out.Members = append(out.Members, &api.ClusterMember{Id: id, Address: m.addrs[id], Match: st.Match[id]})
	}
	for _, id := range st.Learners {
		out.Members = append(out.Members, &api.ClusterMember{Id: id, Address: m.addrs[id], Learner: true, Match: st.Match[id]})
	}
	m.mu.Unlock()
	return out, nil
}

// leading returns the member's Silo if it leads, else a NOT_LEADER status.
func (cs *clusterService) leading(ctx context.Context) (*replication.Silo, error) {
	if err := cs.admin(ctx); err != nil {
		return nil, err
	}
	if _, err := cs.m.ledger(); err != nil {
		return nil, toStatus(ctx, err)
	}
	s := cs.m.current()
	if s == nil {
		return nil, toStatus(ctx, cs.m.notLeader(nil))
	}
	return s, nil
}

// changeTimeout bounds the wait for a membership change or a transfer.
const changeTimeout = 10 * time.Second

func (cs *clusterService) change(ctx context.Context, cc pb.ConfChange, applied func(replication.Status) bool) (*api.ClusterChangeReply, error) {
	s, err := cs.leading(ctx)
	if err != nil {
		return nil, err
	}
	var perr error
	if err := s.Runner().Do(ctx, func(n *replication.Node) { perr = n.ProposeConfChange(cc) }); err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	if perr != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the change was not proposed: %v", perr)
	}
	deadline := time.Now().Add(changeTimeout)
	for {
		st, err := s.Runner().Status(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "%v", err)
		}
		if applied(st) {
			return &api.ClusterChangeReply{Index: st.Applied}, nil
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.DeadlineExceeded, "the change was not applied within %v (another change may be under way)", changeTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (cs *clusterService) AddNode(ctx context.Context, r *api.AddNodeRequest) (*api.ClusterChangeReply, error) {
	if r.NodeId == 0 || r.Address == "" {
		return nil, status.Error(codes.InvalidArgument, "add-node needs a node id (not 0) and its address")
	}
	typ := pb.ConfChangeAddNode
	if r.Learner {
		typ = pb.ConfChangeAddLearnerNode
	}
	cs.m.mu.Lock()
	known, ok := cs.m.addrs[r.NodeId]
	cs.m.mu.Unlock()
	if ok && known != r.Address {
		return nil, status.Errorf(codes.FailedPrecondition, "node %d is at %s, not %s", r.NodeId, known, r.Address)
	}
	return cs.change(ctx, pb.ConfChange{Type: typ, NodeID: r.NodeId, Context: []byte(r.Address)}, func(st replication.Status) bool {
		if r.Learner {
			return slices.Contains(st.Learners, r.NodeId)
		}
		return slices.Contains(st.Voters, r.NodeId)
	})
}

func (cs *clusterService) RemoveNode(ctx context.Context, r *api.RemoveNodeRequest) (*api.ClusterChangeReply, error) {
	if r.NodeId == 0 {
		return nil, status.Error(codes.InvalidArgument, "remove-node needs a node id (not 0)")
	}
	if r.NodeId == cs.m.c.NodeID {
		return nil, status.Error(codes.FailedPrecondition, "the leader cannot remove itself: transfer the leadership first")
	}
	return cs.change(ctx, pb.ConfChange{Type: pb.ConfChangeRemoveNode, NodeID: r.NodeId}, func(st replication.Status) bool {
		return !slices.Contains(st.Voters, r.NodeId) && !slices.Contains(st.Learners, r.NodeId)
	})
}

func (cs *clusterService) TransferLeader(ctx context.Context, r *api.TransferLeaderRequest) (*api.ClusterChangeReply, error) {
	s, err := cs.leading(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.Runner().Status(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	if !slices.Contains(st.Voters, r.NodeId) {
		return nil, status.Errorf(codes.InvalidArgument, "node %d is not a voting member (voters %v)", r.NodeId, st.Voters)
	}
	if r.NodeId == cs.m.c.NodeID {
		return &api.ClusterChangeReply{Index: st.Applied}, nil
	}
	// The transfer starts only once the member has the leader's whole log,
	// in the same turn of the node's loop that checks it: Raft then asks it
	// to campaign at once. While a transfer waits, Raft drops proposals,
	// and the engine, whose commits it drops, stops leading.
	deadline := time.Now().Add(changeTimeout)
	for started := false; !started; {
		if err := s.Runner().Do(ctx, func(n *replication.Node) {
			st := n.Status()
			if st.Match != nil && st.Match[r.NodeId] == st.LastIx {
				n.TransferLeader(r.NodeId)
				started = true
			}
		}); err != nil {
			return nil, status.Errorf(codes.Unavailable, "%v", err)
		}
		if !started {
			if time.Now().After(deadline) {
				return nil, status.Errorf(codes.DeadlineExceeded, "node %d did not catch up with the leader's log within %v", r.NodeId, changeTimeout)
			}
			select {
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	for time.Now().Before(deadline) {
		cs.m.mu.Lock()
		l := cs.m.leader
		cs.m.mu.Unlock()
		if l == r.NodeId {
			return &api.ClusterChangeReply{Index: st.Applied}, nil
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil, status.Errorf(codes.DeadlineExceeded, "node %d did not take over within %v", r.NodeId, changeTimeout)
}
