package crio_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/ferry-edge/ferry/crio"
)

// siteRegistriesConf is a node's registries.conf as the MCO writes it for
// ImageDigestMirrorSets: a repository mirrored for digests, a namespace
// that must never be contacted (blocked, mirrors only), and an entry a
// drop-in replaces.
const siteRegistriesConf = `unqualified-search-registries = ["registry.access.redhat.com"]
short-name-mode = "enforcing"

[[registry]]
  location = "quay.io/openshift-release-dev/ocp-release/"
  mirror-by-digest-only = true

  [[registry.mirror]]
    location = "mirror.site:5000/ocp/release"

  [[registry.mirror]]
    location = "backup.site/ocp/release"
    insecure = true

[[registry]]
  prefix = "quay.io/openshift-release-dev"
  location = "quay.io/openshift-release-dev"
  blocked = true

  [[registry.mirror]]
    location = "mirror.site:5000/openshift-release-dev"
    pull-from-mirror = "digest-only"

[[registry]]
  location = "quay.io/my-company/my-workload"

  [[registry.mirror]]
    location = "replaced.site/workload"

[[registry]]
  prefix = "*.example.io"
  location = ""

  [[registry.mirror]]
    location = "wild.site/example"
`

// siteDropin is a drop-in of the site's that sorts before ferry's.
const siteDropin = `[[registry]]
prefix = "quay.io/my-company"
location = "registry.site/my-company"
insecure = true

[[registry.mirror]]
location = "mirror.site:5000/my-company/"
pull-from-mirror = "tag-only"

[[registry]]
location = "quay.io/my-company/my-workload"

[[registry.mirror]]
location = "new.site/workload"
`

var siteImages = append([]string{
	"quay.io/my-company/other@" + d2,
	"registry.example.io/team/app@" + d3,
	"docker.io/library/unmirrored@" + d1,
}, bundleImages...)

func writeSite(t *testing.T, ds dirs) {
	ds.write(t, "containers/registries.conf", siteRegistriesConf)
	ds.write(t, "containers/registries.conf.d/10-site.conf", siteDropin)
	ds.write(t, "containers/registries.conf.d/README", "not read: not a .conf file [[[")
	ds.write(t, "containers/registries.conf.d/zz-other.conf", "[[registry]]\nlocation = \"docker.io/library/busybox\"\n")
}

func TestMirrorsConf_KeepsTheNodesMirrorsAfterTheEmbeddedRegistry_Golden(t *testing.T) {
	ds := newDirs(t)
	writeSite(t, ds)
	site, err := ds.d.SiteRegistries()
	if err != nil {
		t.Fatal(err)
	}
	b, err := crio.MirrorsConf(requestFor(siteImages, "127.0.0.1:5443", nil, "4.13.7-x86_64"), site)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "registries-pin-upgrade-site.conf", []byte(strings.ReplaceAll(string(b), ds.root, "/ROOT")))
}

// An entry of ferry's drop-in as CRI-O reads it.
type readEntry struct {
	Prefix   string `toml:"prefix"`
	Location string `toml:"location"`
	Blocked  bool   `toml:"blocked"`
	Insecure bool   `toml:"insecure"`
	Mirror   []struct {
		Location       string `toml:"location"`
		Insecure       bool   `toml:"insecure"`
		PullFromMirror string `toml:"pull-from-mirror"`
	} `toml:"mirror"`
}

func readEntries(t *testing.T, b []byte) map[string]readEntry {
	t.Helper()
	var c struct {
		Registry []readEntry `toml:"registry"`
	}
	if _, err := toml.Decode(string(b), &c); err != nil {
		t.Fatal(err)
	}
	m := map[string]readEntry{}
	for _, r := range c.Registry {
		m[r.Prefix] = r
	}
	return m
}

func TestMirrorsConf_V1BlockAndInsecureListsCarryOver(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "containers/registries.conf", `[registries.search]
registries = ["registry.access.redhat.com"]
[registries.block]
registries = ["quay.io"]
[registries.insecure]
registries = ["quay.io", "docker.io"]
`)
	site, err := ds.d.SiteRegistries()
	if err != nil {
		t.Fatal(err)
	}
	b, err := crio.MirrorsConf(requestFor(bundleImages, "127.0.0.1:5443", nil, ""), site)
	if err != nil {
		t.Fatal(err)
	}
	e := readEntries(t, b)["quay.io/openshift-release-dev/ocp-release"]
	if !e.Blocked || !e.Insecure || e.Location != "quay.io/openshift-release-dev/ocp-release" || len(e.Mirror) != 1 {
		t.Errorf("entry %+v: want quay.io's blocked and insecure kept, only ferry's mirror\n%s", e, b)
	}
}

func TestMirrorsConf_NoSiteEntryIsFerrysMirrorOnly(t *testing.T) {
	ds := newDirs(t) // no registries.conf at all
	site, err := ds.d.SiteRegistries()
	if err != nil {
		t.Fatal(err)
	}
	with, err := crio.MirrorsConf(requestFor(bundleImages, "127.0.0.1:5443", nil, "4.13.7-x86_64"), site)
	if err != nil {
		t.Fatal(err)
	}
	without, _ := crio.MirrorsConf(requestFor(bundleImages, "127.0.0.1:5443", nil, "4.13.7-x86_64"), nil)
	if string(with) != string(without) {
		t.Errorf("with no site configuration the drop-in differs:\n%s\n---\n%s", with, without)
	}
}

func TestApply_RefusesRegistriesFilesCRIOWouldRefuseOrThatOverrideFerry(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"later drop-in sets a bundle repository": {"containers/registries.conf.d/zz-late.conf": "[[registry]]\nlocation = \"quay.io/openshift-release-dev/ocp-release\"\n"},
		"registries.conf not TOML":               {"containers/registries.conf": "[[registry]\n"},
		"v1 drop-in":                             {"containers/registries.conf.d/10-v1.conf": "[registries.block]\nregistries = [\"quay.io\"]\n"},
		"v1 and v2 mixed":                        {"containers/registries.conf": "[registries.block]\nregistries = [\"quay.io\"]\n[[registry]]\nlocation = \"a.io\"\n"},
		"URI scheme in a location":               {"containers/registries.conf": "[[registry]]\nlocation = \"https://quay.io\"\n"},
		"digest-only and pull-from-mirror":       {"containers/registries.conf": "[[registry]]\nlocation = \"quay.io\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"m.site\"\npull-from-mirror = \"all\"\n"},
		"pull-from-mirror on a registry":         {"containers/registries.conf": "[[registry]]\nlocation = \"quay.io\"\npull-from-mirror = \"all\"\n"},
		"unknown pull-from-mirror":               {"containers/registries.conf": "[[registry]]\nlocation = \"quay.io\"\n[[registry.mirror]]\nlocation = \"m.site\"\npull-from-mirror = \"sometimes\"\n"},
		"mirror without location":                {"containers/registries.conf": "[[registry]]\nlocation = \"quay.io\"\n[[registry.mirror]]\ninsecure = true\n"},
		"conflicting insecure":                   {"containers/registries.conf": "[[registry]]\nprefix = \"a.io/x\"\nlocation = \"quay.io\"\n[[registry]]\nprefix = \"a.io/y\"\nlocation = \"quay.io\"\ninsecure = true\n"},
		"bad wildcard":                           {"containers/registries.conf": "[[registry]]\nprefix = \"*.quay.io/x\"\nlocation = \"\"\n"},
	} {
		t.Run(name, func(t *testing.T) {
			ds := newDirs(t)
			for rel, c := range files {
				ds.write(t, rel, c)
			}
			_, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), ""))
			if !errors.Is(err, crio.ErrDropin) {
				t.Fatalf("got %v, want ErrDropin", err)
			}
			t.Log(err)
			if _, err := os.Stat(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)); err == nil {
				t.Error("drop-in written despite the refusal")
			}
		})
	}
}

func TestApply_LaterDropinForOtherPrefixesIsAccepted(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "containers/registries.conf.d/zz-late.conf", "[[registry]]\nlocation = \"quay.io/openshift-release-dev\"\n[[registry.mirror]]\nlocation = \"m.site/ocp\"\n")
	if _, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName))
	if err != nil {
		t.Fatal(err)
	}
	e := readEntries(t, b)["quay.io/openshift-release-dev/ocp-v4.0-art-dev"]
	if len(e.Mirror) != 2 || e.Mirror[1].Location != "m.site/ocp/ocp-v4.0-art-dev" {
		t.Errorf("entry %+v: want ferry's mirror, then the later drop-in's namespace mirror for the repository", e)
	}
}

func TestApplyThenRemove_LeavesTheNodesRegistriesFilesAsTheyWere(t *testing.T) {
	ds := newDirs(t)
	writeSite(t, ds)
	ds.write(t, "containers/certs.d/mirror.site:5000/ca.crt", "the site mirror's CA")
	before := snapshot(t, filepath.Join(ds.root, "containers"))
	s := requestFor(siteImages, "127.0.0.1:5443", testCA(t, true), "")
	if _, err := ds.d.Apply(s); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.d.Remove(s.Addr, s.Label); err != nil {
		t.Fatal(err)
	}
	after := snapshot(t, filepath.Join(ds.root, "containers"))
	for p, c := range before {
		if after[p] != c {
			t.Errorf("%s changed: %q, was %q", p, after[p], c)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s left behind", p)
		}
	}
}

// snapshot maps every file and directory under root to its content ("/"
// for a directory).
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			m[p] = "/"
			return nil
		}
		b, err := os.ReadFile(p)
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Registry mode fetches as containers/image pulls: per prefix the
// mirrors in order, each for the kind of pull it serves, then the
// location, unless blocked.
func TestPullSources_InTheOrderContainersImageTriesThem(t *testing.T) {
	ds := newDirs(t)
	writeSite(t, ds)
	site, err := ds.d.SiteRegistries()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range site.PullSources() {
		got = append(got, fmt.Sprintf("%s -> %s insecure=%v digest-only=%v tag-only=%v blocked=%v",
			s.Prefix, s.Location, s.Insecure, s.DigestOnly, s.TagOnly, s.Blocked))
	}
	want := []string{
		// A wildcard entry's origin is the image's own name ("").
		"*.example.io -> wild.site/example insecure=false digest-only=false tag-only=false blocked=false",
		"*.example.io ->  insecure=false digest-only=false tag-only=false blocked=false",
		// It changes nothing of a pull, but shadows any shorter prefix.
		"docker.io/library/busybox -> docker.io/library/busybox insecure=false digest-only=false tag-only=false blocked=false",
		"quay.io/my-company -> mirror.site:5000/my-company insecure=false digest-only=false tag-only=true blocked=false",
		"quay.io/my-company -> registry.site/my-company insecure=true digest-only=false tag-only=false blocked=false",
		"quay.io/my-company/my-workload -> new.site/workload insecure=false digest-only=false tag-only=false blocked=false",
		"quay.io/my-company/my-workload -> quay.io/my-company/my-workload insecure=false digest-only=false tag-only=false blocked=false",
		"quay.io/openshift-release-dev -> mirror.site:5000/openshift-release-dev insecure=false digest-only=true tag-only=false blocked=false",
		"quay.io/openshift-release-dev ->  insecure=false digest-only=false tag-only=false blocked=true",
		"quay.io/openshift-release-dev/ocp-release -> mirror.site:5000/ocp/release insecure=false digest-only=true tag-only=false blocked=false",
		"quay.io/openshift-release-dev/ocp-release -> backup.site/ocp/release insecure=true digest-only=true tag-only=false blocked=false",
		"quay.io/openshift-release-dev/ocp-release -> quay.io/openshift-release-dev/ocp-release insecure=false digest-only=false tag-only=false blocked=false",
	}
	if !slices.Equal(got, want) {
		t.Errorf("pull sources:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A site that blocks every host under a domain (as an OpenShift
// blockedRegistries entry "*.example.com" becomes) hands registry mode
// that wildcard, blocked, and its mirrors before it.
func TestPullSources_WildcardBlockedEntriesReachRegistryMode(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "containers/registries.conf", `
[[registry]]
prefix = "*.example.com"
location = ""
blocked = true

[[registry]]
prefix = "*.corp.example.com"
location = ""
blocked = true

[[registry.mirror]]
location = "mirror.site/corp"
`)
	site, err := ds.d.SiteRegistries()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range site.PullSources() {
		got = append(got, fmt.Sprintf("%s -> %s blocked=%v", s.Prefix, s.Location, s.Blocked))
	}
	want := []string{
		"*.corp.example.com -> mirror.site/corp blocked=false",
		"*.corp.example.com ->  blocked=true",
		"*.example.com ->  blocked=true",
	}
	if !slices.Equal(got, want) {
		t.Errorf("pull sources:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
