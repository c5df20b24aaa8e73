// Package atomicfile writes files so that a crash or power loss leaves
// either the old content or the new one, never a part.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile writes data to path through a temporary file in path's own
// directory: written, synced, renamed over path, the directory synced.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	return WriteFileVia(filepath.Dir(path), path, data, mode)
}

// WriteFileVia is WriteFile with the temporary file in tmpDir, which must
// be on path's filesystem: for directories whose every file is read (such
// as CRI-O's crio.conf.d), where a temporary file must never appear.
func WriteFileVia(tmpDir, path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(tmpDir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes a rename or removal in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
