package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// CPUClock returns a clock of the CPU time (user plus system) spent so
// far by this process and by the processes pids, for instance a server
// started as a child. CPU time per transaction is the figure that moves
// least when other tenants of a shared machine take its cores: throughput
// falls with them, the work each transaction costs does not.
func CPUClock(pids ...int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0, fmt.Errorf("bench: getrusage: %w", err)
		}
		t := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		for _, pid := range pids {
			c, err := procCPU(pid)
			if err != nil {
				return 0, err
			}
			t += c
		}
		return t, nil
	}
}

// ProcessCPUClock returns a clock of the CPU time spent so far by process
// pid alone, such as a server started as a child.
func ProcessCPUClock(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) { return procCPU(pid) }
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times. Linux fixes
// it at 100 on every architecture Go supports.
const clockTicks = 100

// procCPU reads utime + stime of process pid from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: cpu time of process %d: %w", pid, err)
	}
	return parseProcStat(b)
}

// parseProcStat returns utime + stime (fields 14 and 15) of a
// /proc/PID/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseProcStat(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: /proc stat line without a command name: %.40q", b)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc stat line of %d fields after the command name", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bench: /proc stat time %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// MachineCPU returns the CPU time every process on the machine has spent
// so far, across all its CPUs, and how many CPUs there are: the physical
// limit a run on a shared machine meets. A ledger benchmark whose own
// processes keep 0.9 CPUs busy on a machine kept 1.9 of 2 busy was bound by
// CPU all the same — by another process's, such as a PostgreSQL server's.
func MachineCPU() (time.Duration, int, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: machine cpu time: %w", err)
	}
	return parseMachineStat(b)
}

// parseMachineStat returns the busy time of a /proc/stat: user, nice,
// system, irq and softirq of the line "cpu" (guest time is inside user
// already; idle, iowait and the time the hypervisor stole are not busy),
// and the count of the lines "cpuN".
func parseMachineStat(b []byte) (time.Duration, int, error) {
	var busy time.Duration
	cpus, total := 0, false
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		f := bytes.Fields(line)
		if len(f) == 0 || !bytes.HasPrefix(f[0], []byte("cpu")) {
			continue
		}
		if len(f[0]) > 3 {
			cpus++
			continue
		}
		if len(f) < 8 {
			return 0, 0, fmt.Errorf("bench: /proc/stat cpu line of %d fields", len(f))
		}
		var ticks int64
		for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
			n, err := strconv.ParseInt(string(f[i]), 10, 64)
			if err != nil || n < 0 {
				return 0, 0, fmt.Errorf("bench: /proc/stat cpu time %q", f[i])
			}
			ticks += n
		}
		busy, total = time.Duration(ticks)*time.Second/clockTicks, true
	}
	if !total || cpus == 0 {
		return 0, 0, fmt.Errorf("bench: /proc/stat without the cpu lines")
	}
	return busy, cpus, nil
}
