package observe

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"no pinning", func(c *Config) { c.PinDir = "" }, ""},
		{"launch probes off", func(c *Config) { c.LaunchWindow, c.LaunchPeriod = 0, 0 }, ""},
		{"always attached", func(c *Config) { c.LaunchWindow = c.LaunchPeriod }, ""},
		{"window past period", func(c *Config) { c.LaunchWindow = c.LaunchPeriod + time.Second }, "longer than its period"},
		{"no period", func(c *Config) { c.LaunchPeriod = 0 }, "period 0s must be positive"},
		{"negative scan", func(c *Config) { c.ScanInterval = -time.Second }, "scan interval -1s is negative"},
		{"no proc", func(c *Config) { c.ProcRoot = "" }, "proc root is empty"},
		{"no gc", func(c *Config) { c.GCInterval = 0 }, "gc interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" && err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestDutyCycle(t *testing.T) {
	c := DefaultConfig()
	if got, want := c.DutyCycle(), 0.05/30; math.Abs(got-want) > 1e-12 {
		t.Errorf("default duty cycle = %v, want %v (50ms every 30s)", got, want)
	}
	c.LaunchWindow = 0
	if got := c.DutyCycle(); got != 0 {
		t.Errorf("duty cycle with no window = %v, want 0", got)
	}
}
