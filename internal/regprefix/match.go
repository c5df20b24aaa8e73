// Package regprefix matches image names against registries.conf prefixes
// as containers/image (sysregistriesv2) does, so that ferry picks the
// entry CRI-O and podman pick: the drop-in ferry writes and the places
// registry mode fetches from both depend on it.
//
// It is a copy of refMatchingPrefix rather than a call: sysregistriesv2
// exports only FindRegistry, which reads the whole registries.conf.d
// (ferry's own drop-in included, which ferry must leave out) into a
// process-wide cache; match_test.go checks this copy against it.
package regprefix

import "strings"

// Match is how much of ref (a registry, repository or image reference
// starting with its host) prefix stands for, the part a location
// replaces, or -1 when prefix does not match ref. A prefix "*.domain"
// matches any host under domain (not domain itself), and only a host.
func Match(ref, prefix string) int {
	if strings.HasPrefix(prefix, "*.") {
		// containers/image's refMatchingSubdomainPrefix: the first
		// occurrence of ".domain", in the host, ending it.
		i := strings.Index(ref, prefix[1:])
		if i == -1 || strings.Contains(ref[:i], "/") {
			return -1
		}
		i += len(prefix) - 1
		if i == len(ref) || strings.ContainsRune(":/@", rune(ref[i])) {
			return i
		}
		return -1
	}
	switch {
	case ref == prefix:
		return len(prefix)
	case len(ref) > len(prefix) && strings.HasPrefix(ref, prefix) && strings.ContainsRune(":/@", rune(ref[len(prefix)])):
		return len(prefix)
	}
	return -1
}
