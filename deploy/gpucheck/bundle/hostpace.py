"""hostpace: a host-bound training's duty cycle under time slices, without a
GPU. Runs interpreter-bound Python work (what a training's dispatch costs
the host) in the phases a container at weights 1:2 holds the GPU, and
sleeps between them, as a container's launches wait at its gate between
its slices: the smaller share runs one slice in three, the larger two.
The process takes each role in turn, --interval-s at a time from --start
(a Unix time), the smaller first unless --second; two processes started
with and without --second alternate as the agent's slices alternate two
containers. Every other pair of intervals it spins through the last
--spin-ms before each of its phases instead of sleeping (what a gate that
woke its waiter early would cost and save). Then both run without sleeping
for --continuous-s.

Its pace in a role is the work it did over the phases' length counted from
each phase's scheduled start, so that a late wake-up costs it as a late
start costs a training in its slice (the agent's clock starts at the gate's
opening). The first slice period of each interval is not counted (the
switch of role). At the end it prints one line an interval,
"interval <index> <small|large|continuous> <sleep|spin> <units> <ms>"."""
import argparse
import time

p = argparse.ArgumentParser()
p.add_argument("--slice-ms", type=float, required=True)
p.add_argument("--start", type=float, required=True)
p.add_argument("--intervals", type=int, default=12)
p.add_argument("--interval-s", type=float, default=2)
p.add_argument("--continuous-s", type=float, default=4)
p.add_argument("--spin-ms", type=float, default=2)
p.add_argument("--second", action="store_true")
a = p.parse_args()
period = 3 * a.slice_ms / 1e3
if period <= 0 or a.interval_s < 2 * period or a.intervals < 4 or not 0 <= a.spin_ms <= a.slice_ms:
    p.error("want --slice-ms > 0, --interval-s of at least two periods (6 slices), 4 --intervals or more and --spin-ms within a slice")

# each role's phase within the period: the smaller share's slice, then the larger's two
PHASES = {"small": (0, period / 3), "large": (period / 3, period), "continuous": (0, period)}


class Op:
    __slots__ = ("key", "val")

    def __init__(self, i):
        self.key, self.val = f"op{i}", i


ops = [Op(i) for i in range(64)]
table = {o.key: len(o.key) for o in ops}


def work():
    """One unit: attribute, dict and call traffic over 64 small objects."""
    s = 0
    for o in ops:
        s += table[o.key] + o.val
        o.val = s & 0xFF
    return s


def wait_until(t, spin):
    """Sleeps until spin seconds before t, then spins."""
    while (d := t - spin - time.time()) > 0:
        time.sleep(d)
    while time.time() < t:
        pass


def run(role, spin, begin, end):
    """Works in role's phases from begin to end; its units and phase ms,
    the first period after begin left out."""
    lo, hi = PHASES[role]
    units, ran = 0, 0.0
    base = begin
    while base < end:
        s, stop = base + lo, min(base + hi, end)
        if s >= end:  # the interval ends before this phase begins
            break
        wait_until(s, spin)
        n = 0
        while time.time() < stop:
            work()
            n += 1
        if base > begin:
            units, ran = units + n, ran + (stop - s)
        base += period
    return units, ran * 1e3


lines = []
for k in range(a.intervals):
    role = ("small", "large")[(k + a.second) % 2]
    mode = ("sleep", "spin")[k // 2 % 2]
    begin = a.start + k * a.interval_s
    spin = a.spin_ms / 1e3 if mode == "spin" else 0
    lines.append((k, role, mode) + run(role, spin, begin, begin + a.interval_s))
begin = a.start + a.intervals * a.interval_s
lines.append((a.intervals, "continuous", "sleep") + run("continuous", 0, begin, begin + a.continuous_s))
for k, role, mode, units, ms in lines:
    print(f"interval {k} {role} {mode} {units} {ms:.3f}", flush=True)
