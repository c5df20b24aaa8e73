package peer_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/peer/peertest"
)

func TestNode_ConformsToThePeerSuite(t *testing.T) {
	peertest.Run(t, func(t *testing.T) (peertest.Peers, peertest.Peers, string) {
		srcShelf := peer.NewShelf(peer.ShelfOptions{})
		srv := httptest.NewServer(peer.NewServer(srcShelf, peer.ServerOptions{
			Status: func() peer.Status { return peer.Status{Node: "a", Phase: "loaded"} }}))
		addr := strings.TrimPrefix(srv.URL, "http://")
		dstShelf := peer.NewShelf(peer.ShelfOptions{})
		t.Cleanup(func() { srv.Close(); srcShelf.Close(); dstShelf.Close() })
		src := peer.Node{Shelf: srcShelf, Fetcher: peer.NewFetcher(peer.FetcherOptions{})}
		dst := peer.Node{Shelf: dstShelf, Fetcher: peer.NewFetcher(peer.FetcherOptions{Peers: []string{addr}, Shelf: dstShelf})}
		return src, dst, addr
	})
}
