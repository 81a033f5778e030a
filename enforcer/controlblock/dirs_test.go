package controlblock

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestDirsFollowsChanges(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ctl")
	d := NewDirs(root)
	names, _, err := d.Names()
	if err != nil || names != nil {
		t.Fatalf("no control directory: got %v, %v; want none", names, err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	want := []string{}
	// Changes in quick succession, each seen at once: within one timestamp
	// tick a stat alone could not tell them apart.
	for _, name := range []string{"b", "a", "c"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
		slices.Sort(want)
		if got, _, err := d.Names(); err != nil || !slices.Equal(got, want) {
			t.Fatalf("after mkdir %s: got %v, %v; want %v", name, got, err, want)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "token"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "b"), filepath.Join(root, "d")); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.Names(); !slices.Equal(got, []string{"a", "c", "d"}) {
		t.Fatalf("after a file and a rename: got %v, want [a c d] (files are not containers)", got)
	}
	if err := os.Remove(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.Names(); !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("after rmdir: got %v, want [c d]", got)
	}
}

func TestDirsKeepsAnOldListing(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"x", "y"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(root, old, old); err != nil {
		t.Fatal(err)
	}
	d := NewDirs(root)
	first, gen, err := d.Names()
	if err != nil || len(first) != 2 {
		t.Fatalf("got %v, %v; want [x y]", first, err)
	}
	second, gen2, _ := d.Names()
	if &first[0] != &second[0] || gen2 != gen {
		t.Fatal("an unchanged directory, last changed an hour ago, was listed again")
	}
	// A change with the timestamp set back (as a tick's granularity could
	// leave it) still shows: the directory's link count changed.
	if err := os.Mkdir(filepath.Join(root, "z"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(root, old, old); err != nil {
		t.Fatal(err)
	}
	if got, gen3, _ := d.Names(); len(got) != 3 || gen3 == gen {
		t.Fatalf("after mkdir z: got %v (generation %d, was %d), want [x y z] in a new generation", got, gen3, gen)
	}
}
