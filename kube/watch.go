package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Watches, as client-go's reflector makes them: list once, then watch
// from the list's resourceVersion; a watch the server ends is watched on
// from the last resourceVersion seen (bookmarks keep it fresh), a 410 Gone
// lists again, any other failure waits with backoff and jitter, or as
// long as the server's Retry-After asks.

// ErrGone means the resourceVersion a watch asked for is no longer kept
// (410 Gone, "too old resource version"): list again.
var ErrGone = errors.New("the cluster's API no longer keeps that resourceVersion: list again")

// Event is one change a watch reports: Type ADDED, MODIFIED, DELETED or
// BOOKMARK (Object then carries only metadata.resourceVersion).
type Event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Watch streams the changes of the collection at path (fieldSelector ""
// for all of it) after resourceVersion rv to fn, until the server ends the
// watch (after about timeout: nil), ctx ends, fn fails, or the server
// sends an ERROR event (its Status as an *APIError; a 410 is ErrGone).
func (c *Client) Watch(ctx context.Context, path, fieldSelector, rv string, timeout time.Duration, fn func(Event) error) error {
	q := url.Values{"watch": {"1"}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {strconv.Itoa(int(timeout / time.Second))}}
	if rv != "" {
		q.Set("resourceVersion", rv)
	}
	if fieldSelector != "" {
		q.Set("fieldSelector", fieldSelector)
	}
	// The server ends the watch after timeout; this ends one whose
	// connection died without a word.
	wctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
	defer cancel()
	req, err := c.request(wctx, "GET", path+"?"+q.Encode(), "", nil)
	if err != nil {
		return err
	}
	resp, err := c.stream.Do(req)
	if err != nil {
		return fmt.Errorf("the cluster's API at %s cannot be reached: %w", c.ep.server, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return answerError(resp, b)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev Event
		if err := dec.Decode(&ev); err == io.EOF {
			return nil
		} else if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watching %s: %w", path, err)
		}
		if ev.Type == "ERROR" {
			return statusError(ev.Object, 0)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// Signal tells whoever waits that something changed: the channel C
// returns is closed at the next Fire.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// C is closed at the next Fire.
func (s *Signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Fire wakes every reader of C.
func (s *Signal) Fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// Informer keeps a copy of a collection's objects (those a field
// selector picks) up to date with a watch, and fires a Signal at each
// change.
type Informer struct {
	c        *Client
	path     string
	selector string
	changed  *Signal
	also     *Signal // fired with changed when not nil, and alsoKey says so (Also)
	alsoKey  func(json.RawMessage) string
	lastKey  string

	mu     sync.Mutex
	objs   map[string]json.RawMessage // by metadata.name
	synced bool                       // listed, and the watch not refused since
	gen    uint64                     // counts the copy's changes (Gen)
}

// Inform makes an Informer of the collection at path; Run runs it.
func (c *Client) Inform(path, fieldSelector string, changed *Signal) *Informer {
	return &Informer{c: c, path: path, selector: fieldSelector, changed: changed}
}

// Also has i fire s too at each change that changes key of one of its
// objects (before Run).
func (i *Informer) Also(s *Signal, key func(json.RawMessage) string) *Informer {
	i.also, i.alsoKey = s, key
	return i
}

// Gen counts the changes of i's copy: a reader that decodes it whole can
// keep what it decoded while Gen stays.
func (i *Informer) Gen() uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.gen
}

// fire wakes the readers of i's signals.
func (i *Informer) fire() {
	i.mu.Lock()
	i.gen++
	i.mu.Unlock()
	i.changed.Fire()
	if i.also == nil {
		return
	}
	i.mu.Lock()
	names := slices.Sorted(maps.Keys(i.objs))
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n + "\x00" + i.alsoKey(i.objs[n]) + "\x00")
	}
	changed := b.String() != i.lastKey
	i.lastKey = b.String()
	i.mu.Unlock()
	if changed {
		i.also.Fire()
	}
}

// The bounds of a watch's length and of the waits after a failure, as
// client-go's (a watch of 5 to 10 minutes; 0.8 s doubling to 30 s).
var (
	watchMin     = 5 * time.Minute
	backoffFirst = 800 * time.Millisecond
	backoffMax   = 30 * time.Second
)

// Run lists and watches until ctx ends.
func (i *Informer) Run(ctx context.Context) {
	rv, wait, lastErr := "", backoffFirst, ""
	fail := func(err error) {
		if err.Error() != lastErr {
			i.c.log.Warn("kube: cannot follow "+i.path+"; trying again", "selector", i.selector, "err", err)
			lastErr = err.Error()
		}
		select {
		case <-time.After(retryWait(wait, err)):
		case <-ctx.Done():
		}
		wait = min(2*wait, backoffMax)
	}
	quorum := false
	for ctx.Err() == nil {
		if rv == "" {
			var err error
			if rv, err = i.list(ctx, quorum); err != nil {
				if ctx.Err() == nil {
					fail(err)
				}
				continue
			}
		}
		timeout := watchMin + rand.N(watchMin)
		err := i.c.Watch(ctx, i.path, i.selector, rv, timeout, func(ev Event) error {
			var err error
			rv, err = i.apply(ev, rv)
			wait, lastErr = backoffFirst, ""
			return err
		})
		switch {
		case ctx.Err() != nil:
		case err == nil:
			// The server ended it: watch on from rv.
		case errors.Is(err, ErrGone):
			i.c.log.Debug("kube: resourceVersion expired; listing again", "path", i.path)
			// The watch cache may be behind what the watch saw: this
			// list reads etcd, so the copy never goes back in time.
			rv, quorum = "", true
		default:
			if errors.Is(err, ErrForbidden) {
				// Listed but not watched: the reads ask the API again.
				i.mu.Lock()
				i.synced = false
				i.mu.Unlock()
				rv = ""
			}
			fail(err)
		}
	}
}

type meta struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
}

// list reads the whole collection and replaces the copy with it. As
// client-go's reflector, it asks with resourceVersion=0, which the API
// server answers from its watch cache instead of a quorum read of etcd;
// quorum asks etcd (after a 410, when the cache may lag the watch).
func (i *Informer) list(ctx context.Context, quorum bool) (string, error) {
	q := url.Values{}
	if i.selector != "" {
		q.Set("fieldSelector", i.selector)
	}
	if !quorum {
		q.Set("resourceVersion", "0")
	}
	path := i.path
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := i.c.do(ctx, "GET", path, "", nil, &list); err != nil {
		return "", err
	}
	objs := map[string]json.RawMessage{}
	for _, o := range list.Items {
		var m meta
		if err := json.Unmarshal(o, &m); err != nil {
			return "", fmt.Errorf("listing %s: %w", i.path, err)
		}
		objs[m.Metadata.Name] = o
	}
	i.mu.Lock()
	i.objs, i.synced = objs, true
	i.mu.Unlock()
	i.fire()
	return list.Metadata.ResourceVersion, nil
}

// apply takes one event into the copy; it returns the resourceVersion to
// watch on from.
func (i *Informer) apply(ev Event, rv string) (string, error) {
	var m meta
	if err := json.Unmarshal(ev.Object, &m); err != nil {
		return rv, fmt.Errorf("watching %s: a %s event: %w", i.path, ev.Type, err)
	}
	if m.Metadata.ResourceVersion != "" {
		rv = m.Metadata.ResourceVersion
	}
	i.mu.Lock()
	switch ev.Type {
	case "ADDED", "MODIFIED":
		i.objs[m.Metadata.Name] = ev.Object
	case "DELETED":
		delete(i.objs, m.Metadata.Name)
	default: // BOOKMARK: the resourceVersion only
		i.mu.Unlock()
		return rv, nil
	}
	i.mu.Unlock()
	i.fire()
	return rv, nil
}

// Get is the object named name as last seen (found false when there is
// none); synced is false until the first list came back.
func (i *Informer) Get(name string) (obj json.RawMessage, found, synced bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	obj, found = i.objs[name]
	return obj, found, i.synced
}

// List is every object as last seen; synced as Get's.
func (i *Informer) List() (objs []json.RawMessage, synced bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, o := range i.objs {
		objs = append(objs, o)
	}
	return objs, i.synced
}
