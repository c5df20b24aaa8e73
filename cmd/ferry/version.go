package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is the git version of this build, set by the linker:
//
//	go build -ldflags "-X main.version=$(git describe --always --dirty)" ./cmd/ferry
//
// Left empty, ferry falls back to what the Go toolchain recorded.
var version string

var versionFlags = newFlagSet("version", "")

var versionJSON = versionFlags.Bool("json", false, "print the version as JSON")

func init() {
	register(&command{name: "version", summary: "print ferry's version, Go version and platform", run: runVersion})
}

func runVersion(_ context.Context, args []string) error {
	if err := parseFlags(versionFlags, args); err != nil {
		return err
	}
	if versionFlags.NArg() > 0 {
		return usageError("takes no arguments, got %q", versionFlags.Args())
	}
	return writeVersion(os.Stdout, buildVersion(), *versionJSON)
}

// versionInfo is what `ferry version` prints.
type versionInfo struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func writeVersion(w io.Writer, v string, asJSON bool) error {
	info := versionInfo{Version: v, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	}
	_, err := fmt.Fprintf(w, "ferry %s (%s %s/%s)\n", info.Version, info.Go, info.OS, info.Arch)
	return err
}

// buildVersion is the linker-set version, else the module version (go
// install ...@vX), else the VCS revision, else "devel".
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionFromBuildInfo(bi)
}

func versionFromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return rev[:min(len(rev), 12)] + dirty
}
