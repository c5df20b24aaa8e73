package agent

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxReason bounds a reason (and every other piece of text from a stick,
// a bundle or the cluster) that leaves the node: the STATUS= line, the
// Node's annotations, what the peers are told. ferry's own longest
// reasons (no room: the sizes, the thresholds and what to free) fit,
// with their fix at the end.
const MaxReason = 512

// maxLine bounds the whole STATUS= line, which joins a bundle's name and a
// reason.
const maxLine = 2 * MaxReason

// SanitizeReason makes s fit to publish (see MaxReason): one line of
// printable text, at most MaxReason bytes, cut with an ellipsis.
func SanitizeReason(s string) string { return sanitizeText(s, MaxReason) }

// sanitizeText makes s one line of printable text of at most max bytes:
// newlines, tabs and other whitespace runs become one space, control
// and other unprintable characters (bidi overrides, invalid UTF-8) are
// dropped, and a longer text is cut at a character boundary and ends
// with "…". It is idempotent.
func sanitizeText(s string, max int) string {
	var b strings.Builder
	b.Grow(min(len(s), max))
	space := false
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == utf8.RuneError && n <= 1:
			continue
		case unicode.IsSpace(r):
			space = b.Len() > 0
			continue
		case !unicode.IsPrint(r):
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
		if b.Len() > max+utf8.UTFMax {
			break // enough to know it is cut
		}
	}
	out := b.String()
	if len(out) <= max {
		return out
	}
	const ellipsis = "…"
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(out[cut]) {
		cut--
	}
	return strings.TrimRight(out[:cut], " ") + ellipsis
}
