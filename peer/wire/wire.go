// Package wire holds what the peers say to each other that the agent's
// state machine reads: a node's offers and its status, and the errors it
// tells them apart by. Package peer carries them; this leaf has no client
// and no server, so the machine reads them without linking either.
package wire

import (
	"errors"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Offer is one bundle a node serves, whole or in part.
type Offer struct {
	Digest    digest.Digest `json:"digest"`
	Metadata  RawJSON       `json:"metadata"`
	Size      int64         `json:"size"`
	PieceSize int64         `json:"pieceSize"`
	// Complete is true when the node holds every byte verified.
	Complete bool `json:"complete"`
	// Signature is the bundle's .minisig, when it came with one: each
	// node applies its own trusted_keys to it (approval travels).
	Signature []byte `json:"signature,omitempty"`
}

// RawJSON is JSON kept as it came, as json.RawMessage keeps it; its own
// type so that wire links no encoding/json (the agent's state machine
// reads this package). The agent parses it (bundle.ParseMetadata).
type RawJSON []byte

// MarshalJSON returns m as it is ("null" when empty).
func (m RawJSON) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil
	}
	return m, nil
}

// UnmarshalJSON keeps a copy of data.
func (m *RawJSON) UnmarshalJSON(data []byte) error {
	if m == nil {
		return errors.New("wire.RawJSON: UnmarshalJSON on nil pointer")
	}
	*m = append((*m)[0:0], data...)
	return nil
}

// Status is what a node reports about itself on /v1/status. The agent
// fills it and reads it (its cluster gate); peer only carries it.
type Status struct {
	Node    string        `json:"node"`
	Phase   string        `json:"phase"`
	Digest  digest.Digest `json:"digest,omitempty"`
	Version string        `json:"version,omitempty"`
	Release string        `json:"release,omitempty"`
	// Source is true on the node the stick was plugged into.
	Source bool   `json:"source,omitempty"`
	Error  string `json:"error,omitempty"`
	// Progress is the node's progress in words ("6.7/16.0 GiB",
	// "120/183 images").
	Progress string `json:"progress,omitempty"`
	// LoadsNothing is true on a node with no CRI-O (crio.socket = ""): it
	// verifies, extracts and shares, and never reaches loaded.
	LoadsNothing bool `json:"loadsNothing,omitempty"`
}

// PeerStatus is one peer's answer to /v1/status, or why there is none.
type PeerStatus struct {
	Status
	// Verified is the node the peer's serving certificate names (TLS
	// with node identities), which its Node must be; "" over the token,
	// where Node is only the peer's word.
	Verified string
	Err      error
}

// ErrNodeMismatch is a peer whose status names another node than its
// certificate does.
var ErrNodeMismatch = errors.New("the peer's status names another node than its certificate")

// ErrUnauthorized: the peer refused our token (or we sent none).
var ErrUnauthorized = errors.New("peer refused the token")

// PeerOffer is an offer and the peer that made it.
type PeerOffer struct {
	Peer string `json:"peer"`
	Offer
}
