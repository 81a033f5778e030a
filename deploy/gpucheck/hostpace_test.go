package gpucheck

import (
	"math"
	"strings"
	"testing"
	"time"
)

// parseHostPace pools each role's intervals by their work over their
// length, not by the mean of their paces, and refuses output that lacks a
// role or carries a line it cannot read.
func TestParseHostPacePoolsEachRole(t *testing.T) {
	out := strings.Join([]string{
		"interval 0 small sleep 100 10.000",
		"interval 1 large sleep 300 20.000",
		"interval 2 small spin 150 10.000",
		"interval 3 large spin 300 20.000",
		"interval 4 small sleep 300 10.000",
		"interval 5 large sleep 500 20.000",
		"interval 6 small spin 150 10.000",
		"interval 7 large spin 300 20.000",
		"interval 8 continuous sleep 800 40.000",
		"a line of something else",
	}, "\n")
	hp, err := parseHostPace([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{"small sleep": 20, "large sleep": 20, "small spin": 15, "large spin": 15, "continuous sleep": 20} {
		if got := hp.pooled[key]; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: pooled %v, want %v", key, got, want)
		}
	}
	// neighbours pair: 15/10, then 25/30
	if got := hp.largeOverSmall("sleep"); len(got) != 2 || math.Abs(got[0]-1.5) > 1e-9 || math.Abs(got[1]-25.0/30) > 1e-9 {
		t.Errorf("sleeping pairs: %v, want [1.5 0.833]", got)
	}
	if got := hp.largeOverSmall("spin"); len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Errorf("spinning pairs: %v, want [1 1]", got)
	}
	for name, bad := range map[string]string{
		"no continuous run": strings.SplitN(out, "\ninterval 8", 2)[0],
		"a bad figure":      strings.Replace(out, "300 20.000", "300 x", 1),
		"no time":           strings.Replace(out, "100 10.000", "100 0", 1),
	} {
		if _, err := parseHostPace([]byte(bad)); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

// --rows picks part 4's rows by words of their names; none picks all.
func TestRowAskedByWordsOfItsName(t *testing.T) {
	for _, c := range []struct {
		words []string
		name  string
		want  bool
	}{
		{nil, "weighted_1to2_batch64", true},
		{[]string{"batch64"}, "weighted_1to2_batch64", true},
		{[]string{"batch64"}, "fixed_30_70_batch64", true},
		{[]string{"batch64"}, "weighted_1to2_batch128", false},
		{[]string{"host_pace", "batch128"}, "host_pace", true},
		{[]string{"host_pace", "batch128"}, "weighted_1to2_batch16", false},
	} {
		if got := rowAsked(c.words, c.name); got != c.want {
			t.Errorf("rowAsked(%q, %q) = %v, want %v", c.words, c.name, got, c.want)
		}
	}
}

// The host row's intervals hold two rounds of slices at any slice the agent
// takes (10ms-1s), in a multiple of four intervals of at least eight.
func TestHostTimingFitsTheSlice(t *testing.T) {
	for _, sim := range []bool{false, true} {
		e := &env{o: Options{Simulate: sim}}
		for _, slice := range []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond, time.Second} {
			tm := e.hostTiming(slice)
			if tm.interval < 6*slice || tm.intervals < 8 || tm.intervals%4 != 0 {
				t.Errorf("simulate %v, slice %s: %d intervals of %s", sim, slice, tm.intervals, tm.interval)
			}
			if total := time.Duration(tm.intervals) * tm.interval; total > time.Minute {
				t.Errorf("simulate %v, slice %s: %s on the roles, want a minute at most", sim, slice, total)
			}
		}
	}
}
