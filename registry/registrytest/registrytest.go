// Package registrytest makes small bundle trees (distribution's
// docker/registry/v2 layout) for tests: it pushes random images through a
// writable in-process distribution registry into a directory, and lists
// them in metadata.json beside it, as an extracted bundle does.
package registrytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"
)

// Tree is a directory being filled with images.
type Tree struct {
	Root string // holds docker/registry/v2 and metadata.json
	host string
	// refs are the images pushed, as metadata.json lists them.
	refs []string
}

// NewTree starts a writable registry over a new t.TempDir() that lives
// until the test ends.
func NewTree(t testing.TB) *Tree {
	t.Helper()
	return NewTreeAt(t, t.TempDir())
}

// NewTreeAt is NewTree over an existing directory.
func NewTreeAt(t testing.TB, root string) *Tree {
	t.Helper()
	secret := make([]byte, 16)
	rand.Read(secret)
	cfg := &configuration.Configuration{}
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.Storage = configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}}
	logrus.SetLevel(logrus.WarnLevel) // distribution logs every request at info
	app := handlers.NewApp(context.Background(), cfg)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	return &Tree{Root: root, host: strings.TrimPrefix(srv.URL, "http://")}
}

// Push writes a random image of layers×size bytes at repo (a path in the
// tree, e.g. "openshift-release-dev/ocp-v4.0-art-dev"). With tag "" it is
// pushed by digest only. It returns the manifest digest ("sha256:…").
func (tr *Tree) Push(t testing.TB, repo, tag string, size int64, layers int) string {
	t.Helper()
	img, err := random.Image(size, int64(layers))
	if err != nil {
		t.Fatal(err)
	}
	return tr.PushImage(t, repo, tag, img)
}

// PushImage writes img at repo (by tag, or by digest when tag is "").
func (tr *Tree) PushImage(t testing.TB, repo, tag string, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	s := fmt.Sprintf("%s/%s@%s", tr.host, repo, d)
	if tag != "" {
		s = fmt.Sprintf("%s/%s:%s", tr.host, repo, tag)
	}
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", s, err)
	}
	listed := "quay.io/" + repo
	if tag != "" {
		listed += ":" + tag
	}
	tr.refs = append(tr.refs, listed+"@"+d.String())
	tr.writeMetadata(t)
	return d.String()
}

// writeMetadata lists every image pushed (the first as the release): the
// embedded registry serves only what metadata.json lists. A test that
// writes its own after its pushes lists what it chooses.
func (tr *Tree) writeMetadata(t testing.TB) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"release": tr.refs[0], "images": tr.refs[1:]})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tr.Root, "metadata.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
