package bundle

import (
	"encoding/json"
	"strings"
	"testing"
)

const (
	relA = "quay.io/openshift-release-dev/ocp-release@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	relB = "quay.io/openshift-release-dev/ocp-release@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func pathMetadata() *Metadata {
	return &Metadata{FormatVersion: FormatPath, Version: "4.18.1", Arch: "x86_64", Size: "1 KiB", SizeBytes: 1024,
		Release: relB, Images: []string{relA}, ReleaseSignatures: [][]byte{[]byte("sig B")},
		Path: []Hop{{Version: "4.17.3", Release: relA, ReleaseSignatures: [][]byte{[]byte("sig A")}}, {Version: "4.18.1", Release: relB}}}
}

func TestMetadata_PathReadsBack(t *testing.T) {
	m := pathMetadata()
	if m.OldestFormat() != FormatPath {
		t.Errorf("OldestFormat = %d with a path, want %d", m.OldestFormat(), FormatPath)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	hops := got.Hops()
	if len(hops) != 2 || hops[0].Version != "4.17.3" || string(hops[0].ReleaseSignatures[0]) != "sig A" ||
		hops[1].Release != relB || string(hops[1].ReleaseSignatures[0]) != "sig B" {
		t.Errorf("Hops = %+v", hops)
	}
	one := &Metadata{Version: "4.18.1", Release: relB, ReleaseSignatures: [][]byte{[]byte("sig B")}}
	if h := one.Hops(); len(h) != 1 || h[0].Release != relB || one.OldestFormat() != 1 {
		t.Errorf("one release: Hops = %+v, format %d; want one hop and format 1", h, one.OldestFormat())
	}
}

func TestMetadata_RefusesABadPath(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m *Metadata)
		says string
	}{
		{"format 1", func(m *Metadata) { m.FormatVersion = 1 }, "needs formatVersion 2"},
		{"one hop", func(m *Metadata) { m.Path = m.Path[1:] }, "path of one hop"},
		{"ends elsewhere", func(m *Metadata) { m.Path[1].Version = "4.18.2" }, "not at the bundle's version"},
		{"hop not carried", func(m *Metadata) { m.Images = nil }, "not one of the bundle's images"},
		{"version twice", func(m *Metadata) { m.Path[0].Version = "4.18.1" }, "listed twice"},
		{"last hop signed twice", func(m *Metadata) { m.Path[1].ReleaseSignatures = [][]byte{[]byte("x")} }, "not repeated"},
	} {
		m := pathMetadata()
		tc.edit(m)
		if err := ValidateMetadata(m); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.says)
		}
	}
}
