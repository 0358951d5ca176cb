package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/internal/proccluster"
	"github.com/kiroku-db/kiroku/ledger"
)

// runClusterDemo starts three `kiroku server` processes on loopback,
// runs the inspection contract through them, kills the leader with
// SIGKILL, shows a new leader serving every acknowledged inspection, and
// brings the old member back to catch up.
func runClusterDemo(ctx context.Context, w io.Writer, dataDir string) error {
	step := func(format string, a ...any) { fmt.Fprintf(w, "\n== "+format+"\n", a...) }
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	admin := hex.EncodeToString(token)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	c, err := proccluster.Start(sctx, proccluster.Config{Exe: exe, Nodes: 3, Dir: dataDir, AdminToken: admin})
	if err != nil {
		return err
	}
	defer c.Close()
	step("Started three `kiroku server` processes, one cluster (data and logs in %s)", dataDir)
	lead, err := c.Leader(sctx)
	if err != nil {
		return err
	}
	printClusterStatus(ctx, w, c)

	keyPEM, certPEM, err := auth.GenerateIdentity("inspector-1", time.Now().Add(-time.Minute), time.Now().AddDate(1, 0, 0))
	if err != nil {
		return err
	}
	cl, err := client.Dial(client.Config{Server: c.Servers(), Entity: "inspector-1", PrivateKeyPEM: keyPEM,
		CertificatePEM: certPEM, AdminToken: admin})
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.RegisterCertificate(ctx); err != nil {
		return err
	}
	if err := cl.RegisterContract(ctx, "inspection", []byte(demoContract)); err != nil {
		return err
	}
	step("Registered inspector-1 and the inspection contract through member %d, the leader", lead)

	inspect := func(a string) (*ledger.Result, error) {
		res, err := cl.Execute(ctx, "inspection", []byte(a))
		if err == nil {
			fmt.Fprintf(w, "%s\n  → %s (acknowledged by %s)\n", a, res.Result, cl.Server())
		}
		return res, err
	}
	step("Inspections, each acknowledged once a majority of the members has it on disk:")
	acked := 0
	for _, a := range []string{
		`{"equipment":"boiler-7","inspector":"sato","result":"pass","notes":"pressure 1.2 MPa"}`,
		`{"equipment":"boiler-7","inspector":"tanaka","result":"fail","notes":"valve leak"}`,
		`{"equipment":"boiler-7","inspector":"sato","result":"pass","notes":"valve replaced"}`,
	} {
		if _, err := inspect(a); err != nil {
			return err
		}
		acked++
	}

	step("kill -9 member %d, the leader", lead)
	killed := time.Now()
	if err := c.Kill(lead); err != nil {
		return err
	}
	if _, err := inspect(`{"equipment":"boiler-7","inspector":"suzuki","result":"pass","notes":"after the failover"}`); err != nil {
		return err
	}
	acked++
	newLead, err := c.Leader(sctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "member %d took over; the first inspection after the kill was acknowledged %v after it\n",
		newLead, time.Since(killed).Round(time.Millisecond))

	step("Every acknowledged inspection is on the new leader:")
	vs, err := cl.History(ctx, "boiler-7", ledger.ScanRange{End: -1, Ascending: true})
	if err != nil {
		return err
	}
	for _, v := range vs {
		fmt.Fprintf(w, "boiler-7@%d  %s\n", v.Age, v.Output)
	}
	if len(vs) != acked {
		return fmt.Errorf("demo: %d versions of boiler-7 after the failover, %d acknowledged", len(vs), acked)
	}
	v, err := cl.ValidateLedger(ctx, "boiler-7", 0, -1)
	if err != nil {
		return err
	}
	if !v.Ok {
		return fmt.Errorf("demo: validation failed after the failover: %s", (&validationFailed{v}).Error())
	}
	printValidation(w, v)

	step("Restarting member %d: it applies the log it missed", lead)
	if err := c.Start(lead); err != nil {
		return err
	}
	if err := c.WaitUp(sctx, lead); err != nil {
		return err
	}
	target, err := c.Status(ctx, newLead)
	if err != nil {
		return err
	}
	for {
		st, err := c.Status(ctx, lead)
		if err == nil && st.Applied >= target.Commit {
			break
		}
		select {
		case <-sctx.Done():
			return fmt.Errorf("demo: member %d did not catch up: %w", lead, sctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	printClusterStatus(ctx, w, c)

	step("Handing the leadership back to member %d and reading there", lead)
	if err := c.TransferLeader(sctx, lead); err != nil {
		return err
	}
	vs, err = cl.History(ctx, "boiler-7", ledger.ScanRange{End: -1, Ascending: true})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "member %d (%s) serves boiler-7 with its %d versions\n", lead, cl.Server(), len(vs))
	if len(vs) != acked {
		return fmt.Errorf("demo: the restarted member has %d versions of boiler-7, %d acknowledged", len(vs), acked)
	}
	return nil
}

func printClusterStatus(ctx context.Context, w io.Writer, c *proccluster.Cluster) {
	var views []nodeView
	for _, id := range c.IDs() {
		v := nodeView{Address: c.Addr(id)}
		st, err := c.Status(ctx, id)
		if err != nil {
			v.Error = err.Error()
		} else {
			v.Status = st
		}
		views = append(views, v)
	}
	setLag(views)
	printViews(w, views)
}
