package critest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/crio"
)

// Env is what the suite needs from the service under test.
type Env struct {
	// Pullable are at least two references the service can pull, none of
	// them present before the suite runs.
	Pullable []string
	// Absent is a well-formed reference that cannot be pulled.
	Absent string
	// Pin makes exactly refs pinned (an empty list unpins all the suite's
	// images), the way a pinned_images drop-in and a reload do. It may
	// return before the service applies it: the suite polls.
	Pin func(t *testing.T, refs ...string)
	// PinWait bounds the poll for a pin change; default 30s.
	PinWait time.Duration
}

// RunImageServiceSuite checks that svc behaves as the loader expects of
// CRI-O's image service.
func RunImageServiceSuite(t *testing.T, svc crio.ImageService, env Env) {
	if len(env.Pullable) < 2 || env.Absent == "" || env.Pin == nil {
		t.Fatal("critest: Env needs two Pullable refs, Absent and Pin")
	}
	if env.PinWait == 0 {
		env.PinWait = 30 * time.Second
	}
	a, b := env.Pullable[0], env.Pullable[1]

	t.Run("StatusOfUnpulledImageIsAbsentNotError", func(t *testing.T) {
		present, pinned, err := svc.Status(t.Context(), a)
		if err != nil || present || pinned {
			t.Fatalf("Status(%s) = %v, %v, %v; want absent, no error", a, present, pinned, err)
		}
	})
	t.Run("PullMakesImagePresentAndListed", func(t *testing.T) {
		for _, ref := range []string{a, b} {
			if _, err := svc.Pull(t.Context(), ref); err != nil {
				t.Fatalf("Pull(%s): %v", ref, err)
			}
			present, _, err := svc.Status(t.Context(), ref)
			if err != nil || !present {
				t.Fatalf("after pull, Status(%s) = present %v, %v", ref, present, err)
			}
		}
		imgs, err := svc.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, ref := range []string{a, b} {
			if !listed(imgs, ref) {
				t.Errorf("List lacks %s", ref)
			}
		}
	})
	t.Run("PullTwiceIsFine", func(t *testing.T) {
		if _, err := svc.Pull(t.Context(), a); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("PullOfMissingImageFails", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		if _, err := svc.Pull(ctx, env.Absent); err == nil {
			t.Fatalf("Pull(%s) succeeded", env.Absent)
		}
		if present, _, err := svc.Status(t.Context(), env.Absent); err != nil || present {
			t.Fatalf("after failed pull Status = %v, %v", present, err)
		}
	})
	t.Run("PullWithCancelledContextFails", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := svc.Pull(ctx, a); err == nil {
			t.Fatal("Pull with a cancelled context succeeded")
		}
	})
	t.Run("PinShowsInStatusAndList", func(t *testing.T) {
		env.Pin(t, a)
		waitPinned(t, svc, a, true, env.PinWait)
		if _, pinned, _ := svc.Status(t.Context(), b); pinned {
			t.Errorf("%s pinned without a pin", b)
		}
		imgs, err := svc.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range imgs {
			if has(img, a) && !img.Pinned {
				t.Errorf("List shows %s unpinned", a)
			}
		}
	})
	t.Run("ReplacedPinListUnpins", func(t *testing.T) {
		env.Pin(t, b)
		waitPinned(t, svc, a, false, env.PinWait)
		waitPinned(t, svc, b, true, env.PinWait)
		env.Pin(t)
		waitPinned(t, svc, b, false, env.PinWait)
	})
}

func waitPinned(t *testing.T, svc crio.ImageService, ref string, want bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		present, pinned, err := svc.Status(t.Context(), ref)
		if err == nil && present && pinned == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: pinned=%v (present %v, err %v) after %s, want pinned=%v", ref, pinned, present, err, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func listed(imgs []crio.Image, ref string) bool {
	for _, img := range imgs {
		if has(img, ref) {
			return true
		}
	}
	return false
}

func has(img crio.Image, ref string) bool {
	return slices.Contains(img.RepoTags, ref) || slices.Contains(img.RepoDigests, ref)
}
