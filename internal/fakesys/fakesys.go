// Package fakesys lays out files for tests that read sysfs, udev's
// database or /proc as the kernel and udev write them: the unit tests of
// udev and media build their fake machines with it.
package fakesys

import (
	"os"
	"path/filepath"
	"testing"
)

// Write writes files (name relative to dir → content) under dir, making
// the directories they need.
func Write(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Link makes name a symbolic link to target (as sysfs links
// dev/block/MAJ:MIN and class/block/NAME to a device's directory),
// making name's directory.
func Link(t testing.TB, target, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}
