package crio_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/crio/critest"
)

const (
	refA = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	refB = "quay.io/my-company/app@sha256:2222222222222222222222222222222222222222222222222222222222222222"
	refX = "quay.io/nowhere/none@sha256:3333333333333333333333333333333333333333333333333333333333333333"
)

// dialFake is a Client on the gRPC fake, on which refX cannot be pulled.
func dialFake(t *testing.T) (*crio.Client, *critest.Fake) {
	fake := critest.NewFake(t)
	fake.Unpullable(refX)
	c, err := crio.Dial(fake.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, fake
}

func TestClient_ConformsAgainstFake(t *testing.T) {
	c, fake := dialFake(t)
	critest.RunImageServiceSuite(t, c, critest.Env{
		Pullable: []string{refA, refB},
		Absent:   refX,
		Pin:      func(t *testing.T, refs ...string) { fake.SetPins(refs...) },
	})
}

func TestClient_NoCRIOIsErrUnavailable(t *testing.T) {
	c, err := crio.Dial(filepath.Join(t.TempDir(), "missing.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _, err = c.Status(t.Context(), refA)
	if !errors.Is(err, crio.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
	t.Log(err)
}

// CRI-O answers a pull the registry cannot serve with codes.Unknown and
// containers/image's words; the Client turns them into a kind of
// failure that the Runtime decides on with errors.Is.
func TestClient_APullTheRegistryLacksIsErrImageMissing(t *testing.T) {
	c, _ := dialFake(t)
	_, err := c.Pull(t.Context(), refX)
	if !errors.Is(err, crio.ErrImageMissing) || errors.Is(err, crio.ErrImageRejected) || !strings.Contains(err.Error(), "manifest unknown") {
		t.Fatalf("got %v, want ErrImageMissing keeping CRI-O's words", err)
	}
	if _, err := c.Pull(t.Context(), refA); err != nil {
		t.Fatal(err)
	}
}
