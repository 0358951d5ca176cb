// Package cpuset pins the whole process to a set of CPUs, so a benchmark
// can give the ledger server and its clients cores of their own, as they
// would have on separate machines.
//
// sched_setaffinity applies to one thread, so Pin sets every thread the
// process has (listed in /proc/self/task) and repeats until a pass finds
// none it has not set: a thread created meanwhile inherits the mask of the
// thread that created it, which is set or is found by the next pass. It
// then sizes GOMAXPROCS to the set, which the Go runtime reads only at
// start-up. Linux only, like the rest of kiroku's tooling.
package cpuset

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Allowed returns the CPUs this process may run on, in ascending order.
func Allowed() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("cpuset: reading the affinity mask: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// Pin restricts every thread of the process to cpus and sets GOMAXPROCS
// to their number.
func Pin(cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("cpuset: no CPUs to pin to")
	}
	var set unix.CPUSet
	for _, c := range cpus {
		if c < 0 || c >= len(set)*64 {
			return fmt.Errorf("cpuset: CPU %d out of range", c)
		}
		set.Set(c)
	}
	done := make(map[int]bool)
	for {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("cpuset: listing threads: %w", err)
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cpuset: pinning thread %d to CPUs %s: %w", tid, Format(cpus), err)
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			break
		}
	}
	runtime.GOMAXPROCS(len(cpus))
	return nil
}

// Parse reads a CPU list such as "0", "1-3" or "0,2-3".
func Parse(s string) ([]int, error) {
	var cpus []int
	seen := make(map[int]bool)
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a {
			return nil, fmt.Errorf("cpuset: %q is not a CPU list such as 0,2-3", s)
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				cpus = append(cpus, c)
			}
		}
	}
	return cpus, nil
}

// Format writes cpus as a comma-separated list that Parse reads back.
func Format(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}
