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
	"strconv"
	"strings"
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

// memoryShare is the part of the machine's memory (or of the cgroup's
// limit, if lower) that the heap may grow to before the collector runs
// regardless of gcPercent, when GOMEMLIMIT is not set. Without it a 1M-asset
// engine (about 6 GB live) would let its heap reach 5× that and be killed
// for lack of memory long before it ran out of data.
const memoryShare = 0.75

// extraProcs is how many Go processors kiroku runs beyond the CPUs it may
// use, when GOMAXPROCS is not set. A goroutine in a blocking system call
// keeps its processor until the runtime's monitor takes it back, which it
// does on its next tick, up to 10 ms later when it has been idle. The
// engine's logger writes and fsyncs about 150 times a second under load;
// on two CPUs each call held half the processors, and the write-only
// benchmark kept 1.8 CPUs busy instead of 1.9, about a tenth less
// throughput than with one processor more. The extra
// processor is idle while nothing blocks, so it costs nothing then.
// Setting GOMAXPROCS stops the runtime from following later changes of the
// CPU limit; kiroku takes the limit at start.
const extraProcs = 1

func main() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + extraProcs)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		if total := memoryAvailable(); total > 0 {
			debug.SetMemoryLimit(int64(float64(total) * memoryShare))
		}
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
		Short:        "kiroku: a tamper-evident transactional database and ledger",
		SilenceUsage: true,
	}
	root.AddCommand(versionCmd(), benchCmd(), serverCmd(), auditorCmd(), demoCmd(), validateCmd(), keysCmd(), clusterCmd())
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

// memoryAvailable returns the machine's physical memory, or the cgroup v2
// memory limit of this process if that is lower; 0 if neither is known.
func memoryAvailable() uint64 {
	var si syscall.Sysinfo_t
	var total uint64
	if syscall.Sysinfo(&si) == nil {
		total = uint64(si.Totalram) * uint64(si.Unit)
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && (total == 0 || n < total) {
			total = n // "max" (no limit) does not parse
		}
	}
	return total
}
