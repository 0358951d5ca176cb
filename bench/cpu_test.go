package bench

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may choose.
	line := []byte("4242 (a) b (c) R 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 3 0 12 0 0\n")
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2870 * time.Millisecond; got != want {
		t.Fatalf("utime+stime = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 cmd R 1", "4242 (cmd) R 1 2 3", "4242 (cmd) R 1 4242 4242 0 -1 4194560 100 0 0 0 x 37 0"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) passed", bad)
		}
	}
}

func TestCPUClockCountsWork(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	clock := CPUClock(os.Getpid()) // this process twice: once by rusage, once by /proc
	t0, err := clock()
	if err != nil {
		t.Fatal(err)
	}
	// Spin until rusage alone counts 100 ms; /proc, counting the same
	// process again, must then agree to within its 10 ms ticks.
	self := CPUClock()
	s0, err := self()
	if err != nil {
		t.Fatal(err)
	}
	x := uint64(1)
	for deadline := time.Now().Add(10 * time.Second); ; {
		for range 100000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		s1, err := self()
		if err != nil {
			t.Fatal(err)
		}
		if s1-s0 >= 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning counted as %v of CPU (x=%d)", s1-s0, x)
		}
	}
	t1, err := clock()
	if err != nil {
		t.Fatal(err)
	}
	if d := t1 - t0; d < 180*time.Millisecond {
		t.Fatalf("100 ms of spinning, counted twice, came to %v", d)
	}
	if _, err := CPUClock(1 << 30)(); err == nil {
		t.Fatal("a process that does not exist has a CPU time")
	}
}

func TestParseMachineStat(t *testing.T) {
	stat := []byte("cpu  100 5 40 900 30 2 3 50 7 0\ncpu0 50 5 20 450 15 1 2 25 7 0\ncpu1 50 0 20 450 15 1 1 25 0 0\nintr 12345\nctxt 999\n")
	busy, cpus, err := parseMachineStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	// user + nice + system + irq + softirq; idle, iowait, steal and
	// guest (inside user) not again.
	if want := 1500 * time.Millisecond; busy != want || cpus != 2 {
		t.Fatalf("busy %v of %d CPUs, want %v of 2", busy, cpus, want)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu  1 2 3\ncpu0 1 2 3\n", "cpu  1 2 3 4 5 x 7 8\ncpu0 1\n", "cpu  1 2 3 4 5 6 7 8\n"} {
		if _, _, err := parseMachineStat([]byte(bad)); err == nil {
			t.Errorf("parseMachineStat(%q) passed", bad)
		}
	}
	if _, err := os.Stat("/proc/stat"); err != nil {
		return
	}
	if _, cpus, err := MachineCPU(); err != nil || cpus < 1 {
		t.Fatalf("MachineCPU: %d CPUs, %v", cpus, err)
	}
}
