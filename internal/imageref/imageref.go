// Package imageref splits an image reference the one way ferry does,
// for the bundle (which writes and reads references) and CRI-O's drop-ins
// (which mirror and pin them) alike.
package imageref

import "strings"

// Split splits name[:tag][@sha256:hex] into its name, tag ("" if none)
// and digest ("" if none). A port in the registry's host is part of the
// name ("host:5000/a/b:v1" is name "host:5000/a/b", tag "v1").
func Split(ref string) (name, tag, digest string) {
	name, digest, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	return name, tag, digest
}
