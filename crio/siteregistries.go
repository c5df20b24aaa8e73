package crio

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ferry-edge/ferry/internal/regprefix"
)

// SiteRegistries is the node's own registries configuration, without
// ferry's drop-in: registries.conf and every other *.conf file of
// registries.conf.d, merged as containers/image (sysregistriesv2, the
// version CRI-O 1.34 uses) merges them. A drop-in's [[registry]] replaces
// an earlier one of the same prefix whole, so ferry's entry for a
// repository must carry the mirrors the node already had for it.
type SiteRegistries struct {
	// byPrefix is the merged configuration: the entry CRI-O uses for
	// each prefix.
	byPrefix map[string]siteRegistry
	// after holds the prefixes set by drop-ins that sort after ferry's
	// (and so replace ferry's entry for the same prefix), with their file.
	after map[string]string
}

// siteRegistry is one [[registry]] of a site file, normalized.
type siteRegistry struct {
	Prefix             string
	Location           string
	Insecure           bool
	Blocked            bool
	MirrorByDigestOnly bool
	Mirrors            []mirrorEntry
	File               string // where it was read, for messages
}

// siteConf is what ferry reads of a registries.conf file: the v2
// [[registry]] tables and the v1 [registries.*] lists.
type siteConf struct {
	Registry []struct {
		Prefix             string `toml:"prefix"`
		Location           string `toml:"location"`
		Insecure           bool   `toml:"insecure"`
		Blocked            bool   `toml:"blocked"`
		MirrorByDigestOnly bool   `toml:"mirror-by-digest-only"`
		PullFromMirror     string `toml:"pull-from-mirror"`
		Mirror             []struct {
			Location       string `toml:"location"`
			Insecure       bool   `toml:"insecure"`
			PullFromMirror string `toml:"pull-from-mirror"`
		} `toml:"mirror"`
	} `toml:"registry"`
	V1 struct {
		Insecure struct {
			Registries []string `toml:"registries"`
		} `toml:"insecure"`
		Block struct {
			Registries []string `toml:"registries"`
		} `toml:"block"`
		Search struct {
			Registries []string `toml:"registries"`
		} `toml:"search"`
	} `toml:"registries"`
}

// registriesConf is /etc/containers/registries.conf for RegistriesConfDir
// /etc/containers/registries.conf.d, unless RegistriesConf says otherwise.
func (d *Dropins) registriesConf() string {
	if d.RegistriesConf != "" {
		return d.RegistriesConf
	}
	return filepath.Join(filepath.Dir(filepath.Clean(d.RegistriesConfDir)), "registries.conf")
}

// SiteRegistries reads the node's registries configuration as CRI-O
// reads it, without ferry's own drop-in: registries.conf (v1 or v2; a
// missing one is empty), then registries.conf.d's *.conf files in lexical
// order (v2 only), each replacing earlier entries of the same prefix. A
// file containers/image would refuse is an ErrDropin naming it.
func (d *Dropins) SiteRegistries() (*SiteRegistries, error) {
	s := &SiteRegistries{byPrefix: map[string]siteRegistry{}, after: map[string]string{}}
	main, err := readSiteFile(d.registriesConf(), false)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, r := range main {
		s.byPrefix[r.Prefix] = r
	}
	names, err := registriesDropins(d.RegistriesConfDir)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if n == DropinName {
			continue
		}
		regs, err := readSiteFile(filepath.Join(d.RegistriesConfDir, n), true)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since the listing, as containers/image allows
		}
		if err != nil {
			return nil, err
		}
		for _, r := range regs {
			s.byPrefix[r.Prefix] = r
			if n > DropinName {
				s.after[r.Prefix] = r.File
			}
		}
	}
	return s, nil
}

// registriesDropins lists the files of registries.conf.d containers/image
// reads: every non-directory entry named *.conf, sorted.
func registriesDropins(dir string) ([]string, error) {
	return sortedNames(dir, func(e os.DirEntry) bool { return !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") })
}

// readSiteFile reads one registries configuration file and normalizes it
// as containers/image's loadConfigFile and postProcessRegistries do: v1
// lists converted (unless forceV2, as for drop-ins), trailing slashes
// trimmed, the prefix defaulting to the location, the first entry of a
// prefix winning within the file.
func readSiteFile(path string, forceV2 bool) ([]siteRegistry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrDropin, err)
	}
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s: CRI-O cannot use it either; fix it before loading a bundle", ErrDropin, path, fmt.Sprintf(format, a...))
	}
	var c siteConf
	if _, err := toml.Decode(string(b), &c); err != nil {
		return nil, refuse("not valid TOML: %v", err)
	}
	v1 := len(c.V1.Insecure.Registries)+len(c.V1.Block.Registries)+len(c.V1.Search.Registries) > 0
	var regs []siteRegistry
	switch {
	case v1 && forceV2:
		return nil, refuse("a drop-in must be in the v2 format ([[registry]]), not v1 ([registries.*])")
	case v1 && len(c.Registry) > 0:
		return nil, refuse("mixes the v1 ([registries.*]) and v2 ([[registry]]) formats")
	case v1:
		regs, err = convertV1(c.V1.Block.Registries, c.V1.Insecure.Registries)
		if err != nil {
			return nil, refuse("%v", err)
		}
	}
	for _, r := range c.Registry {
		if r.PullFromMirror != "" {
			return nil, refuse("pull-from-mirror is set on registry %q itself; it belongs on its mirrors", r.Prefix)
		}
		sr := siteRegistry{Insecure: r.Insecure, Blocked: r.Blocked, MirrorByDigestOnly: r.MirrorByDigestOnly, File: path}
		if sr.Location, err = parseLocation(r.Location); err != nil {
			return nil, refuse("%v", err)
		}
		switch {
		case r.Prefix == "" && sr.Location == "":
			return nil, refuse("a [[registry]] has neither prefix nor location")
		case r.Prefix == "":
			sr.Prefix = sr.Location
		default:
			if sr.Prefix, err = parseLocation(r.Prefix); err != nil {
				return nil, refuse("%v", err)
			}
			if sr.Location == "" && !strings.HasPrefix(sr.Prefix, "*.") {
				return nil, refuse("registry %q has no location and its prefix is not *.domain", sr.Prefix)
			}
		}
		if strings.HasPrefix(sr.Prefix, "*.") && strings.ContainsAny(sr.Prefix, "/@:") {
			return nil, refuse("wildcard prefix %q must be *.domain", sr.Prefix)
		}
		for _, m := range r.Mirror {
			loc, err := parseLocation(m.Location)
			if err != nil {
				return nil, refuse("%v", err)
			}
			switch {
			case loc == "":
				return nil, refuse("a mirror of %q has no location", sr.Prefix)
			case r.MirrorByDigestOnly && m.PullFromMirror != "":
				return nil, refuse("registry %q sets mirror-by-digest-only and its mirror %q sets pull-from-mirror", sr.Prefix, loc)
			case m.PullFromMirror != "" && m.PullFromMirror != "all" && m.PullFromMirror != "digest-only" && m.PullFromMirror != "tag-only":
				return nil, refuse("mirror %q: pull-from-mirror %q is not all, digest-only or tag-only", loc, m.PullFromMirror)
			}
			sr.Mirrors = append(sr.Mirrors, mirrorEntry{Location: loc, Insecure: m.Insecure, PullFromMirror: m.PullFromMirror})
		}
		regs = append(regs, sr)
	}
	// Entries of one location must agree on insecure and blocked.
	byLoc := map[string]siteRegistry{}
	for _, r := range regs {
		key := r.Location
		if key == "" {
			key = r.Prefix
		}
		if o, ok := byLoc[key]; ok && (o.Insecure != r.Insecure || o.Blocked != r.Blocked) {
			return nil, refuse("registry %q is defined twice with different insecure or blocked settings", key)
		}
		byLoc[key] = r
	}
	seen := map[string]bool{}
	var out []siteRegistry
	for _, r := range regs {
		if !seen[r.Prefix] {
			seen[r.Prefix] = true
			out = append(out, r)
		}
	}
	return out, nil
}

// convertV1 turns v1's blocked and insecure lists into entries whose
// prefix is their location, blocked ones first, as containers/image does.
func convertV1(blocked, insecure []string) ([]siteRegistry, error) {
	var order []string
	regs := map[string]*siteRegistry{}
	get := func(loc string) (*siteRegistry, error) {
		loc, err := parseLocation(loc)
		if err != nil {
			return nil, err
		}
		if r, ok := regs[loc]; ok {
			return r, nil
		}
		regs[loc] = &siteRegistry{Prefix: loc, Location: loc}
		order = append(order, loc)
		return regs[loc], nil
	}
	for _, l := range blocked {
		r, err := get(l)
		if err != nil {
			return nil, err
		}
		r.Blocked = true
	}
	for _, l := range insecure {
		r, err := get(l)
		if err != nil {
			return nil, err
		}
		r.Insecure = true
	}
	out := make([]siteRegistry, 0, len(order))
	for _, l := range order {
		out = append(out, *regs[l])
	}
	return out, nil
}

func parseLocation(s string) (string, error) {
	t := strings.TrimRight(s, "/")
	if strings.HasPrefix(t, "http://") || strings.HasPrefix(t, "https://") {
		return "", fmt.Errorf("location %q has a URI scheme, which registries.conf does not allow", s)
	}
	return t, nil
}

// find is the entry CRI-O uses for name: the longest prefix that
// matches it (the first in sorted order among equals), or false.
func (s *SiteRegistries) find(name string) (siteRegistry, int, bool) {
	if s == nil {
		return siteRegistry{}, 0, false
	}
	prefixes := make([]string, 0, len(s.byPrefix))
	for p := range s.byPrefix {
		prefixes = append(prefixes, p)
	}
	sort.Strings(prefixes)
	best, bestLen, matched := "", 0, 0
	for _, p := range prefixes {
		if n := regprefix.Match(name, p); n >= 0 && len(p) > bestLen {
			best, bestLen, matched = p, len(p), n
		}
	}
	if bestLen == 0 {
		return siteRegistry{}, 0, false
	}
	return s.byPrefix[best], matched, true
}

// entryFor is ferry's [[registry]] for the repository name: the embedded
// registry's mirror first, then every mirror the node already had for the
// name (from the site entry that matches it, rewritten for the longer
// prefix, so a pull resolves to the same places it did), with the site
// entry's location, insecure and blocked. from names the site file, ""
// when the node had no entry for name.
func (s *SiteRegistries) entryFor(name string, ours mirrorEntry) (e registryEntry, from string, err error) {
	if s != nil {
		if f, ok := s.after[name]; ok {
			return e, "", fmt.Errorf("%w: %s sorts after %s and sets prefix %q, which replaces ferry's mirror for it: rename it to sort before %s (ferry then lists its mirrors after the embedded registry)",
				ErrDropin, f, DropinName, name, DropinName)
		}
	}
	e = registryEntry{Prefix: name, Location: name, Mirror: []mirrorEntry{ours}}
	site, n, ok := s.find(name)
	if !ok {
		return e, "", nil
	}
	rest := name[n:]
	if site.Location != "" {
		e.Location = site.Location + rest
	}
	e.Insecure, e.Blocked = site.Insecure, site.Blocked
	for _, m := range site.Mirrors {
		m.Location += rest
		if m.Location == ours.Location {
			continue
		}
		if site.MirrorByDigestOnly {
			// Same meaning per mirror, since ferry's own mirror sets
			// pull-from-mirror (the two may not be mixed).
			m.PullFromMirror = "digest-only"
		}
		e.Mirror = append(e.Mirror, m)
	}
	return e, site.File, nil
}

// PullSource is one place the node's configuration sends a pull of an
// image under Prefix ("*.domain": any host under domain). PullSources
// lists them in the order containers/image tries them: the entry's
// mirrors, then its location ("" for a wildcard entry without one: the
// image's own name); Blocked ends a prefix's list (its origin may not be
// asked).
type PullSource struct {
	Prefix, Location string
	Insecure         bool
	// DigestOnly and TagOnly: the place serves only pulls by digest, or
	// only by tag (mirror-by-digest-only, pull-from-mirror).
	DigestOnly, TagOnly bool
	Blocked             bool
}

// PullSources lists, prefix by prefix, where the node's configuration
// sends a pull (ferry's own drop-in left out): what registry mode fetches
// through. Every entry is listed, wildcard ones and those that change
// nothing of a pull too: the longest matching prefix decides, so an entry
// left out would hand its images to a shorter, perhaps blocked, one.
func (s *SiteRegistries) PullSources() []PullSource {
	var out []PullSource
	for _, p := range slices.Sorted(maps.Keys(s.byPrefix)) {
		r := s.byPrefix[p]
		for _, m := range r.Mirrors {
			out = append(out, PullSource{Prefix: p, Location: m.Location, Insecure: m.Insecure,
				DigestOnly: r.MirrorByDigestOnly || m.PullFromMirror == "digest-only",
				TagOnly:    m.PullFromMirror == "tag-only"})
		}
		if r.Blocked {
			out = append(out, PullSource{Prefix: p, Blocked: true})
			continue
		}
		loc := r.Location
		if loc == "" && !strings.HasPrefix(p, "*.") {
			loc = p
		}
		out = append(out, PullSource{Prefix: p, Location: loc, Insecure: r.Insecure})
	}
	return out
}
