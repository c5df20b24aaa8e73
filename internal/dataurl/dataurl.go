// Package dataurl decodes the data URLs Ignition (a MachineConfig) carries
// its files in: percent-encoded or base64. The tests that read the shipped
// MachineConfigs use it.
package dataurl

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
)

// Decode returns the bytes of u, a data: URL.
func Decode(u string) ([]byte, error) {
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return nil, fmt.Errorf("%.40q is not a data URL", u)
	}
	header, data, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, fmt.Errorf("%.40q: a data URL without a comma", u)
	}
	if strings.HasSuffix(header, ";base64") {
		return base64.StdEncoding.DecodeString(data)
	}
	s, err := url.PathUnescape(data)
	return []byte(s), err
}
