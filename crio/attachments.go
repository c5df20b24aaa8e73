package crio

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// AttachmentsName is ferry's file in registries.d. containers/image looks
// up use-sigstore-attachments for the location it actually pulls from
// (ferry's mirror, 127.0.0.1:<port>), not for the image's own name, and
// the MCO writes no entry for it: without this file CRI-O never reads the
// signatures the bundle carries, and a node whose policy requires them
// refuses the release.
const AttachmentsName = "pin-upgrade.yaml"

// registriesD is the part of a registries.d file ferry reads and writes.
type registriesD struct {
	Docker map[string]struct {
		UseSigstoreAttachments bool `yaml:"use-sigstore-attachments"`
	} `yaml:"docker"`
}

// AttachmentsConf is ferry's registries.d file for the embedded registry
// at addr: its one namespace, with sigstore attachments on.
func AttachmentsConf(addr, label string) []byte {
	return fmt.Appendf(nil, `# Written by ferry for bundle %s: the embedded registry at %s (the
# mirror in registries.conf.d/%s) serves the bundle's sigstore signatures
# (cosign's sha256-<hex>.sig tags). Removed when the bundle is cleaned up.
docker:
  %q:
    use-sigstore-attachments: true
`, label, addr, DropinName, addr)
}

// checkAttachmentsFree refuses when another registries.d file defines
// addr too: containers/image refuses every pull on the node when one
// namespace is defined in two files.
func (d *Dropins) checkAttachmentsFree(addr string) error {
	if d.RegistriesD == "" {
		return nil
	}
	names, err := sortedNames(d.RegistriesD, func(e os.DirEntry) bool {
		return e.Name() != AttachmentsName && strings.HasSuffix(e.Name(), ".yaml")
	})
	if err != nil {
		return err
	}
	for _, n := range names {
		p := filepath.Join(d.RegistriesD, n)
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrDropin, err)
		}
		var c registriesD
		if err := yaml.Unmarshal(b, &c); err != nil {
			return fmt.Errorf("%w: %s is not valid YAML, so CRI-O cannot pull anything either: fix or remove it: %v", ErrDropin, p, err)
		}
		if _, ok := c.Docker[addr]; ok {
			return fmt.Errorf("%w: %s already configures %s, ferry's embedded registry: a namespace in two registries.d files breaks every pull on the node: remove that entry or set registry.port to another port",
				ErrDropin, p, addr)
		}
	}
	return nil
}

// writeAttachments writes ferry's registries.d file (none without a
// RegistriesD): before the mirror appears, so that no pull through it
// misses the signatures.
func (d *Dropins) writeAttachments(addr, label string) (bool, error) {
	if d.RegistriesD == "" {
		return false, nil
	}
	changed, err := writeIfChanged(filepath.Join(d.RegistriesD, AttachmentsName), AttachmentsConf(addr, label), 0o644)
	if err != nil {
		return false, fmt.Errorf("%w: registries.d: %v", ErrDropin, err)
	}
	return changed, nil
}

// removeAttachments removes ferry's registries.d file.
func (d *Dropins) removeAttachments() (bool, error) {
	if d.RegistriesD == "" {
		return false, nil
	}
	return removeIfExists(filepath.Join(d.RegistriesD, AttachmentsName))
}
