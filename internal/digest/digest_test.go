package digest

import (
	"crypto/sha256"
	"testing"

	godigest "github.com/opencontainers/go-digest"
)

// FromSHA256 and Encoded say what go-digest says of the same bytes.
func TestFromSHA256_AsGoDigest(t *testing.T) {
	for _, b := range []string{"", "ferry", "\x00\xff\x10"} {
		sum := sha256.Sum256([]byte(b))
		got, want := FromSHA256(sum[:]), godigest.FromBytes([]byte(b))
		if string(got) != string(want) {
			t.Errorf("FromSHA256(sha256(%q)) = %s, go-digest says %s", b, got, want)
		}
		if got.Encoded() != want.Encoded() || got.String() != want.String() {
			t.Errorf("Encoded/String of %s: %s %s, go-digest says %s %s", got, got.Encoded(), got.String(), want.Encoded(), want.String())
		}
	}
}
