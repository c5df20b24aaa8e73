package media

import (
	"fmt"
	"os"

	"github.com/ferry-edge/ferry/bundle"
)

// Bundles are the medium's candidates as the agent reads them: through
// the files Open opened on the stick (their /proc/self/fd paths, valid
// until Close), never by their paths on it, so that a file swapped on the
// stick after it was checked is never read; a candidate the stick's files
// make unreadable comes Refused. A raw device is read as its device node.
func (m *Medium) Bundles() []bundle.Source {
	var out []bundle.Source
	for _, c := range m.Candidates {
		src := bundle.Source{Path: c.TarPath, Raw: c.Raw, Refused: c.Err}
		if !c.Raw {
			src.Label, src.Path = c.TarPath, fdPath(c.Tar)
			src.SHA256Path, src.SigPath = fdPath(c.SHA256), fdPath(c.Sig)
		}
		out = append(out, src)
	}
	return out
}

// fdPath names an open file for this process ("" for none): opening it
// opens that file again, whatever is on the stick at its path by then.
func fdPath(f *os.File) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd())
}
