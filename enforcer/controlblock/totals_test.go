package controlblock

import "testing"

func TestProcTotals(t *testing.T) {
	var tot ProcTotals
	a := ProcUsage{Slot: 0, Pid: 10, StartTime: 1, Launches: 5, ThrottledNs: 100}
	b := ProcUsage{Slot: 1, Pid: 11, StartTime: 2, Launches: 3}
	tot.Update([]ProcUsage{a, b})
	if tot.Launches != 8 || tot.ThrottledNs != 100 {
		t.Fatalf("after the first read: %+v", tot)
	}
	a.Launches, a.ThrottledNs = 9, 150
	tot.Update([]ProcUsage{a}) // b exited: its 3 stay
	if tot.Launches != 12 || tot.ThrottledNs != 150 {
		t.Fatalf("after b exited: %+v", tot)
	}
	a.Launches = 2 // garbage: a slot never goes back
	tot.Update([]ProcUsage{a})
	if tot.Launches != 12 {
		t.Fatalf("a lower value changed the total: %+v", tot)
	}
	c := ProcUsage{Slot: 1, Pid: 12, StartTime: 3, Launches: 4} // a new process in b's slot
	tot.Update([]ProcUsage{a, c})
	if tot.Launches != 16 {
		t.Fatalf("a new process in a reused slot: %+v", tot)
	}
}
