package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Store keeps records as one JSON file each, written atomically.
type Store struct{ dir string }

// OpenStore creates the state dir if needed.
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "bundles"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, "bundles", id+".json") }

// IndexPath is where the tar index of the bundle with this digest is kept.
func (s *Store) IndexPath(digest digest.Digest) string {
	return filepath.Join(s.dir, "bundles", strings.TrimPrefix(string(digest), "sha256:")+".index")
}

// Save writes r atomically (temp file, fsync, rename, fsync dir).
func (s *Store) Save(r *machine.Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path(r.ID), b, 0o600)
}

// Delete removes r's record; one already gone is no error.
func (s *Store) Delete(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Load returns every record, oldest first.
func (s *Store) Load() ([]*machine.Record, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "bundles"))
	if err != nil {
		return nil, err
	}
	var out []*machine.Record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, "bundles", e.Name()))
		if err != nil {
			return nil, err
		}
		var r machine.Record
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("state record %s is damaged (%v): move it away to start over", e.Name(), err)
		}
		out = append(out, &r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].FirstSeen().Before(out[j].FirstSeen()) })
	return out, nil
}
