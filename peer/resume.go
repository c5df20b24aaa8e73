package peer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// fetchState is the resume record next to the destination file.
type fetchState struct {
	Pieces *PieceList      `json:"pieceList"`
	Meta   json.RawMessage `json:"metadata"`
	Have   Have            `json:"have"`
	// Stream: where a streaming fetch's extraction had got to.
	Stream *StreamResume `json:"stream,omitempty"`
}

// StatePath is where Fetch keeps its resume record for dest.
func StatePath(dest string) string { return dest + ".state" }

// loadState reads dest's resume record; os.ErrNotExist when there is
// none, another error when it does not fit this bundle.
func (j *job) loadState() (*fetchState, error) {
	b, err := os.ReadFile(StatePath(j.dest))
	if err != nil {
		return nil, err
	}
	var st fetchState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	if st.Pieces == nil {
		return nil, errors.New("no piece list")
	}
	if err := st.Pieces.Validate(); err != nil {
		return nil, err
	}
	if st.Pieces.Digest != j.digest {
		return nil, fmt.Errorf("record is for %s", st.Pieces.Digest)
	}
	if !st.Have.valid() || st.Have.Pieces != st.Pieces.N() {
		return nil, errors.New("bitmap does not fit the piece list")
	}
	return &st, nil
}

// saveState syncs the file, then records what it holds (for a stream:
// what its extraction kept).
func (j *job) saveState() error {
	if err := j.file.Sync(); err != nil {
		return err
	}
	st := fetchState{Pieces: j.pl, Meta: j.meta, Have: j.mine}
	if j.stream != nil {
		st.Have, st.Stream = j.stream.record(j.mine)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(StatePath(j.dest), b, 0o600)
}
