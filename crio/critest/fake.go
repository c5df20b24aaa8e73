// Package critest holds the conformance suite for crio.ImageService and an
// in-process CRI server over k8s.io/cri-api's FakeImageService to run it
// against without CRI-O.
package critest

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	critesting "k8s.io/cri-api/pkg/apis/testing"
)

// Fake is a CRI image service on a unix socket, backed by
// critesting.FakeImageService. Like CRI-O, it computes Pinned when asked
// (the upstream fake fixes it at pull time), and refuses to pull the refs
// marked Unpullable, as a registry without the image would.
type Fake struct {
	*critesting.FakeImageService
	Socket string

	mu         sync.Mutex
	unpullable map[string]bool
	pullHook   func(ref string) error
}

// NewFake serves a fake CRI image service on a socket in t.TempDir()
// until the test ends.
func NewFake(t testing.TB) *Fake {
	t.Helper()
	f := &Fake{
		FakeImageService: critesting.NewFakeImageService(),
		Socket:           filepath.Join(t.TempDir(), "cri.sock"),
		unpullable:       map[string]bool{},
	}
	ln, err := net.Listen("unix", f.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterImageServiceServer(srv, &imageServer{f: f})
	runtimeapi.RegisterRuntimeServiceServer(srv, &runtimeServer{})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return f
}

// Unpullable makes pulls of ref fail.
func (f *Fake) Unpullable(ref string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unpullable[ref] = true
}

// OnPull sets a hook run before every pull; an error it returns is the
// pull's answer.
func (f *Fake) OnPull(hook func(ref string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pullHook = hook
}

// SetPins replaces the pinned set, as a reload with a new pinned_images
// list does.
func (f *Fake) SetPins(refs ...string) {
	f.Lock()
	f.Pinned = map[string]bool{}
	f.Unlock()
	for _, r := range refs {
		f.SetFakeImagePinned(r, true)
	}
}

func (f *Fake) pinned(img *runtimeapi.Image) *runtimeapi.Image {
	if img == nil {
		return nil
	}
	f.Lock()
	defer f.Unlock()
	c := &runtimeapi.Image{Id: img.Id, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests, Size: img.Size, Spec: img.Spec}
	for _, n := range append(append([]string(nil), img.RepoTags...), img.RepoDigests...) {
		if f.Pinned[n] {
			c.Pinned = true
		}
	}
	return c
}

type imageServer struct {
	runtimeapi.UnimplementedImageServiceServer
	f *Fake
}

func (s *imageServer) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	imgs, err := s.f.FakeImageService.ListImages(ctx, req.GetFilter())
	if err != nil {
		return nil, err
	}
	out := make([]*runtimeapi.Image, len(imgs))
	for i, img := range imgs {
		out[i] = s.f.pinned(img)
	}
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

func (s *imageServer) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	resp, err := s.f.FakeImageService.ImageStatus(ctx, req.GetImage(), req.GetVerbose())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ImageStatusResponse{Image: s.f.pinned(resp.GetImage())}, nil
}

func (s *imageServer) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	s.f.mu.Lock()
	bad, hook := s.f.unpullable[ref], s.f.pullHook
	s.f.mu.Unlock()
	if hook != nil {
		if err := hook(ref); err != nil {
			return nil, err
		}
	}
	if bad {
		return nil, status.Errorf(codes.Unknown, "initializing source docker://%s: reading manifest: manifest unknown", ref)
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	id, err := s.f.FakeImageService.PullImage(ctx, req.GetImage(), req.GetAuth(), req.GetSandboxConfig())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PullImageResponse{ImageRef: id}, nil
}

func (s *imageServer) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	if err := s.f.FakeImageService.RemoveImage(ctx, req.GetImage()); err != nil {
		return nil, err
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

type runtimeServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (runtimeServer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "0.0.0", RuntimeApiVersion: "v1"}, nil
}
