package allocation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// Pod annotations that set a container's compute claims. The pod-wide key
// applies to every container; "<key>.<container name>" applies to one
// container and wins over the pod-wide key. The agent reads them (the
// kubelet does not pass annotations to a device plugin).
const (
	AnnotationWeight       = "gpuwarden.io/weight"        // integer 1-policy.MaxWeight
	AnnotationComputeLimit = "gpuwarden.io/compute-limit" // percent 1-100, "%" allowed
	AnnotationPriority     = "gpuwarden.io/priority"      // high or normal
)

// Claims are a container's compute claims from annotations; a zero field
// was not set.
type Claims struct {
	Weight       uint32 // 1-policy.MaxWeight
	ComputeLimit uint32 // percent 1-100
	Priority     string // "high" or "normal"
}

// ParseAnnotations reads the claims of one container from its pod's
// annotations. Every malformed value is an error naming its annotation; a
// bad value never becomes "no limit".
func ParseAnnotations(annotations map[string]string, container string) (Claims, error) {
	var c Claims
	var errs []error
	get := func(key string) (string, string, bool) {
		if v, ok := annotations[key+"."+container]; ok && container != "" {
			return key + "." + container, v, true
		}
		v, ok := annotations[key]
		return key, v, ok
	}
	if k, v, ok := get(AnnotationWeight); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || policy.CheckWeight(int(n)) != nil {
			errs = append(errs, fmt.Errorf("annotation %s=%q: want an integer from 1 to %d", k, v, policy.MaxWeight))
		} else {
			c.Weight = uint32(n)
		}
	}
	if k, v, ok := get(AnnotationComputeLimit); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(v, "%"), 10, 32)
		if err != nil || n < 1 || n > 100 {
			errs = append(errs, fmt.Errorf("annotation %s=%q: want a percent from 1 to 100", k, v))
		} else {
			c.ComputeLimit = uint32(n)
		}
	}
	if k, v, ok := get(AnnotationPriority); ok {
		if v != "high" && v != "normal" {
			errs = append(errs, fmt.Errorf("annotation %s=%q: want high or normal", k, v))
		} else {
			c.Priority = v
		}
	}
	return c, errors.Join(errs...)
}
