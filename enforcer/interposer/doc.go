// Package interposer holds the tests of libgpuwarden.so, the C interposer
// whose sources live beside this file (src/, tests/, fuzz/; see README.md).
// The tests run real processes on simgpu with LD_PRELOAD.
package interposer
