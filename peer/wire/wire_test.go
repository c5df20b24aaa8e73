package wire

import (
	"bytes"
	"encoding/json"
	"testing"
)

// An offer's metadata travels as the JSON it is, as json.RawMessage
// carries it: inline, kept byte for byte, "null" when absent.
func TestRawJSON_AsRawMessage(t *testing.T) {
	meta := []byte(`{"version":"4.19.8","arch":"x86_64"}`)
	for _, m := range [][]byte{meta, nil} {
		got, err := json.Marshal(Offer{Digest: "sha256:00", Metadata: m})
		if err != nil {
			t.Fatal(err)
		}
		inline := "null"
		if m != nil {
			inline = string(m)
		}
		want := `{"digest":"sha256:00","metadata":` + inline + `,"size":0,"pieceSize":0,"complete":false}`
		if string(got) != want {
			t.Errorf("offer with metadata %s:\n got %s\nwant %s", m, got, want)
		}
		var back Offer
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		if m != nil && !bytes.Equal(back.Metadata, m) {
			t.Errorf("metadata read back as %s, want %s", back.Metadata, m)
		}
	}
}
