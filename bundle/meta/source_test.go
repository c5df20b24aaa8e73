package meta

import (
	"path/filepath"
	"testing"
)

// Source.Name and StagingDir say what filepath says, without linking it.
func TestPaths_AsFilepath(t *testing.T) {
	for _, p := range []string{"/var/lib/upgrade/4.19.8-x86_64", "/run/media/sdb1/upgrade-4.19.8-x86_64.tar", "/a/b/", "/b", "b", "/", ""} {
		if got, want := (Source{Path: p}).Name(), filepath.Base(p); got != want {
			t.Errorf("Name of %q = %q, filepath.Base says %q", p, got, want)
		}
		if p != filepath.Clean(p) || p == "/" {
			continue // StagingDir takes a clean path to a directory
		}
		if got, want := StagingDir(p), filepath.Join(filepath.Dir(p), ".staging-"+filepath.Base(p)); got != want {
			t.Errorf("StagingDir(%q) = %q, want %q", p, got, want)
		}
	}
	if got := (Source{Path: "/proc/self/fd/3", Label: "/tmp/upgrade-4.19.8-x86_64.tar"}).Name(); got != "upgrade-4.19.8-x86_64.tar" {
		t.Errorf("Name of a labelled source = %q", got)
	}
}
