package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// The opaque configuration a claim (or its DeviceClass) may give the
// driver: apiVersion ShareConfigAPIVersion, kind ShareConfigKind.
const (
	ShareConfigAPIVersion = DriverName + "/v1alpha1"
	ShareConfigKind       = "ShareConfig"
	maxShareConfigBytes   = 4096
)

// ShareConfig is a claim's compute settings; a nil field is not set.
type ShareConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Weight is the claim's share of its GPU's time against the other
	// claims there (1-vocab.MaxWeight); unset, it follows the claim's
	// compute capacity.
	Weight *int `json:"weight,omitempty"`
	// Priority is vocab.PriorityHigh or vocab.PriorityNormal.
	Priority *string `json:"priority,omitempty"`
	// ComputeLimit caps the claim's compute share, a percent of the GPU.
	ComputeLimit *int `json:"computeLimit,omitempty"`
}

// DecodeShareConfig reads one ShareConfig strictly: an unknown field, a
// second object, a wrong apiVersion or kind and every bad value are errors
// that name what is wrong. Nothing is defaulted past what it says.
func DecodeShareConfig(b []byte) (ShareConfig, error) {
	var c ShareConfig
	if len(b) > maxShareConfigBytes {
		return c, fmt.Errorf("%s: %d bytes, more than %d", ShareConfigKind, len(b), maxShareConfigBytes)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return ShareConfig{}, fmt.Errorf("%s: %w", ShareConfigKind, err)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return ShareConfig{}, fmt.Errorf("%s: more than one JSON value", ShareConfigKind)
	}
	if c.APIVersion != ShareConfigAPIVersion || c.Kind != ShareConfigKind {
		return ShareConfig{}, fmt.Errorf("apiVersion %q, kind %q: want %s, %s", c.APIVersion, c.Kind, ShareConfigAPIVersion, ShareConfigKind)
	}
	var errs []error
	bad := func(field string, err error) {
		var e *vocab.Error
		if errors.As(err, &e) {
			named := *e // the field's name, with vocab's echo of the value
			named.Setting = field
			err = &named
		}
		errs = append(errs, err)
	}
	if c.Weight != nil {
		if err := vocab.CheckWeight(*c.Weight); err != nil {
			bad("weight", err)
		}
	}
	if c.Priority != nil {
		if _, err := vocab.ParsePriority(*c.Priority); err != nil {
			bad("priority", err)
		}
	}
	if c.ComputeLimit != nil {
		if err := vocab.CheckCapPercent(*c.ComputeLimit); err != nil {
			bad("computeLimit", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ShareConfig{}, fmt.Errorf("%s: %w", ShareConfigKind, err)
	}
	return c, nil
}

// merge lays c over base: the fields c sets win.
func (c ShareConfig) merge(base ShareConfig) ShareConfig {
	if c.Weight != nil {
		base.Weight = c.Weight
	}
	if c.Priority != nil {
		base.Priority = c.Priority
	}
	if c.ComputeLimit != nil {
		base.ComputeLimit = c.ComputeLimit
	}
	return base
}
