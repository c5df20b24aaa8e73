package crio_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/load"
)

var update = flag.Bool("update", false, "rewrite golden files")

const (
	d1 = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	d2 = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	d3 = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	d4 = "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
)

var bundleImages = []string{
	"quay.io/openshift-release-dev/ocp-release@" + d1,
	"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d2,
	"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d3,
	"quay.io/my-company/my-workload:v2.1@" + d4,
}

// requestFor is what CRI-O is asked for images (a bundle's, as
// metadata.json names them) served at addr: the agent's request
// (load.RequestFor).
func requestFor(images []string, addr string, ca []byte, label string) crio.Request {
	r := load.RequestFor(images)
	r.Addr, r.CACert, r.Label = addr, ca, label
	return r
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./crio -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from golden file:\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

func TestMirrorsConf_Golden(t *testing.T) {
	b, err := crio.MirrorsConf(requestFor(bundleImages, "127.0.0.1:5443", nil, "4.13.7-x86_64"), nil)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "registries-pin-upgrade.conf", b)
}

func TestMirrorsConf_RefusesNonLoopbackAndBadRefs(t *testing.T) {
	for name, tc := range map[string]struct {
		images []string
		addr   string
	}{
		"remote address": {bundleImages, "10.0.0.1:5000"},
		"no digest":      {[]string{"quay.io/a/b:v1"}, "127.0.0.1:5000"},
		"no repository":  {[]string{"busybox@" + d1}, "127.0.0.1:5000"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := crio.MirrorsConf(requestFor(tc.images, tc.addr, nil, ""), nil); !errors.Is(err, crio.ErrDropin) {
				t.Fatalf("got %v, want ErrDropin", err)
			}
		})
	}
}

func TestPinsConf_Golden(t *testing.T) {
	pins := append([]string{"registry.example/base@" + d1, "quay.io/quoted\"*"}, bundle.PullRefs(bundleImages)...)
	slices.Sort(pins)
	b, err := crio.PinsConf(pins, "4.13.7-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "crio-pin-upgrade.conf", b)
}

type dirs struct {
	root string
	d    *crio.Dropins
}

func newDirs(t *testing.T) dirs {
	root := t.TempDir()
	d := &crio.Dropins{
		CRIOConfDir:       filepath.Join(root, "crio", "crio.conf.d"),
		RegistriesConfDir: filepath.Join(root, "containers", "registries.conf.d"),
		CertsDir:          filepath.Join(root, "containers", "certs.d"),
	}
	if err := os.MkdirAll(d.CRIOConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dirs{root, d}
}

func (ds dirs) write(t *testing.T, rel, content string) {
	t.Helper()
	p := filepath.Join(ds.root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func decodePins(t *testing.T, path string) []string {
	t.Helper()
	var c struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	if _, err := toml.DecodeFile(path, &c); err != nil {
		t.Fatal(err)
	}
	return c.Crio.Image.PinnedImages
}

const mcoPins = `[crio]
  [crio.image]
    pinned_images = ["quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", "registry.example/pause*"]
`

func TestApply_PinsUnionOfEarlierDropinsAndBundle(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "crio/crio.conf", "[crio.image]\npinned_images = [\"from/main@"+d1+"\"]\n")
	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoPins)
	ds.write(t, "crio/crio.conf.d/10-other.conf", "[crio.image]\npinned_images = [\"early/one:v1\"]\n[crio.runtime]\nlog_level = \"info\"\n")
	ds.write(t, "crio/crio.conf.d/20-nopins.conf", "[crio.runtime]\nlog_level = \"debug\"\n")
	req := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "4.13.7-x86_64")
	req.Keep = []string{"old/bundle@" + d2}
	ch, err := ds.d.Apply(req)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Pins || !ch.Mirrors || !ch.CA || !ch.NeedsReload() {
		t.Errorf("first Apply: %v, want everything changed", ch)
	}
	got := decodePins(t, filepath.Join(ds.d.CRIOConfDir, crio.DropinName))
	want := append([]string{
		"from/main@" + d1, "early/one:v1", "old/bundle@" + d2,
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", "registry.example/pause*",
	}, bundle.PullRefs(bundleImages)...)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("pins\n got %q\nwant %q", got, want)
	}
	ca, err := os.ReadFile(filepath.Join(ds.d.CertsDir, "127.0.0.1:5443", "ca.crt"))
	if err != nil || !strings.Contains(string(ca), "BEGIN CERTIFICATE") {
		t.Errorf("ca.crt: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)); err != nil {
		t.Error(err)
	}
}

func TestApply_UnchangedWritesNothingAndLeavesNoTempFiles(t *testing.T) {
	ds := newDirs(t)
	s := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "")
	if _, err := ds.d.Apply(s); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(ds.d.CRIOConfDir, crio.DropinName)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old)
	ch, err := ds.d.Apply(s)
	if err != nil {
		t.Fatal(err)
	}
	if ch.NeedsReload() || ch.CA {
		t.Errorf("second Apply: %v, want unchanged", ch)
	}
	if fi, _ := os.Stat(p); !fi.ModTime().Equal(old) {
		t.Error("unchanged drop-in was rewritten")
	}
	for _, dir := range []string{ds.d.CRIOConfDir, ds.d.RegistriesConfDir, filepath.Dir(ds.d.CRIOConfDir)} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp") {
				t.Errorf("temporary file left: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
	names, _ := os.ReadDir(ds.d.CRIOConfDir)
	if len(names) != 1 {
		t.Errorf("crio.conf.d holds %d files, want only %s", len(names), crio.DropinName)
	}
}

func TestApply_RefusesAndWritesNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		files map[string]string
		ca    func(t *testing.T) []byte
	}{
		"broken earlier drop-in":       {files: map[string]string{"crio/crio.conf.d/50-pinned-images": "[crio.image]\npinned_images = [ \"unterminated\n"}},
		"later drop-in overrides pins": {files: map[string]string{"crio/crio.conf.d/zz-late.conf": "[crio.image]\npinned_images = [\"x\"]\n"}},
		"CA not PEM":                   {ca: func(*testing.T) []byte { return []byte("nope") }},
		"certificate not a CA":         {ca: func(t *testing.T) []byte { return testCA(t, false) }},
	} {
		t.Run(name, func(t *testing.T) {
			ds := newDirs(t)
			for rel, c := range tc.files {
				ds.write(t, rel, c)
			}
			ca := testCA(t, true)
			if tc.ca != nil {
				ca = tc.ca(t)
			}
			_, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5443", ca, ""))
			if !errors.Is(err, crio.ErrDropin) {
				t.Fatalf("got %v, want ErrDropin", err)
			}
			t.Log(err)
			for _, p := range []string{
				filepath.Join(ds.d.CRIOConfDir, crio.DropinName),
				filepath.Join(ds.d.RegistriesConfDir, crio.DropinName),
				filepath.Join(ds.d.CertsDir, "127.0.0.1:5443"),
			} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s written despite the refusal", p)
				}
			}
		})
	}
}

func TestApply_LaterDropinHoldingOurPinsIsAccepted(t *testing.T) {
	ds := newDirs(t)
	all := `[crio.image]
pinned_images = [` + `"` + strings.Join(bundle.PullRefs(bundleImages), `", "`) + `"]
`
	ds.write(t, "crio/crio.conf.d/zz-late.conf", all)
	if _, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "")); err != nil {
		t.Fatal(err)
	}
}

func TestRemove_KeepsOtherDropinsAndReportsChange(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoPins)
	s := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "")
	if _, err := ds.d.Apply(s); err != nil {
		t.Fatal(err)
	}
	ch, err := ds.d.Remove(s.Addr, s.Label)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Pins || !ch.Mirrors || !ch.CA {
		t.Errorf("Remove: %v", ch)
	}
	for _, p := range []string{
		filepath.Join(ds.d.CRIOConfDir, crio.DropinName),
		filepath.Join(ds.d.RegistriesConfDir, crio.DropinName),
		filepath.Join(ds.d.CertsDir, "127.0.0.1:5443"),
	} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s still there", p)
		}
	}
	if _, err := os.Stat(filepath.Join(ds.d.CRIOConfDir, "50-pinned-images")); err != nil {
		t.Error("MCO's drop-in removed")
	}
	ch, err = ds.d.Remove(s.Addr, s.Label)
	if err != nil || ch.NeedsReload() || ch.CA {
		t.Errorf("second Remove: %v, %v; want unchanged", ch, err)
	}
}

func testCA(t *testing.T, isCA bool) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true, IsCA: isCA}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestMirrorsConf_CollidingPathsKeepTheirHost(t *testing.T) {
	b, err := crio.MirrorsConf(requestFor([]string{"a.io/team/app@" + d1, "b.io:5000/team/app@" + d2}, "127.0.0.1:5443", nil, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`location = "127.0.0.1:5443/a.io/team/app"`, `location = "127.0.0.1:5443/b.io-5000/team/app"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("lacks %s:\n%s", want, b)
		}
	}
}

func TestApply_PortChangeRemovesOurOldCAOnly(t *testing.T) {
	ds := newDirs(t)
	ca := testCA(t, true)
	if _, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5443", ca, "")); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(ds.d.CertsDir, "127.0.0.1:6000", "ca.crt")
	ds.write(t, strings.TrimPrefix(other, ds.root+"/"), string(testCA(t, true)))
	if _, err := ds.d.Apply(requestFor(bundleImages, "127.0.0.1:5444", ca, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ds.d.CertsDir, "127.0.0.1:5443")); err == nil {
		t.Error("our CA for the old port left behind")
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("someone else's CA removed: %v", err)
	}
}

func TestApply_RegistriesDTurnsAttachmentsOnForTheMirrorOnly(t *testing.T) {
	ds := newDirs(t)
	ds.d.RegistriesD = filepath.Join(ds.root, "containers", "registries.d")
	ds.write(t, "containers/registries.d/sigstore-registries.yaml", "docker:\n  quay.io/openshift-release-dev/ocp-release:\n    use-sigstore-attachments: true\n")
	s := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "4.13.7-x86_64")
	ch, err := ds.d.Apply(s)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Attachments {
		t.Errorf("change %v: want registries.d written", ch)
	}
	ours := filepath.Join(ds.d.RegistriesD, crio.AttachmentsName)
	b, err := os.ReadFile(ours)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Docker map[string]map[string]bool `yaml:"docker"`
	}
	if err := yaml.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Docker) != 1 || !got.Docker[s.Addr]["use-sigstore-attachments"] {
		t.Errorf("ferry's registries.d file:\n%s\nwant only %s, with use-sigstore-attachments", b, s.Addr)
	}
	if ch, err := ds.d.Apply(s); err != nil || ch.Attachments {
		t.Errorf("second apply: %v %v, want the file unchanged", ch, err)
	}
	if _, err := ds.d.Remove(s.Addr, s.Label); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ours); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ferry's registries.d file after Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ds.d.RegistriesD, "sigstore-registries.yaml")); err != nil {
		t.Errorf("the MCO's registries.d file: %v", err)
	}
}

func TestApply_RefusesAMirrorAddressAnotherRegistriesDFileDefines(t *testing.T) {
	ds := newDirs(t)
	ds.d.RegistriesD = filepath.Join(ds.root, "containers", "registries.d")
	s := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "")
	ds.write(t, "containers/registries.d/other.yaml", "docker:\n  "+s.Addr+":\n    use-sigstore-attachments: false\n")
	_, err := ds.d.Apply(s)
	if !errors.Is(err, crio.ErrDropin) || !strings.Contains(err.Error(), "two registries.d files") {
		t.Fatalf("err = %v, want a refusal naming the clash", err)
	}
	for _, p := range []string{filepath.Join(ds.d.RegistriesD, crio.AttachmentsName), filepath.Join(ds.d.CertsDir, s.Addr, "ca.crt"),
		filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s written although the drop-ins were refused", p)
		}
	}
}
