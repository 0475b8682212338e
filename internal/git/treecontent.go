package git

import (
	"bytes"
	"io"
	"slices"

	"github.com/go-git/go-git/v5/plumbing"
)

// A commit that changes one file of a large directory writes that directory's tree again,
// identical to the old one but for one 20-byte hash: copying the whole content (34 KB for a root
// of 1,000 namespaces, 410 KB for a directory of 10,000 objects) for every commit was, with its
// garbage, a third of a commit's cost. Tree content is therefore held in pages; a patched tree
// copies the pages its new hashes fall in and shares the others with the tree it was patched
// from. Content is never modified once built, so sharing is safe.

// treePageSize is the size of a page of tree content: what a patch copies for each hash.
const treePageSize = 4096

// objectContent is the content of an object the worker wrote: in one slice (flat), in pages of
// treePageSize bytes (the last one shorter), or both, the pages being views of flat.
type objectContent struct {
	pages [][]byte
	n     int
	// flat, when set, is the whole content in one slice, of which the pages are views.
	flat []byte
}

// flatContent holds raw in one slice, without copying it; raw must not be modified afterwards.
func flatContent(raw []byte) objectContent { return objectContent{n: len(raw), flat: raw} }

// pagedContent holds raw as pages, without copying it; raw must not be modified afterwards.
func pagedContent(raw []byte) objectContent {
	c := objectContent{n: len(raw), flat: raw, pages: make([][]byte, 0, (len(raw)+treePageSize-1)/treePageSize)}
	for at := 0; at < len(raw); at += treePageSize {
		end := min(at+treePageSize, len(raw))
		c.pages = append(c.pages, raw[at:end:end])
	}
	return c
}

// paged reports whether the content is in several pages and not in one slice.
func (c objectContent) paged() bool { return c.flat == nil && len(c.pages) > 1 }

// len is the content's length in bytes.
func (c objectContent) len() int { return c.n }

// readAt copies len(dst) bytes from offset off into dst.
func (c objectContent) readAt(dst []byte, off int) {
	if c.flat != nil {
		copy(dst, c.flat[off:])
		return
	}
	for len(dst) > 0 {
		page := c.pages[off/treePageSize][off%treePageSize:]
		k := copy(dst, page)
		dst, off = dst[k:], off+k
	}
}

// writeTo writes the bytes from offset from to offset to into w.
func (c objectContent) writeTo(w io.Writer, from, to int) {
	if c.flat != nil {
		_, _ = w.Write(c.flat[from:to]) // hashes and buffers do not fail
		return
	}
	for from < to {
		page := c.pages[from/treePageSize][from%treePageSize:]
		page = page[:min(len(page), to-from)]
		_, _ = w.Write(page) // hashes and buffers do not fail
		from += len(page)
	}
}

// bytes returns the content in one slice: the content itself when it was built from one or
// fits in a page (it must not be modified), a copy otherwise.
func (c objectContent) bytes() []byte {
	if c.flat != nil || c.n == 0 {
		return c.flat
	}
	if len(c.pages) == 1 {
		return c.pages[0]
	}
	out := make([]byte, 0, c.n)
	for _, p := range c.pages {
		out = append(out, p...)
	}
	return out
}

// reader reads the content.
func (c objectContent) reader() io.Reader {
	if c.flat != nil || len(c.pages) <= 1 {
		return bytes.NewReader(c.bytes())
	}
	// A patched tree: its pages in turn.
	rs := make([]io.Reader, len(c.pages))
	for i, p := range c.pages {
		rs[i] = bytes.NewReader(p)
	}
	return io.MultiReader(rs...)
}

// patched returns the content with the 20-byte hashes of patches written at their offsets:
// the pages they touch are copies, the others are c's.
func (c objectContent) patched(patches []hashPatch) objectContent {
	if c.pages == nil && c.n > 0 {
		c = pagedContent(c.flat)
	}
	out := objectContent{n: c.n, pages: append([][]byte(nil), c.pages...)}
	var copied []int
	for _, p := range patches {
		for k := range hashSize {
			off := p.off + k
			i := off / treePageSize
			if !slices.Contains(copied, i) {
				copied = append(copied, i)
				out.pages[i] = append([]byte(nil), c.pages[i]...)
			}
			out.pages[i][off%treePageSize] = p.h[k]
		}
	}
	return out
}

// hashPatch is a 20-byte entry hash written at an offset of a tree's content.
type hashPatch struct {
	off int
	h   plumbing.Hash
}
