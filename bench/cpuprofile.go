package bench

import (
	"bytes"
	"fmt"
	"runtime/pprof"

	"github.com/google/pprof/profile"
)

// labelProfile takes a CPU profile of the process and splits its samples
// by the value of one profiler label: how the CPU time of goroutines
// started under each value (pprof.Do) divides. Samples of goroutines
// without the label go under "".
type labelProfile struct {
	label string
	buf   bytes.Buffer
}

// startLabelProfile starts the process's CPU profile. Only one runs at a
// time in a process.
func startLabelProfile(label string) (*labelProfile, error) {
	p := &labelProfile{label: label}
	if err := pprof.StartCPUProfile(&p.buf); err != nil {
		return nil, fmt.Errorf("bench: CPU profile: %w", err)
	}
	return p, nil
}

// stop ends the profile and returns the CPU seconds sampled under each
// value of the label.
func (p *labelProfile) stop() (map[string]float64, error) {
	pprof.StopCPUProfile()
	prof, err := profile.Parse(&p.buf)
	if err != nil {
		return nil, fmt.Errorf("bench: reading the CPU profile: %w", err)
	}
	cpu := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			cpu = i
		}
	}
	if cpu < 0 {
		return nil, fmt.Errorf("bench: the CPU profile has no cpu/nanoseconds samples")
	}
	out := map[string]float64{}
	for _, s := range prof.Sample {
		v := ""
		if vs := s.Label[p.label]; len(vs) > 0 {
			v = vs[0]
		}
		out[v] += float64(s.Value[cpu]) / 1e9
	}
	return out, nil
}
