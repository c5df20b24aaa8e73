package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionFromBuildInfo_PrefersModuleVersionThenRevision(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"go install at a tag", debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"vcs revision", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}}}, "0123456789ab"},
		{"vcs revision, modified", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc1234"}, {Key: "vcs.modified", Value: "true"}}}, "abc1234-dirty"},
		{"nothing recorded", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionFromBuildInfo(&tc.bi); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBuildVersion_LinkerValueWins(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.9.9-1-gdeadbee-dirty"
	if got := buildVersion(); got != version {
		t.Fatalf("got %q, want the -X main.version value %q", got, version)
	}
}

func TestWriteVersion_TextAndJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeVersion(&b, "v1.2.3", outText); err != nil {
		t.Fatal(err)
	}
	want := "ferry v1.2.3 (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	if err := writeVersion(&b, "v1.2.3", outJSON); err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal(b.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Version != "v1.2.3" || v.Go != runtime.Version() || v.OS != runtime.GOOS || v.Arch != runtime.GOARCH {
		t.Fatalf("got %+v", v)
	}
	if !strings.HasSuffix(b.String(), "}\n") {
		t.Fatalf("JSON not newline-terminated: %q", b.String())
	}
}
