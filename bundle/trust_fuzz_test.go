package bundle

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseSHA256Line feeds arbitrary .sha256 file contents (they come from
// the stick) to the parser: it never panics, refuses with ErrInvalid, and
// whatever it accepts is a normalized digest named for the tar on a line
// that is really in the file.
func FuzzParseSHA256Line(f *testing.F) {
	const tar = "upgrade-4.13.7-x86_64.tar"
	hex := strings.Repeat("0123456789abcdef", 4)
	f.Add([]byte(FormatSHA256File(hex, tar)), tar)
	f.Add([]byte(hex+" *"+tar+"\r\n"), tar)
	f.Add([]byte("\n\n"+strings.Repeat("f", 64)+"  other.tar\n"+hex+"  "+tar+"\n"), tar)
	f.Add([]byte(strings.ToUpper(hex)+"  "+tar+"\n"), tar)
	f.Add([]byte(hex+"  "+tar), "")
	f.Add([]byte(hex+" "+tar+"\n"), tar)
	f.Add([]byte(strings.Repeat("a", 5000)), tar)
	f.Add([]byte{}, tar)
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		d, err := ParseSHA256Line(b, name)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if d != "" {
				t.Fatalf("digest %q returned with error %v", d, err)
			}
			return
		}
		if NormalizeDigest(string(d)) != d || !strings.HasPrefix(string(d), "sha256:") {
			t.Fatalf("accepted digest %q is not sha256:<64 lowercase hex>", d)
		}
		hexPart := strings.TrimPrefix(string(d), "sha256:")
		if !strings.Contains(string(b), hexPart+"  "+name) && !strings.Contains(string(b), hexPart+" *"+name) {
			t.Fatalf("digest %s for %q is not on any line of %q", d, name, b)
		}
	})
}
