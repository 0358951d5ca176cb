package replication

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

// identityFile, in a node's Dir, names the cluster and the member the
// directory belongs to, and the peers the cluster started with.
const identityFile = "MEMBER"

// identity is identityFile's content.
type identity struct {
	Cluster string   `json:"cluster"`
	Node    uint64   `json:"node"`
	Peers   []uint64 `json:"initial_peers"`
}

// Errors of a directory that is not this node's.
var (
	// ErrWrongCluster: the directory belongs to another cluster, or to
	// another member of this one.
	ErrWrongCluster = errors.New("replication: the data directory belongs to another cluster or member")
	// ErrPeersMismatch: the node was started with initial peers that
	// disagree with those its cluster started with.
	ErrPeersMismatch = errors.New("replication: the peer list disagrees with the cluster's")
)

// checkIdentity writes the directory's identity on first use, and checks
// it afterwards: a directory copied from another member or cluster, or a
// node started with other initial peers, is refused before anything is
// read from its log.
func checkIdentity(fs vfs.FS, dir string, cfg *Config) error {
	want := identity{Cluster: cfg.ClusterID, Node: cfg.ID, Peers: slices.Sorted(slices.Values(cfg.Peers))}
	path := fs.PathJoin(dir, identityFile)
	f, err := fs.Open(path)
	switch {
	case err == nil:
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 1<<20))
		if err != nil {
			return fmt.Errorf("replication: reading %s: %w", path, err)
		}
		var got identity
		if err := json.Unmarshal(b, &got); err != nil {
			return fmt.Errorf("%w: %s does not decode: %v", ErrWrongCluster, path, err)
		}
		if got.Cluster != want.Cluster || got.Node != want.Node {
			return fmt.Errorf("%w: %s is member %d of cluster %q; this is member %d of cluster %q",
				ErrWrongCluster, dir, got.Node, got.Cluster, want.Node, want.Cluster)
		}
		if len(cfg.Peers) > 0 && !slices.Equal(got.Peers, want.Peers) {
			return fmt.Errorf("%w: started with peers %v; the cluster started with %v", ErrPeersMismatch, want.Peers, got.Peers)
		}
		return nil
	case !oserror.IsNotExist(err):
		return fmt.Errorf("replication: %w", err)
	}
	// A directory with a log but no identity is not one this code made.
	if names, _ := fs.List(fs.PathJoin(dir, "raft")); len(names) > 0 {
		return fmt.Errorf("%w: %s holds a raft log but no %s", ErrWrongCluster, dir, identityFile)
	}
	b, err := json.Marshal(want)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	w, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	if _, err := io.Copy(w, bytes.NewReader(append(b, '\n'))); err != nil {
		w.Close()
		return fmt.Errorf("replication: %w", err)
	}
	if err := w.Sync(); err != nil {
		w.Close()
		return fmt.Errorf("replication: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	return vfsutil.SyncDir(fs, dir)
}
