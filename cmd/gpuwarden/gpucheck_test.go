package main

import (
	"bytes"
	"strings"
	"testing"
)

// gpu-check refuses flags it cannot honour before it starts anything, and
// says which.
func TestGPUCheckRefusesBadSelections(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bundle", "b", "--parts", "7", "out"}, "want part numbers 1-6"},
		{[]string{"--bundle", "b", "--parts", "4,x", "out"}, "want part numbers 1-6"},
		{[]string{"--bundle", "b", "--rows", "batch64,,fixed", "out"}, "an empty one"},
		{[]string{"--bundle", "b", "--rows", "", "out"}, "an empty one"},
		{[]string{"--rows", "batch64", "out"}, "usage: gpuwarden gpu-check"},
	} {
		var stdout, stderr bytes.Buffer
		if rc := runGPUCheck(c.args, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("gpu-check %q: exit %d, stderr %q; want exit 2 saying %q", c.args, rc, stderr.String(), c.want)
		}
	}
}
