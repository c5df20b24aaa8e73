package create

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	godigest "github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/internal/digest"
)

// A hostile source (the registry, or the node a follower follows) gets a
// clear error for a manifest list with too many children, a manifest too
// large, or more manifest bytes than a run holds: never a node that runs
// out of memory each time its pull resumes (issue 41).
func TestWalk_BoundsTheManifestsARunHolds(t *testing.T) {
	index := func(children int) rawManifest {
		var ms []map[string]any
		for i := range children {
			ms = append(ms, map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 500,
				"digest": godigest.FromString(fmt.Sprint(i)).String(), "platform": map[string]string{"os": "linux", "architecture": "amd64"}})
		}
		b, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": ms})
		return rawManifest{mediaType: "application/vnd.oci.image.index.v1+json", body: b, digest: digest.Digest(godigest.FromBytes(b))}
	}
	big := rawManifest{mediaType: "application/vnd.oci.image.manifest.v1+json", body: []byte(strings.Repeat(" ", maxManifest+1)), digest: digest.Digest("sha256:" + strings.Repeat("b", 64))}
	fetched := 0
	src := func(context.Context, string) (rawManifest, error) { fetched++; return big, nil }
	for name, tc := range map[string]struct {
		m     rawManifest
		held  int64
		fetch bool
	}{
		"a list of too many manifests":   {m: index(maxChildren + 1)},
		"a manifest too large":           {m: big},
		"a child too large":              {m: index(1), fetch: true},
		"more manifest bytes than a run": {m: index(1), held: maxHeldManifests},
	} {
		t.Run(name, func(t *testing.T) {
			c := &creator{o: Options{Platforms: PlatformsArch}, arch: "x86_64"}
			c.manifestBytes.Store(tc.held)
			p := &imagePlan{ref: &imageRef{name: "quay.io/x/y", tag: "v1"}}
			fetched = 0
			err := c.walk(t.Context(), p, src, tc.m, map[digest.Digest]bool{})
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("got %v, want ErrTooLarge", err)
			}
			if !tc.fetch && fetched > 0 {
				t.Errorf("fetched %d manifests before refusing", fetched)
			}
			t.Log(err)
		})
	}
}
