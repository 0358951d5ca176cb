// Command kiroku is the single binary of kiroku: server, client commands,
// validation and benchmarks. Run `kiroku help` for the list.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at release time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// gcPercent is the collector's target when GOGC is not set. The embedded
// engine keeps every row in the heap, so each collection marks all of it;
// collecting at 5× the live heap instead of 2× cuts that work by four for
// memory the engine's users have to provision anyway.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	// Ctrl-C or SIGTERM cancels the command's context: servers stop
	// gracefully, benchmarks and the demo clean up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:          "kiroku",
		Short:        "kiroku: a tamper-evident, replicated, geo-distributed transactional database",
		SilenceUsage: true,
	}
	root.AddCommand(versionCmd(), benchCmd(), serverCmd(), demoCmd(), validateCmd())
	root.AddCommand(clientCmds()...)
	return root
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			rev := ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						rev = " " + s.Value
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "kiroku %s%s (%s %s/%s)\n", version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		},
	}
}
