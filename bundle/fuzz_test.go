package bundle

import (
	"os"
	"path/filepath"
	"testing"
)

func FuzzParseMetadata(f *testing.F) {
	f.Add([]byte(`{"formatVersion":1,"version":"4.13.7","arch":"x86_64","size":"1 KiB","sizeBytes":1024,"release":"quay.io/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","images":[]}`))
	f.Add([]byte(`{"formatVersion":3}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMetadata(b)
		if err == nil {
			if ValidateMetadata(m) != nil {
				t.Fatal("parsed metadata does not validate")
			}
			if m.Name() == "" || len(m.AllImages()) != len(m.Images)+1 {
				t.Fatal("bad derived names")
			}
		}
	})
}

// FuzzVerify walks arbitrary bytes as a bundle whose .sha256 matches, so
// every byte reaches the tar walk; nothing may panic or escape the dir.
func FuzzVerify(f *testing.F) {
	f.Add(writeBundle(f, testMetadata(1<<20), validEntries()))
	f.Add(writeBundle(f, testMetadata(1<<20), append(validEntries(), file("../x", "y"))))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		src := stage(t, b, "")
		dest := filepath.Join(t.TempDir(), "out")
		res, err := Extract(t.Context(), src, dest, Options{Policy: Policy{SpaceFactor: -1}})
		if err != nil {
			if _, serr := os.Stat(dest); serr == nil {
				t.Fatal("refused bundle left its dest")
			}
			return
		}
		if string(res.Digest) != sum(b) {
			t.Fatalf("digest %s of accepted bundle, want %s", res.Digest, sum(b))
		}
	})
}
