package watch

import (
	"sync"
	"time"
	"unsafe"
)

// The manifests of an informer's compact objects are its bulk (about 1.2 KB each for 1 KiB
// ConfigMaps). Each its own allocation, a stream that replaces them one at a time leaves them
// spread over partly used heap spans, which Go's collector never moves and cannot return; and
// each is rounded up to its allocation size class. So they are packed into shared chunks
// instead, and once the informer is idle and the chunks hold much more than its live
// manifests, the live ones are copied into fresh chunks and the old ones become garbage whole.

// arenaChunkSize is the size of a chunk; a manifest larger than a quarter of it is allocated
// on its own.
const arenaChunkSize = 64 << 10

// arenaIdle is how long an informer goes without a new manifest before its chunks are checked.
const arenaIdle = 5 * time.Second

// manifestArena packs manifests into append-only chunks. Bytes once written are never written
// again, so a manifest handed out stays valid whatever happens to the arena.
type manifestArena struct {
	mu        sync.Mutex
	chunk     []byte // the chunk being filled; len is what is used
	allocated int    // bytes handed out since the last repack
	last      time.Time
	timer     *time.Timer
	// idle is called once no manifest was added for idleAfter (arenaIdle when zero); nil: never.
	idle      func()
	idleAfter time.Duration
}

func (a *manifestArena) idleTime() time.Duration {
	if a.idleAfter > 0 {
		return a.idleAfter
	}
	return arenaIdle
}

// add returns a copy of b that lives in the arena.
func (a *manifestArena) add(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = time.Now()
	if a.idle != nil && a.timer == nil {
		a.timer = time.AfterFunc(a.idleTime(), a.checkIdle)
	}
	return a.addLocked(b)
}

func (a *manifestArena) addLocked(b []byte) string {
	if len(b) > arenaChunkSize/4 {
		return string(b)
	}
	a.allocated += len(b)
	if cap(a.chunk)-len(a.chunk) < len(b) {
		a.chunk = make([]byte, 0, arenaChunkSize)
	}
	at := len(a.chunk)
	a.chunk = append(a.chunk, b...)
	return unsafe.String(&a.chunk[at], len(b))
}

// checkIdle runs a.idle once no manifest was added for the idle time, else waits again.
func (a *manifestArena) checkIdle() {
	a.mu.Lock()
	wait := a.idleTime() - time.Since(a.last)
	if a.idle == nil { // stopped
		a.mu.Unlock()
		return
	}
	if wait > 0 {
		a.timer.Reset(wait)
		a.mu.Unlock()
		return
	}
	a.timer = nil
	idle := a.idle
	a.mu.Unlock()
	idle()
}

// wasteful reports whether the chunks hold much more than live bytes of manifests: more than a
// quarter more, and more than a chunk.
func (a *manifestArena) wasteful(live int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.allocated-live > live/4 && a.allocated-live > arenaChunkSize
}

// repack copies the manifests *ms point to into fresh chunks and points them there. The caller
// holds every reader of *ms off while it runs; views handed out before stay valid.
func (a *manifestArena) repack(ms []*string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.chunk, a.allocated = nil, 0
	for _, m := range ms {
		if len(*m) > 0 && len(*m) <= arenaChunkSize/4 {
			*m = a.addLocked(unsafe.Slice(unsafe.StringData(*m), len(*m)))
		}
	}
}

// stop cancels a pending idle check.
func (a *manifestArena) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	a.idle = nil
}
