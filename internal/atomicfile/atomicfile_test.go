package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile_ReplacesWholeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, body := range []string{"first", "second, longer"} {
		if err := WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != body {
			t.Fatalf("read %q, %v; want %q", b, err, body)
		}
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries: a temp file was left", len(ents))
	}
}

func TestWriteFileVia_TempStaysOutOfTheTargetDir(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "conf.d")
	os.Mkdir(conf, 0o755)
	if err := WriteFileVia(root, filepath.Join(conf, "x.conf"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(conf); len(ents) != 1 || ents[0].Name() != "x.conf" {
		t.Fatalf("conf.d holds %v", ents)
	}
	if err := WriteFileVia(filepath.Join(root, "missing"), filepath.Join(conf, "y.conf"), []byte("a"), 0o644); err == nil {
		t.Fatal("no error when the temp dir is missing")
	}
	if _, err := os.Stat(filepath.Join(conf, "y.conf")); !os.IsNotExist(err) {
		t.Fatal("a failed write left the target")
	}
}
