package create_test

import (
	"archive/tar"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/test/fixture"
)

// createFrom makes CreateOptions that fetch reg's quay.io/... images.
func createFrom(t *testing.T, reg *fixture.Registry, release string, extra ...string) create.Options {
	t.Helper()
	tr, err := create.NewTransport(reg.CertsDir, true)
	if err != nil {
		t.Fatal(err)
	}
	return create.Options{
		Release:     release,
		ExtraImages: extra,
		Mirrors:     []create.Mirror{{Prefix: "quay.io/", Location: reg.Host + "/"}},
		Transport:   tr,
		OutputDir:   t.TempDir(),
		Created:     time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestCreate_WritesBundleOfReleaseAndExtras(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 20})
	byDigest := reg.PushImage(t, "my-company/agent", "")
	reg.PushImage(t, "my-company/app", "v1")
	o := createFrom(t, reg, release, "quay.io/my-company/app:v1", byDigest)
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Metadata
	if m.Version != "4.13.7" || m.Arch != "x86_64" || m.Release != release {
		t.Fatalf("metadata %+v", m)
	}
	if len(m.Images) != 22 {
		t.Fatalf("%d images, want 22: %v", len(m.Images), m.Images)
	}
	for i, p := range payload {
		if m.Images[i] != p {
			t.Fatalf("images[%d] = %s, want %s", i, m.Images[i], p)
		}
	}
	if !strings.HasPrefix(m.Images[20], "quay.io/my-company/app:v1@sha256:") || m.Images[21] != byDigest {
		t.Fatalf("extras: %v", m.Images[20:])
	}
	if filepath.Base(res.TarPath) != "upgrade-4.13.7-x86_64.tar" {
		t.Fatalf("tar %s", res.TarPath)
	}
	sha, err := os.ReadFile(res.SHA256Path)
	if err != nil || string(sha) != res.Digest.Encoded()+"  upgrade-4.13.7-x86_64.tar\n" {
		t.Fatalf(".sha256 %q %v", sha, err)
	}
	names := tarNames(t, res.TarPath)
	if names[0] != bundle.MetadataName {
		t.Fatalf("first entry %s", names[0])
	}
	if _, err := os.Stat(res.WorkDir); !os.IsNotExist(err) {
		t.Fatalf("work dir left behind: %v", err)
	}
	entries, _ := os.ReadDir(o.OutputDir)
	if len(entries) != 2 {
		t.Fatalf("output holds %d files, want the tar and .sha256", len(entries))
	}
	t.Logf("%d entries, %d bytes, %d blobs fetched", len(names), res.TarSize, res.BlobsFetched)
}

func payloadBlobGets(reg *fixture.Registry) int {
	n := 0
	for _, q := range reg.Requests() {
		if q.Method == "GET" && strings.HasPrefix(q.Path, "/v2/"+fixture.PayloadRepo+"/blobs/") {
			n++
		}
	}
	return n
}

func TestCreate_ResumeReusesBlobsInWorkTree(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 6})
	o := createFrom(t, reg, release)
	o.KeepWork = true
	first, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if first.BlobsFetched == 0 || first.BlobsReused != 0 {
		t.Fatalf("first run: fetched %d reused %d", first.BlobsFetched, first.BlobsReused)
	}

	// As after an interruption: one payload image's manifest was never
	// stored and one of its layers never arrived.
	tree := filepath.Join(first.WorkDir, "docker/registry/v2")
	_, _, d := bundle.SplitRef(payload[2])
	hexd := strings.TrimPrefix(d, "sha256:")
	if err := os.RemoveAll(filepath.Join(tree, "repositories", fixture.PayloadRepo, "_manifests/revisions/sha256", hexd)); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(tree, "blobs/sha256", hexd[:2], hexd, "data"))
	if err != nil {
		t.Fatal(err)
	}
	var mf struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(manifest, &mf); err != nil || len(mf.Layers) != 2 {
		t.Fatalf("manifest: %v", err)
	}
	own := strings.TrimPrefix(mf.Layers[1].Digest, "sha256:")
	if err := os.RemoveAll(filepath.Join(tree, "blobs/sha256", own[:2], own)); err != nil {
		t.Fatal(err)
	}
	// And one blob was damaged on disk.
	cfgBlob := firstConfigBlob(t, tree, payload[4])
	if err := os.WriteFile(cfgBlob, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}

	reg.ResetRequests()
	second, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if second.BlobsFetched != 2 || payloadBlobGets(reg) != 2 {
		t.Fatalf("second run fetched %d blobs (%d payload blob GETs), want 2: the missing layer and the damaged config",
			second.BlobsFetched, payloadBlobGets(reg))
	}
	if second.BlobsReused != first.BlobsFetched-2 {
		t.Fatalf("second run reused %d blobs, want %d", second.BlobsReused, first.BlobsFetched-2)
	}
	if second.Digest != first.Digest {
		t.Fatalf("resumed bundle differs: %s vs %s", second.Digest, first.Digest)
	}
}

// firstConfigBlob is the data file of ref's config blob in tree.
func firstConfigBlob(t *testing.T, tree, ref string) string {
	t.Helper()
	_, _, d := bundle.SplitRef(ref)
	h := strings.TrimPrefix(d, "sha256:")
	b, err := os.ReadFile(filepath.Join(tree, "blobs/sha256", h[:2], h, "data"))
	if err != nil {
		t.Fatal(err)
	}
	var mf struct {
		Config struct{ Digest string } `json:"config"`
	}
	if err := json.Unmarshal(b, &mf); err != nil {
		t.Fatal(err)
	}
	c := strings.TrimPrefix(mf.Config.Digest, "sha256:")
	return filepath.Join(tree, "blobs/sha256", c[:2], c, "data")
}

func TestCreate_SameInputsSameBundle(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 4})
	reg.PushImage(t, "my-company/app", "v1")
	a, err := create.Run(t.Context(), createFrom(t, reg, release, "quay.io/my-company/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := create.Run(t.Context(), createFrom(t, reg, release, "quay.io/my-company/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest {
		t.Fatalf("two runs over the same images: %s and %s", a.Digest, b.Digest)
	}
}

func TestCreate_StaleWorkTreeIsPruned(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	reg.PushImage(t, "my-company/old", "v1")
	o := createFrom(t, reg, release, "quay.io/my-company/old:v1")
	o.KeepWork = true
	if _, err := create.Run(t.Context(), o); err != nil {
		t.Fatal(err)
	}
	fresh, err := create.Run(t.Context(), createFrom(t, reg, release))
	if err != nil {
		t.Fatal(err)
	}
	o.ExtraImages = nil
	reused, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if reused.Digest != fresh.Digest {
		t.Fatalf("bundle from a work tree of an earlier run with another extra image differs from a fresh one")
	}
	for _, n := range tarNames(t, reused.TarPath) {
		if strings.Contains(n, "my-company") {
			t.Fatalf("bundle holds %s", n)
		}
	}
}

func TestCreate_ManifestListPlatforms(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	index, children := reg.PushIndex(t, "my-company/multi", "v2", "amd64", "arm64", "s390x")
	for _, tc := range []struct {
		platforms string
		want      map[string]bool
	}{
		{create.PlatformsArch, map[string]bool{"amd64": true}},
		{create.PlatformsAll, map[string]bool{"amd64": true, "arm64": true, "s390x": true}},
	} {
		t.Run(tc.platforms, func(t *testing.T) {
			o := createFrom(t, reg, release, index)
			o.Platforms, o.KeepWork = tc.platforms, true
			res, err := create.Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			revs := filepath.Join(res.WorkDir, "docker/registry/v2/repositories/my-company/multi/_manifests/revisions/sha256")
			_, _, id := bundle.SplitRef(index)
			if _, err := os.Stat(filepath.Join(revs, strings.TrimPrefix(id, "sha256:"))); err != nil {
				t.Fatalf("the manifest list itself is missing: %v", err)
			}
			for arch, ref := range children {
				_, _, d := bundle.SplitRef(ref)
				_, err := os.Stat(filepath.Join(revs, strings.TrimPrefix(d, "sha256:")))
				if got := err == nil; got != tc.want[arch] {
					t.Errorf("%s image present: %v, want %v", arch, got, tc.want[arch])
				}
			}
		})
	}
}

func TestCreate_PullSecretAuthenticates(t *testing.T) {
	reg := fixture.NewRegistry(t, fixture.Options{Username: "robot", Password: "hunter2"})
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	secret := filepath.Join(t.TempDir(), "pull-secret.json")
	auth := base64.StdEncoding.EncodeToString([]byte("robot:hunter2"))
	os.WriteFile(secret, []byte(`{"auths":{"`+reg.Host+`":{"auth":"`+auth+`","email":"x@example.com"},"quay.io":{"auth":"bm9wZTpub3Bl"}}}`), 0o600)
	kc, err := create.LoadPullSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	o := createFrom(t, reg, release)
	o.Keychain = kc
	if _, err := create.Run(t.Context(), o); err != nil {
		t.Fatal(err)
	}
}

func TestCreate_FailsClearlyAndLeavesNoTar(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	reg.PushImage(t, "my-company/app", "v1")
	locked := fixture.NewRegistry(t, fixture.Options{Username: "u", Password: "p"})
	lockedRelease, _ := locked.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	// A registry that answers for a release whose payload blob is gone.
	broken := fixture.NewRegistry(t)
	brokenRelease, brokenPayload := broken.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3, Seed: 7})
	blob := firstConfigBlob(t, filepath.Join(broken.Dir, "docker/registry/v2"), brokenPayload[1])
	if err := os.Remove(blob); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		opts   func(o *create.Options)
		is     error
		reason string
	}{
		{"bad release reference", func(o *create.Options) { o.Release = "quay.io/Bad Name:1" }, create.ErrBadReference, "bad image reference"},
		{"bad extra reference", func(o *create.Options) { o.ExtraImages = []string{"quay.io/x/y@sha256:123"} }, create.ErrBadReference, "bad image reference"},
		{"missing release", func(o *create.Options) {
			o.Release = "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("0", 64)
		}, create.ErrNotFound, "not in registry"},
		{"missing extra tag", func(o *create.Options) { o.ExtraImages = []string{"quay.io/my-company/none:v9"} }, create.ErrNotFound, "not in registry"},
		{"extra tag resolved otherwise than pinned", func(o *create.Options) {
			o.ExtraImages = []string{"quay.io/my-company/app:v1"}
			o.Pins = map[string]digest.Digest{"quay.io/my-company/app:v1": digest.Digest("sha256:" + strings.Repeat("1", 64))}
		}, create.ErrPinMismatch, "the node that pulled it resolved it to sha256:1111"},
		{"not a release image", func(o *create.Options) { o.Release = payload[0] }, create.ErrRelease, "release-manifests/image-references"},
		{"registry refuses credentials", func(o *create.Options) {
			o.Release = lockedRelease
			o.Mirrors = []create.Mirror{{Prefix: "quay.io/", Location: locked.Host + "/"}}
			o.Transport, _ = create.NewTransport(locked.CertsDir, true)
		}, create.ErrAuth, "check --pull-secret"},
		{"registry unreachable", func(o *create.Options) {
			o.Mirrors = []create.Mirror{{Prefix: "quay.io/", Location: "127.0.0.1:1/"}}
		}, create.ErrUnreachable, "cannot reach registry 127.0.0.1:1"},
		{"certificate not trusted", func(o *create.Options) { o.Transport = nil }, create.ErrUntrusted, "--cert-dir"},
		{"blob missing upstream", func(o *create.Options) {
			o.Release = brokenRelease
			o.Mirrors = []create.Mirror{{Prefix: "quay.io/", Location: broken.Host + "/"}}
			o.Transport, _ = create.NewTransport(broken.CertsDir, true)
		}, create.ErrNotFound, "not in registry"},
		{"arch nobody knows", func(o *create.Options) { o.Arch = "riscv64" }, nil, "arch \"riscv64\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := createFrom(t, reg, release)
			tc.opts(&o)
			_, err := create.Run(t.Context(), o)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("got %v, want %v", err, tc.is)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("message %q does not say %q", err, tc.reason)
			}
			entries, _ := os.ReadDir(o.OutputDir)
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".partial") || strings.HasSuffix(e.Name(), ".sha256") {
					t.Fatalf("left %s in the output", e.Name())
				}
			}
		})
	}
}

func TestCreate_ProgressEndsDone(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3, ImageSize: 100 << 10})
	o := createFrom(t, reg, release)
	var last create.Progress
	var mu sync.Mutex
	o.Progress = func(p create.Progress) { mu.Lock(); last = p; mu.Unlock() }
	if _, err := create.Run(t.Context(), o); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if last.Phase != "done" || last.Images != 4 || last.ImagesTotal != 4 || last.Bytes < 300<<10 || last.Bytes != last.BytesTotal {
		t.Fatalf("last progress %+v", last)
	}
}

func TestCreate_ReleaseByTagKeepsTagAndFlagsAgree(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2, Version: "4.14.1"})
	o := createFrom(t, reg, "quay.io/openshift-release-dev/ocp-release:4.14.1-x86_64")
	o.Arch = "x86_64"
	o.Version = "4.14.1"
	o.KeepWork = true
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	_, _, d := bundle.SplitRef(release)
	if want := "quay.io/openshift-release-dev/ocp-release:4.14.1-x86_64@" + d; res.Metadata.Release != want {
		t.Fatalf("release %s, want %s", res.Metadata.Release, want)
	}
	if filepath.Base(res.TarPath) != "upgrade-4.14.1-x86_64.tar" {
		t.Fatalf("tar %s", res.TarPath)
	}
	link, err := os.ReadFile(filepath.Join(res.WorkDir, "docker/registry/v2/repositories/openshift-release-dev/ocp-release/_manifests/tags/4.14.1-x86_64/current/link"))
	if err != nil || string(link) != d {
		t.Fatalf("tag link %q %v, want %s", link, err, d)
	}
}

// A --version the release image's own metadata contradicts is refused,
// naming both, before anything is copied: the version operator would
// refuse the release after downloading it.
func TestCreate_AVersionTheReleaseContradictsIsRefused(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2, Version: "4.14.1"})
	o := createFrom(t, reg, release)
	o.Version = "4.14.2"
	res, err := create.Run(t.Context(), o)
	if !errors.Is(err, create.ErrRelease) || !strings.Contains(err.Error(), "--version 4.14.2, but release "+release+" says it is 4.14.1") ||
		!strings.Contains(err.Error(), "drop --version") {
		t.Fatalf("create with --version 4.14.2 of a 4.14.1 release: %v, %v", res, err)
	}
	if ents, _ := os.ReadDir(o.OutputDir); len(ents) != 0 {
		t.Errorf("output written: %v", ents)
	}
}

func TestCreate_CopiesSigstoreSignaturesAndTheTreeCheckWalksThem(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	key, _ := imagetree.NewSigningKey()
	relSig := reg.Sign(t, release, key, "")
	imgSig := reg.Sign(t, payload[1], key, "")

	t.Run("All", func(t *testing.T) {
		res, err := create.Run(t.Context(), createFrom(t, reg, release))
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Metadata.Signatures; !slices.Equal(got, []string{relSig, imgSig}) {
			t.Fatalf("signatures %v, want %v", got, []string{relSig, imgSig})
		}
		// The tree check walks each signature like an image: present,
		// complete, hashing to its name.
		if _, err := bundle.Verify(t.Context(), bundle.Source{Path: res.TarPath, SHA256Path: res.SHA256Path}, bundle.Options{}); err != nil {
			t.Fatalf("verify: %v", err)
		}
		_, tag, _ := bundle.SplitRef(relSig)
		want := "docker/registry/v2/repositories/" + bundle.RepoPath(release) + "/_manifests/tags/" + tag + "/current/link"
		if !slices.Contains(tarNames(t, res.TarPath), want) {
			t.Errorf("the tar has no %s", want)
		}
	})
	t.Run("ReleaseOnly", func(t *testing.T) {
		o := createFrom(t, reg, release)
		o.Signatures = create.SignaturesRelease
		res, err := create.Run(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Metadata.Signatures; !slices.Equal(got, []string{relSig}) {
			t.Fatalf("signatures %v, want only the release's %s", got, relSig)
		}
	})
}

func TestVerify_AListedSignatureMissingFromTheTreeIsRefused(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	key, _ := imagetree.NewSigningKey()
	relSig := reg.Sign(t, release, key, "")
	o := createFrom(t, reg, release)
	o.KeepWork = true
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	// The same tree, its metadata listing a signature it does not hold.
	m := *res.Metadata
	name, _, _ := bundle.SplitRef(relSig)
	m.Signatures = append(m.Signatures, name+":"+bundle.SignatureTag("sha256:"+strings.Repeat("ab", 32))+"@sha256:"+strings.Repeat("cd", 32))
	tarPath := writeTree(t, &m, res.WorkDir)
	_, err = bundle.Verify(t.Context(), bundle.Source{Path: tarPath, SHA256Path: strings.TrimSuffix(tarPath, ".tar") + ".sha256"}, bundle.Options{Policy: bundle.Policy{SpaceFactor: -1}})
	if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), "the signature "+m.Signatures[1]) {
		t.Fatalf("err = %v, want the missing signature named", err)
	}
}

// writeTree writes a bundle tar of meta over the registry tree under root.
func writeTree(t *testing.T, meta *bundle.Metadata, root string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), meta.Name()+".tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, _, err := bundle.WriteTar(f, meta, root)
	if err != nil {
		t.Fatal(err)
	}
	sidecar := strings.TrimSuffix(p, ".tar") + ".sha256"
	if err := os.WriteFile(sidecar, []byte(bundle.FormatSHA256File(d.Encoded(), filepath.Base(p))), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCreate_CopiesSigstoreReferrersByTheTagSchema(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	art := reg.AttachReferrer(t, release, fixture.SigstoreBundleType, []byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json"}`))
	reg.AttachReferrer(t, payload[0], "application/spdx+json", []byte(`{"spdxVersion":"SPDX-2.3"}`)) // an SBOM stays behind
	res, err := create.Run(t.Context(), createFrom(t, reg, release))
	if err != nil {
		t.Fatal(err)
	}
	sigs := res.Metadata.Signatures
	name, _, d := bundle.SplitRef(release)
	if len(sigs) != 1 || !strings.HasPrefix(sigs[0], name+":"+bundle.ReferrersTag(d)+"@sha256:") || res.Metadata.SignatureOf(sigs[0]) != release {
		t.Fatalf("signatures %v, want the release's referrers index", sigs)
	}
	if _, err := bundle.Verify(t.Context(), bundle.Source{Path: res.TarPath, SHA256Path: res.SHA256Path}, bundle.Options{}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	want := "docker/registry/v2/repositories/" + bundle.RepoPath(release) + "/_manifests/revisions/sha256/" + strings.TrimPrefix(art, "sha256:") + "/link"
	if !slices.Contains(tarNames(t, res.TarPath), want) {
		t.Errorf("the tar lacks the referrer %s", want)
	}
}

// The node's mirrors as containers/image tries them: an insecure mirror
// with a certificate nobody trusts that lacks the images (asked, 404), a
// mirror that is down, then the registry that has them. Every image
// comes whole from the last; the first was asked over TLS unchecked.
func TestCreate_MirrorsAreTriedInOrderUntilOneServesTheImage(t *testing.T) {
	reg := fixture.NewRegistry(t)
	empty := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	extra := reg.PushImage(t, "my-company/app", "v1")
	o := createFrom(t, reg, release, "quay.io/my-company/app:v1")
	o.Mirrors = []create.Mirror{
		{Prefix: "quay.io/", Location: empty.Host + "/", Insecure: true},
		{Prefix: "quay.io/", Location: "127.0.0.1:1/"},
		{Prefix: "quay.io/", Location: reg.Host + "/"},
	}
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	extra = strings.Replace(extra, "@", ":v1@", 1)
	if len(res.Metadata.Images) != 4 || !slices.Contains(res.Metadata.Images, extra) {
		t.Fatalf("images %v, want 3 payload images and %s", res.Metadata.Images, extra)
	}
	asked := 0
	for _, q := range empty.Requests() {
		if strings.Contains(q.Path, "/manifests/") {
			asked++
			if q.Status != http.StatusNotFound {
				t.Errorf("the empty mirror answered %s with %d", q.Path, q.Status)
			}
		}
	}
	if asked < 5 || empty.BlobFetches() != 0 {
		t.Fatalf("the insecure empty mirror was asked for %d manifests and %d blobs, want every image's manifest and no blob", asked, empty.BlobFetches())
	}

	// A mirror lacks an image and the place after it is down: the image
	// is named as missing there (what to act on), and both are said.
	o = createFrom(t, reg, release, "quay.io/my-company/none:v9")
	o.Mirrors = []create.Mirror{
		{Prefix: "quay.io/", Location: reg.Host + "/"},
		{Prefix: "quay.io/", Location: "127.0.0.1:1/"},
	}
	_, err = create.Run(t.Context(), o)
	if !errors.Is(err, create.ErrNotFound) || !strings.Contains(err.Error(), "cannot reach registry 127.0.0.1:1") {
		t.Fatalf("got %v, want not found, naming the place beyond it", err)
	}

	// Blocked: no mirror serves a pull by tag and the origin may not be
	// asked, so the extra by tag is refused before anything is fetched.
	o = createFrom(t, reg, release, "quay.io/my-company/app:v1")
	o.Mirrors = []create.Mirror{
		{Prefix: "quay.io/", Location: reg.Host + "/", DigestOnly: true},
		{Prefix: "quay.io/", Blocked: true},
	}
	reg.ResetRequests()
	if _, err := create.Run(t.Context(), o); !errors.Is(err, create.ErrBadReference) || !strings.Contains(err.Error(), "origin is blocked") {
		t.Fatalf("got %v, want the blocked origin named", err)
	}
	if reg.BlobFetches() != 0 {
		t.Fatalf("%d blobs fetched for a refused request", reg.BlobFetches())
	}
}

// A registries.conf wildcard entry (*.io here, as a site writes
// *.example.com) sends quay.io's images to its mirror; blocked, it refuses
// the pull before a single request, so the pull secret goes nowhere.
func TestCreate_WildcardPrefixMirrorsOrBlocks(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	o := createFrom(t, reg, release)
	// Location + the name past its host: HOST/openshift-release-dev/…;
	// no location: the origin itself, never reached here.
	o.Mirrors = []create.Mirror{{Prefix: "*.io", Location: reg.Host}, {Prefix: "*.io"}}
	if _, err := create.Run(t.Context(), o); err != nil {
		t.Fatalf("through the wildcard's mirror: %v", err)
	}

	reg.ResetRequests()
	asked := false
	o = createFrom(t, reg, release)
	o.Keychain = keychainFunc(func(authn.Resource) (authn.Authenticator, error) {
		asked = true
		return authn.Anonymous, nil
	})
	o.Mirrors = []create.Mirror{{Prefix: "quay.io/other", Location: reg.Host + "/other"}, {Prefix: "*.io", Blocked: true}}
	if _, err := create.Run(t.Context(), o); !errors.Is(err, create.ErrBadReference) || !strings.Contains(err.Error(), "under *.io") {
		t.Fatalf("got %v, want the release refused as blocked under *.io", err)
	}
	if n := len(reg.Requests()); n != 0 || asked {
		t.Fatalf("a blocked pull made %d requests (credentials asked: %v), want none", n, asked)
	}
}

type keychainFunc func(authn.Resource) (authn.Authenticator, error)

func (f keychainFunc) Resolve(r authn.Resource) (authn.Authenticator, error) { return f(r) }
