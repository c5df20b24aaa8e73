package crio

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"

	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/imageref"
)

// DropinName is the name of ferry's files in crio.conf.d and
// registries.conf.d. In crio.conf.d it sorts after MCO's 50-pinned-images.
const DropinName = "pin-upgrade.conf"

// ErrDropin marks a drop-in ferry refuses to write, or one of another
// owner that ferry cannot read.
var ErrDropin = errors.New("CRI-O drop-in")

// Dropins writes and removes ferry's CRI-O drop-ins.
type Dropins struct {
	CRIOConfDir       string // /etc/crio/crio.conf.d
	RegistriesConfDir string // /etc/containers/registries.conf.d
	CertsDir          string // /etc/containers/certs.d
	// RegistriesD is /etc/containers/registries.d, where ferry turns
	// sigstore attachments on for its mirror; "" writes nothing there.
	RegistriesD string
	// RegistriesConf is the node's registries.conf, whose mirrors ferry's
	// drop-in keeps; default registries.conf beside RegistriesConfDir.
	RegistriesConf string
	// Ledger is where ferry's own pins are kept (ledger.go); default
	// LedgerName beside CRIOConfDir.
	Ledger string

	mu sync.Mutex // the ledger and ferry's drop-ins: loads and WatchConf
}

// Change says which files an Apply or Remove changed. CRI-O needs a reload
// for Pins and Mirrors; certs.d is read on every pull.
type Change struct {
	Pins, Mirrors, CA bool
	// Attachments: ferry's registries.d file (read on every pull).
	Attachments bool
}

// NeedsReload is true when CRI-O must reload to see the change.
func (c Change) NeedsReload() bool { return c.Pins || c.Mirrors }

func (c Change) String() string {
	var s []string
	if c.Pins {
		s = append(s, "pins")
	}
	if c.Mirrors {
		s = append(s, "mirrors")
	}
	if c.CA {
		s = append(s, "CA")
	}
	if c.Attachments {
		s = append(s, "registries.d")
	}
	if len(s) == 0 {
		return "unchanged"
	}
	return strings.Join(s, ", ") + " changed"
}

// Apply records r's pins in the ledger under r.Label (and r.Keep's, where
// no bundle of the ledger holds them) and writes the drop-ins for r: each
// only if its bytes differ (unchanged files are not rewritten, so the
// caller can skip the reload), each validated before anything is written,
// through a temporary file outside the directory CRI-O reads, synced and
// renamed into place.
func (d *Dropins) Apply(r Request) (Change, error) {
	if len(r.Pull) == 0 {
		return Change{}, fmt.Errorf("%w: no images to pin", ErrDropin)
	}
	ca, err := checkCA(r.CACert)
	if err != nil {
		return Change{}, err
	}
	if err := d.checkAttachmentsFree(r.Addr); err != nil {
		return Change{}, err
	}
	edit := func(l *ledger) {
		l.Pins[ledgerKey(r.Label)] = slices.Clone(r.Pull)
		held := l.own()
		for _, p := range r.Keep {
			if !slices.Contains(held, p) {
				l.Pins[EarlierPins] = append(l.Pins[EarlierPins], p)
			}
		}
		l.Mirror = &mirrorState{Pull: r.Pull, Mirrors: r.Mirrors, Addr: r.Addr, Label: r.Label}
	}
	// The CA first: with it in place before the mirror appears, no pull
	// through the mirror fails on an unknown certificate.
	first := func(ch *Change) error {
		var err error
		if ch.CA, err = writeIfChanged(filepath.Join(d.CertsDir, r.Addr, "ca.crt"), ca, 0o644); err != nil {
			return fmt.Errorf("%w: certs.d: %v", ErrDropin, err)
		}
		d.removeStaleCAs(r.Addr, ca)
		if ch.Attachments, err = d.writeAttachments(r.Addr, r.Label); err != nil {
			return err
		}
		return nil
	}
	return d.update(edit, first)
}

// ledgerKey is the ledger's name for a bundle label.
func ledgerKey(label string) string { return cmp.Or(label, "bundle") }

// removeStaleCAs removes certs.d/127.0.0.1:<other port>/ca.crt files that
// hold exactly this CA: ferry's own, left from before the registry's port
// changed.
func (d *Dropins) removeStaleCAs(addr string, ca []byte) {
	ents, err := os.ReadDir(d.CertsDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == addr || !strings.HasPrefix(e.Name(), "127.0.0.1:") {
			continue
		}
		p := filepath.Join(d.CertsDir, e.Name(), "ca.crt")
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, ca) {
			os.Remove(p)
			os.Remove(filepath.Dir(p))
		}
	}
}

// Remove takes the bundle label out: its pins leave ferry's drop-in
// (which goes once ferry pins nothing), and its mirror and the CA for addr
// go. The pins of other bundles ferry holds (the running release's) and
// those of other drop-ins stay.
func (d *Dropins) Remove(addr, label string) (Change, error) {
	var ch Change
	mine, err := d.mirrorIsFor(label)
	if err != nil {
		return ch, err
	}
	if mine {
		if ch, err = d.RemoveMirror(addr); err != nil {
			return ch, err
		}
	}
	pins, err := d.update(func(l *ledger) { delete(l.Pins, ledgerKey(label)) }, nil)
	ch.Pins = pins.Pins
	return ch, err
}

// mirrorIsFor reports whether ferry's mirror drop-in, if any, serves the
// bundle label (or one the ledger does not know).
func (d *Dropins) mirrorIsFor(label string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.readLedger()
	if err != nil {
		return false, err
	}
	return l.Mirror == nil || l.Mirror.Label == label, nil
}

// PinnedBy returns the pins ferry's crio.conf.d drop-in holds now (nil
// when there is none): ferry's own and its copy of the others'.
func (d *Dropins) PinnedBy() ([]string, error) {
	pins, _, err := readPins(filepath.Join(d.CRIOConfDir, DropinName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return pins, err
}

// PinsBefore is the union of pinned_images of crio.conf (beside
// crio.conf.d) and of every file in crio.conf.d that sorts before ferry's:
// since a later file's list replaces an earlier one's, ferry's list must
// hold them all.
func (d *Dropins) PinsBefore() ([]string, error) {
	files := []string{filepath.Join(filepath.Dir(filepath.Clean(d.CRIOConfDir)), "crio.conf")}
	names, err := confNames(d.CRIOConfDir)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if n < DropinName {
			files = append(files, filepath.Join(d.CRIOConfDir, n))
		}
	}
	var all []string
	for _, f := range files {
		pins, _, err := readPins(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		all = append(all, pins...)
	}
	return all, nil
}

// checkNotOverridden refuses when a file that sorts after ferry's sets
// pinned_images without ferry's pins: CRI-O would use that list instead.
func (d *Dropins) checkNotOverridden(pins []string) error {
	names, err := confNames(d.CRIOConfDir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if n <= DropinName {
			continue
		}
		later, set, err := readPins(filepath.Join(d.CRIOConfDir, n))
		if err != nil {
			return err
		}
		if !set {
			continue
		}
		for _, p := range pins {
			if !slices.Contains(later, p) {
				return fmt.Errorf("%w: %s sorts after %s and sets pinned_images, which replaces ferry's list (it lacks %s): rename it to sort before %s, or add ferry's pins to it",
					ErrDropin, filepath.Join(d.CRIOConfDir, n), DropinName, p, DropinName)
			}
		}
	}
	return nil
}

// confNames lists the regular files (and symlinks) of a crio.conf.d
// directory, sorted as CRI-O reads them. A missing directory has none.
func confNames(dir string) ([]string, error) {
	return sortedNames(dir, func(e os.DirEntry) bool { return e.Type().IsRegular() || e.Type()&os.ModeSymlink != 0 })
}

// sortedNames lists the entries of dir that keep accepts, sorted. A
// missing directory has none.
func sortedNames(dir string, keep func(os.DirEntry) bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDropin, err)
	}
	var names []string
	for _, e := range ents {
		if keep(e) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

type crioConf struct {
	Crio struct {
		Image struct {
			PinnedImages *[]string `toml:"pinned_images"`
		} `toml:"image"`
	} `toml:"crio"`
}

// readPins returns [crio.image] pinned_images of a CRI-O config file and
// whether the file sets it.
func readPins(path string) (pins []string, set bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("%w: %v", ErrDropin, err)
	}
	var c crioConf
	if _, err := toml.Decode(string(b), &c); err != nil {
		return nil, false, fmt.Errorf("%w: %s is not valid TOML, so CRI-O cannot load it either: fix or remove it: %v", ErrDropin, path, err)
	}
	if c.Crio.Image.PinnedImages == nil {
		return nil, false, nil
	}
	return *c.Crio.Image.PinnedImages, true, nil
}

// mergePins is the sorted union of lists, without empty entries.
func mergePins(lists ...[]string) []string {
	set := map[string]bool{}
	for _, l := range lists {
		for _, p := range l {
			if p = strings.TrimSpace(p); p != "" {
				set[p] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// PinsConf renders ferry's crio.conf.d drop-in and checks that it decodes
// back to pins.
func PinsConf(pins []string, label string) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by ferry%s. Images CRI-O must keep (not garbage-collect):\n", forLabel(label))
	b.WriteString("# ferry's own (its ledger) and a copy of those of every drop-in that sorts\n")
	b.WriteString("# before this file as they are now (a later pinned_images replaces an\n")
	b.WriteString("# earlier one): ferry writes it again whenever they change.\n")
	b.WriteString("[crio.image]\npinned_images = [\n")
	for _, p := range pins {
		v, err := tomlString(p)
		if err != nil {
			return nil, err
		}
		b.WriteString("  " + v + ",\n")
	}
	b.WriteString("]\n")
	var c crioConf
	if _, err := toml.Decode(b.String(), &c); err != nil || c.Crio.Image.PinnedImages == nil || !slices.Equal(*c.Crio.Image.PinnedImages, pins) {
		return nil, fmt.Errorf("%w: generated pinned_images does not decode back to its %d pins (%v): not written", ErrDropin, len(pins), err)
	}
	return b.Bytes(), nil
}

func tomlString(s string) (string, error) {
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(map[string]string{"v": s}); err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrDropin, s, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(b.String(), "v = ")), nil
}

func forLabel(label string) string {
	if label == "" {
		return ""
	}
	return " for bundle " + label
}

// registriesConf is the part of containers-registries.conf(5) ferry writes.
type registriesConf struct {
	Registry []registryEntry `toml:"registry"`
}

type registryEntry struct {
	Prefix   string        `toml:"prefix"`
	Location string        `toml:"location"`
	Insecure bool          `toml:"insecure,omitempty"`
	Blocked  bool          `toml:"blocked,omitempty"`
	Mirror   []mirrorEntry `toml:"mirror"`
}

type mirrorEntry struct {
	Location       string `toml:"location"`
	Insecure       bool   `toml:"insecure,omitempty"`
	PullFromMirror string `toml:"pull-from-mirror,omitempty"`
}

// MirrorsConf renders ferry's registries.conf.d drop-in for r: one
// [[registry]] per repository of r.Pull, mirrored at
// r.Addr/r.Mirrors[repository]. A repository pulled only by digest uses
// the mirror for digest pulls only; one also pulled by tag uses it for tag
// pulls too (the embedded registry serves the tag), so a pull by that tag
// is served locally and other tags still fall back to the original
// registry. After the embedded registry come the mirrors site (the node's
// own configuration; nil for none) had for the repository, with their
// options, and its location, insecure and blocked: ferry's entry replaces
// the node's for the same prefix, and must not lose what it did.
func MirrorsConf(r Request, site *SiteRegistries) ([]byte, error) {
	addr, label := r.Addr, r.Label
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		return nil, fmt.Errorf("%w: registry address %q is not 127.0.0.1:<port>", ErrDropin, addr)
	}
	tagged, byDigest := map[string]bool{}, map[string]bool{}
	for _, ref := range r.Pull {
		name, tag, digest := imageref.Split(ref)
		if digest == "" && tag == "" || !strings.Contains(name, "/") {
			return nil, fmt.Errorf("%w: %q is not a registry/name@sha256:… or registry/name:tag reference", ErrDropin, ref)
		}
		tagged[name] = tagged[name] || tag != ""
		byDigest[name] = byDigest[name] || digest != ""
	}
	names := make([]string, 0, len(tagged))
	for n := range tagged {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch {
		case !byDigest[n]:
			return nil, fmt.Errorf("%w: %s is pulled by tag only: the embedded registry mirrors a repository for its digests (registry/name@sha256:…)", ErrDropin, n)
		case r.Mirrors[n] == "":
			return nil, fmt.Errorf("%w: %s has no path on the embedded registry", ErrDropin, n)
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by ferry%s: its repositories are served by ferry's\n", forLabel(label))
	fmt.Fprintf(&b, "# embedded registry on %s (CA in certs.d/%s). Removed by `ferry cleanup`.\n", addr, addr)
	var entries []registryEntry
	for _, n := range names {
		m := mirrorEntry{Location: addr + "/" + r.Mirrors[n], PullFromMirror: "digest-only"}
		if tagged[n] {
			m.PullFromMirror = "all"
		}
		e, from, err := site.entryFor(n, m)
		if err != nil {
			return nil, err
		}
		b.WriteString("\n")
		if from != "" {
			fmt.Fprintf(&b, "# Then this node's own settings for %s, from %s.\n", n, from)
		}
		enc := toml.NewEncoder(&b)
		enc.Indent = ""
		if err := enc.Encode(registriesConf{Registry: []registryEntry{e}}); err != nil {
			return nil, fmt.Errorf("%w: registries.conf.d: %v", ErrDropin, err)
		}
		entries = append(entries, e)
	}
	var back registriesConf
	if _, err := toml.Decode(b.String(), &back); err != nil || len(back.Registry) != len(entries) {
		return nil, fmt.Errorf("%w: generated registries.conf.d drop-in does not decode back (%v): not written", ErrDropin, err)
	}
	for i, r := range back.Registry {
		if !reflect.DeepEqual(r, entries[i]) {
			return nil, fmt.Errorf("%w: generated registries.conf.d entry %d (%s) does not decode back: not written", ErrDropin, i, entries[i].Prefix)
		}
	}
	return b.Bytes(), nil
}

func checkCA(pemBytes []byte) ([]byte, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: the registry CA is not a PEM certificate", ErrDropin)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: the registry CA: %v", ErrDropin, err)
	}
	if !c.IsCA {
		return nil, fmt.Errorf("%w: the registry certificate is not a CA (CA:TRUE): CRI-O would not trust it as ca.crt", ErrDropin)
	}
	return pemBytes, nil
}

// writeIfChanged writes data to path unless it already holds exactly
// data. The temporary file goes in path's parent's parent (e.g. /etc/crio
// for /etc/crio/crio.conf.d/x), on the same filesystem but outside the
// directory CRI-O reads whole.
func writeIfChanged(path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	if err := atomicfile.WriteFileVia(filepath.Dir(dir), path, data, mode); err != nil {
		return false, err
	}
	return true, nil
}

func removeIfExists(path string) (bool, error) {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrDropin, err)
	}
	atomicfile.SyncDir(filepath.Dir(path))
	return true, nil
}
