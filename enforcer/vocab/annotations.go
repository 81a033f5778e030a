package vocab

import (
	"errors"
	"fmt"
)

// Pod annotations that set a container's compute settings. The pod-wide key
// applies to every container; "<key>.<container name>" applies to one
// container and wins over the pod-wide key. The agent reads them from the
// API server (the kubelet does not pass annotations to a device plugin).
const (
	AnnotationWeight       = "gpuwarden.io/weight"        // ParseWeight
	AnnotationComputeLimit = "gpuwarden.io/compute-limit" // ParseCapPercent
	AnnotationPriority     = "gpuwarden.io/priority"      // ParsePriority
)

// Annotated is what a pod's annotations set for one container; a zero field
// was not set.
type Annotated struct {
	Weight     int    // 1-MaxWeight
	CapPercent int    // 1-MaxCapPercent
	Priority   string // PriorityHigh or PriorityNormal
}

// ParseAnnotations reads one container's settings from its pod's
// annotations. Every malformed value is an error naming its annotation; a
// bad value never becomes "no limit".
func ParseAnnotations(annotations map[string]string, container string) (Annotated, error) {
	var a Annotated
	var errs []error
	get := func(key string) (string, string, bool) {
		if v, ok := annotations[key+"."+container]; ok && container != "" {
			return key + "." + container, v, true
		}
		v, ok := annotations[key]
		return key, v, ok
	}
	// bad names the annotation and what its setting wants.
	bad := func(k, v string, err error) error {
		var e *Error
		if errors.As(err, &e) {
			return fmt.Errorf("annotation %s=%q: want %s", k, v, e.Want)
		}
		return fmt.Errorf("annotation %s=%q: %w", k, v, err)
	}
	var err error
	if k, v, ok := get(AnnotationWeight); ok {
		if a.Weight, err = ParseWeight(v); err != nil {
			errs = append(errs, bad(k, v, err))
		}
	}
	if k, v, ok := get(AnnotationComputeLimit); ok {
		if a.CapPercent, err = ParseCapPercent(v); err != nil {
			errs = append(errs, bad(k, v, err))
		}
	}
	if k, v, ok := get(AnnotationPriority); ok {
		if _, err := ParsePriority(v); err != nil {
			errs = append(errs, bad(k, v, err))
		} else {
			a.Priority = v
		}
	}
	return a, errors.Join(errs...)
}
