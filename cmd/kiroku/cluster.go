package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/replication"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/wal"
	"github.com/kiroku-db/kiroku/wire"
)

// clusterFlags are the server's cluster flags.
type clusterFlags struct {
	nodeID    uint64
	peers     string
	clusterID string
	join      bool
	sync      string
	tick      time.Duration
}

func (c *clusterFlags) add(f *pflag.FlagSet) {
	f.Uint64Var(&c.nodeID, "node-id", 0, "this member's id in a cluster (with --peers)")
	f.StringVar(&c.peers, "peers", "", "the cluster's members: ID=HOST:PORT,... (each member serves clients and peers there)")
	f.StringVar(&c.clusterID, "cluster-id", "kiroku", "the cluster's name; a member refuses another cluster's directory and traffic")
	f.BoolVar(&c.join, "join", false, "join a running cluster (it is added with 'kiroku cluster add-node') instead of starting one")
	f.StringVar(&c.sync, "raft-sync", "batch", "when a member makes its Raft log durable: batch (one fsync for what is pending when the last ends), count:N (one fsync per N entries, or 2 ms), "+
		"count:N:WAIT, or group:WINDOW; acknowledgements wait for the fsync under each")
	f.DurationVar(&c.tick, "raft-tick", 100*time.Millisecond, "one Raft tick; elections follow 10 to 20 ticks without a leader")
}

// options returns the cluster options the flags ask for, or nil.
func (c *clusterFlags) options() (*server.ClusterOptions, error) {
	if c.nodeID == 0 && c.peers == "" {
		if c.join {
			return nil, errors.New("--join needs --node-id and --peers")
		}
		return nil, nil
	}
	if c.nodeID == 0 || c.peers == "" {
		return nil, errors.New("a cluster member needs both --node-id and --peers")
	}
	peers, err := parsePeers(c.peers)
	if err != nil {
		return nil, fmt.Errorf("--peers: %w", err)
	}
	pol, err := parseRaftSync(c.sync)
	if err != nil {
		return nil, fmt.Errorf("--raft-sync: %w", err)
	}
	return &server.ClusterOptions{NodeID: c.nodeID, Peers: peers, ClusterID: c.clusterID, Join: c.join,
		Raft: replication.Config{Sync: pol, TickInterval: c.tick}}, nil
}

// parsePeers reads ID=HOST:PORT,...
func parsePeers(s string) (map[uint64]string, error) {
	out := map[uint64]string{}
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		n, err := strconv.ParseUint(id, 10, 64)
		if !ok || err != nil || n == 0 || addr == "" {
			return nil, fmt.Errorf("%q is not ID=HOST:PORT with an id above 0", p)
		}
		if _, dup := out[n]; dup {
			return nil, fmt.Errorf("member %d is listed twice", n)
		}
		for id, a := range out {
			if a == addr {
				return nil, fmt.Errorf("members %d and %d share the address %s", id, n, addr)
			}
		}
		out[n] = addr
	}
	return out, nil
}

// parseRaftSync reads a Raft log fsync policy: batch, count:N[:WAIT] or
// group:WINDOW.
func parseRaftSync(s string) (wal.Policy, error) {
	kind, rest, _ := strings.Cut(s, ":")
	switch kind {
	case "batch":
		if rest == "" {
			return wal.BatchPolicy(), nil
		}
	case "count":
		nStr, waitStr, hasWait := strings.Cut(rest, ":")
		n, err := strconv.Atoi(nStr)
		if err != nil || n < 1 {
			return wal.Policy{}, fmt.Errorf("%q: count:N needs N ≥ 1", s)
		}
		wait := 2 * time.Millisecond
		if hasWait {
			if wait, err = time.ParseDuration(waitStr); err != nil || wait <= 0 {
				return wal.Policy{}, fmt.Errorf("%q: the wait is not a positive duration", s)
			}
		}
		return wal.CountPolicy(n, wait), nil
	case "group":
		d, err := time.ParseDuration(rest)
		if err != nil || d <= 0 {
			return wal.Policy{}, fmt.Errorf("%q: group:WINDOW needs a positive duration", s)
		}
		return wal.GroupPolicy(d), nil
	}
	return wal.Policy{}, fmt.Errorf("%q is not batch, count:N[:WAIT] or group:WINDOW", s)
}

func keysCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage a server's keys"}
	var dir, scheme string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create the ledger's proof key and the secrets key in DATA-DIR/keys",
		Long: `Creates, in --data-dir/keys, the ledger's proof key and the key that seals clients' HMAC
secrets at rest, as a server does on its first start. The members of a cluster share them: create
them once and copy the keys directory into each member's data directory before its first start.
Existing keys are kept.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sch, err := auth.ParseScheme(scheme)
			if err != nil {
				return fmt.Errorf("--proof-scheme: %w", err)
			}
			fp, err := server.InitKeys(dir, sch)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "keys in %s/keys (proof key %s)\n", dir, fp)
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "data-dir", "kiroku-data", "the data directory whose keys directory to fill")
	initCmd.Flags().StringVar(&scheme, "proof-scheme", "ecdsa", "how the ledger signs proofs: ecdsa or hmac")
	cmd.AddCommand(initCmd, keysAuditorCmd())
	return cmd
}

// clusterConn dials the members named on the command line.
type clusterConn struct {
	servers   string
	tokenFile string
	asJSON    bool
	timeout   time.Duration
}

func (cc *clusterConn) add(cmd *cobra.Command, admin bool) {
	f := cmd.Flags()
	f.StringVar(&cc.servers, "servers", os.Getenv("KIROKU_SERVER"), "members to ask: HOST:PORT,... (default: KIROKU_SERVER)")
	f.BoolVar(&cc.asJSON, "json", false, "print JSON")
	f.DurationVar(&cc.timeout, "timeout", 15*time.Second, "give up after this long")
	if admin {
		f.StringVar(&cc.tokenFile, "admin-token-file", "", "file holding the administrator token (default: KIROKU_ADMIN_TOKEN)")
	}
}

func (cc *clusterConn) list() ([]string, error) {
	var out []string
	for _, a := range strings.Split(cc.servers, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("name the members to ask with --servers HOST:PORT,... or KIROKU_SERVER")
	}
	return out, nil
}

func dialCluster(addr string) (*grpc.ClientConn, api.ClusterClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, api.NewClusterClient(conn), nil
}

// nodeView is one member's answer, or why it gave none.
type nodeView struct {
	Address string             `json:"address"`
	Status  *api.ClusterStatus `json:"status,omitempty"`
	Error   string             `json:"error,omitempty"`
	Lag     *uint64            `json:"lag,omitempty"` // the leader's last index less what it knows the member has
}

func clusterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "See and change a cluster of ledger servers"}
	var st clusterConn
	status := &cobra.Command{
		Use:   "status",
		Short: "Each member's role, term, commit and applied index, durable epoch and lag",
		Long: `Asks every member named with --servers, and every member they list, for its view: its role,
term, the leader it knows, its Raft commit and applied index, its engine's durable epoch, and its
lag as the leader sees it (entries of the leader's log not yet known to be in the member's).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addrs, err := st.list()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), st.timeout)
			defer cancel()
			views := clusterViews(ctx, addrs)
			if st.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(views)
			}
			printViews(cmd.OutOrStdout(), views)
			return nil
		},
	}
	st.add(status, false)

	change := func(use, short string, nargs int, do func(ctx context.Context, c api.ClusterClient, args []string) (*api.ClusterChangeReply, error)) *cobra.Command {
		var cc clusterConn
		c := &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(nargs),
			RunE: func(cmd *cobra.Command, args []string) error {
				addrs, err := cc.list()
				if err != nil {
					return err
				}
				tok := os.Getenv("KIROKU_ADMIN_TOKEN")
				if cc.tokenFile != "" {
					b, err := os.ReadFile(cc.tokenFile)
					if err != nil {
						return err
					}
					tok = strings.TrimSpace(string(b))
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), cc.timeout)
				defer cancel()
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
				r, addr, err := onLeader(ctx, addrs, func(ctx context.Context, c api.ClusterClient, o ...grpc.CallOption) (*api.ClusterChangeReply, error) {
					return do(ctx, c, args)
				})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "done by the leader at %s (Raft index %d)\n", addr, r.Index)
				return nil
			}}
		cc.add(c, true)
		return c
	}
	var learner bool
	add := change("add-node ID HOST:PORT", "Add a member (start it first with --join)", 2,
		func(ctx context.Context, c api.ClusterClient, args []string) (*api.ClusterChangeReply, error) {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("node id %q: %w", args[0], err)
			}
			return c.AddNode(ctx, &api.AddNodeRequest{NodeId: id, Address: args[1], Learner: learner})
		})
	add.Flags().BoolVar(&learner, "learner", false, "add it as a learner, which receives the log but does not vote; add it again without --learner to promote it")
	remove := change("remove-node ID", "Remove a member", 1,
		func(ctx context.Context, c api.ClusterClient, args []string) (*api.ClusterChangeReply, error) {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("node id %q: %w", args[0], err)
			}
			return c.RemoveNode(ctx, &api.RemoveNodeRequest{NodeId: id})
		})
	transfer := change("transfer-leader ID", "Hand the leadership to member ID", 1,
		func(ctx context.Context, c api.ClusterClient, args []string) (*api.ClusterChangeReply, error) {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("node id %q: %w", args[0], err)
			}
			return c.TransferLeader(ctx, &api.TransferLeaderRequest{NodeId: id})
		})
	cmd.AddCommand(status, add, remove, transfer)
	return cmd
}

// onLeader runs f on the member that leads: it asks the members in turn
// and follows a member's word of where the leader is, until ctx ends.
func onLeader[T any](ctx context.Context, addrs []string, f func(ctx context.Context, c api.ClusterClient, o ...grpc.CallOption) (T, error)) (T, string, error) {
	var zero T
	var lastErr error
	next := 0
	addr := addrs[0]
	for {
		conn, c, err := dialCluster(addr)
		if err != nil {
			return zero, addr, err
		}
		var trailer metadata.MD
		out, err := f(ctx, c, grpc.Trailer(&trailer))
		conn.Close()
		if err == nil {
			return out, addr, nil
		}
		lastErr = err
		if !slices.Contains(trailer.Get(wire.ErrorKindKey), wire.KindNotLeader) && !isUnavailable(err) {
			return zero, addr, err
		}
		if l := trailer.Get(wire.LeaderKey); len(l) > 0 && l[0] != addr {
			addr = l[0]
			continue
		}
		next = (next + 1) % len(addrs)
		addr = addrs[next]
		select {
		case <-ctx.Done():
			return zero, addr, fmt.Errorf("no leader answered: %w", lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// clusterViews asks each member, and those their answers list, for its
// status.
func clusterViews(ctx context.Context, addrs []string) []nodeView {
	var views []nodeView
	seen := map[string]bool{}
	for i := 0; i < len(addrs); i++ {
		a := addrs[i]
		if seen[a] {
			continue
		}
		seen[a] = true
		v := nodeView{Address: a}
		conn, c, err := dialCluster(a)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			v.Status, err = c.Status(actx, &api.ClusterStatusRequest{})
			cancel()
			conn.Close()
		}
		if err != nil {
			v.Error = err.Error()
		} else {
			for _, m := range v.Status.Members {
				if m.Address != "" && !seen[m.Address] {
					addrs = append(addrs, m.Address)
				}
			}
		}
		views = append(views, v)
	}
	setLag(views)
	slices.SortFunc(views, func(a, b nodeView) int {
		switch {
		case a.Status == nil && b.Status == nil:
			return strings.Compare(a.Address, b.Address)
		case a.Status == nil:
			return 1
		case b.Status == nil:
			return -1
		}
		return int(a.Status.NodeId) - int(b.Status.NodeId)
	})
	return views
}

// setLag fills in each member's lag as the leader of the highest term
// sees it: the entries of its log not yet known to be in the member's.
func setLag(views []nodeView) {
	var lead *api.ClusterStatus
	for _, v := range views {
		if s := v.Status; s != nil && s.Role == "leader" && (lead == nil || s.Term > lead.Term) {
			lead = s
		}
	}
	if lead == nil {
		return
	}
	for i, v := range views {
		if v.Status == nil {
			continue
		}
		for _, m := range lead.Members {
			if m.Id == v.Status.NodeId {
				lag := lead.LastIndex - min(m.Match, lead.LastIndex)
				if m.Id == lead.NodeId {
					lag = 0
				}
				views[i].Lag = &lag
			}
		}
	}
}

func printViews(w io.Writer, views []nodeView) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "node\taddress\trole\tterm\tleader\tcommit\tapplied\tdurable epoch\tlag\tserving\t")
	for _, v := range views {
		s := v.Status
		if s == nil {
			fmt.Fprintf(tw, "?\t%s\tunreachable: %s\t\t\t\t\t\t\t\t\n", v.Address, firstLine(v.Error))
			continue
		}
		lag := "-"
		if v.Lag != nil {
			lag = strconv.FormatUint(*v.Lag, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%v\t\n", s.NodeId, v.Address, s.Role, s.Term, s.Leader, s.Commit, s.Applied,
			s.DurableEpoch, lag, s.Serving)
	}
	tw.Flush()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func isUnavailable(err error) bool {
	return grpcstatus.Code(err) == codes.Unavailable
}
