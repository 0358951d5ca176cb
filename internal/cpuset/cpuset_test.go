package cpuset

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "1-3": {1, 2, 3}, "0,2-3": {0, 2, 3}, "3,3,1": {3, 1}} {
		got, err := Parse(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := Parse(Format(got)); err != nil || !slices.Equal(back, got) {
			t.Errorf("Parse(Format(%v)) = %v, %v", got, back, err)
		}
	}
	for _, bad := range []string{"", "a", "-1", "3-1", "1,", "1-"} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, got)
		}
	}
}

// TestPinReachesEveryThread pins the test process to one CPU while
// goroutines keep threads busy, and checks that every thread's mask and
// GOMAXPROCS follow; it then restores the original mask.
func TestPinReachesEveryThread(t *testing.T) {
	orig, err := Allowed()
	if err != nil {
		t.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	defer func() {
		if err := Pin(orig); err != nil {
			t.Error(err)
		}
		runtime.GOMAXPROCS(procs)
	}()
	// Threads blocked in syscalls force the runtime to start more.
	var wg, started sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started.Done()
			<-stop
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	started.Wait()
	target := []int{orig[len(orig)-1]}
	if err := Pin(target); err != nil {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS = %d after pinning to one CPU", got)
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) < 8 {
		t.Fatalf("only %d threads: the test did not exercise several", len(ents))
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			continue // exited
		}
		if set.Count() != 1 || !set.IsSet(target[0]) {
			t.Errorf("thread %d may run on %d CPUs, want only CPU %d", tid, set.Count(), target[0])
		}
	}
	if got, _ := Allowed(); !slices.Equal(got, target) {
		t.Errorf("Allowed() = %v after Pin(%v)", got, target)
	}
}
