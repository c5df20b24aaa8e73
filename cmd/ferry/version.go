package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the git version of this build, set by the linker:
//
//	go build -ldflags "-X main.version=$(git describe --always --dirty)" ./cmd/ferry
//
// Left empty, ferry falls back to what the Go toolchain recorded.
var version string

func newVersionCmd() *cobra.Command {
	var o outputFlag
	c := &cobra.Command{
		Use:               "version",
		Short:             "print ferry's version, Go version and platform",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return writeVersion(c.OutOrStdout(), buildVersion(), o.format)
		},
	}
	o.add(c, outJSON, outYAML)
	return c
}

// versionInfo is what `ferry version` prints.
type versionInfo struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func writeVersion(w io.Writer, v string, format string) error {
	info := versionInfo{Version: v, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if isObject(format) {
		return writeObject(w, info, format)
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
