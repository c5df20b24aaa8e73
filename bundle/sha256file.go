package bundle

import "strings"

// FormatSHA256File is the content of upgrade-<version>-<arch>.sha256 for a
// tar whose digest is digestHex (64 lowercase hex, with or without a
// "sha256:" prefix): `sha256sum` format, so `sha256sum -c` checks it.
func FormatSHA256File(digestHex, tarBase string) string {
	return strings.ToLower(strings.TrimPrefix(digestHex, "sha256:")) + "  " + tarBase + "\n"
}
