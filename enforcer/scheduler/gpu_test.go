package scheduler

import (
	"testing"
	"time"
)

// At weights 1:2, after 30 ms of wall time went to nobody (a drain's end
// to the next tick, say), a earned 10 ms of it and b 20 ms: both are as far
// behind what they are owed, in their own shares. Picking by raw credit
// would hand b the device, and over a run b would get more than twice a's.
func TestPickByStandingNotRawCredit(t *testing.T) {
	a := &member{c: &container{key: "a"}, target: 1.0 / 3, waiting: true, credit: 10e6}
	b := &member{c: &container{key: "b"}, target: 2.0 / 3, waiting: true, credit: 19e6}
	g := &gpu{members: []*member{a, b}, active: []*member{a, b}}
	if got := g.pick(nil, time.Now(), Config{}); got != a {
		t.Fatalf("picked %s: a stands at %.0f ms of wall time, b at %.0f", got.c.key, a.standing()/1e6, b.standing()/1e6)
	}
	b.credit = 21e6
	if got := g.pick(nil, time.Now(), Config{}); got != b {
		t.Fatalf("picked %s: b stands at %.0f ms of wall time, a at %.0f", got.c.key, b.standing()/1e6, a.standing()/1e6)
	}
}
