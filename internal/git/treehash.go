package git

import (
	"crypto/sha1" //nolint:gosec // Git object names are SHA-1.
	"encoding"
	"fmt"
	"strconv"

	"github.com/go-git/go-git/v5/plumbing"
)

// Hashing a large tree that a commit patched starts where it first differs from its base.
//
// Every commit rewrites the trees on the paths it changed, and the root of a repository of
// many namespaces is one of them: 1,000 namespaces make a root of 34 KB, whose SHA-1 is most
// of a commit's cost. A patched tree (patch) has its base's length and its base's content up to
// the first hash it replaced, so the SHA-1 state over that prefix is the one the base's hashing
// went through. Large trees keep those states (marks) every hashMarkStride bytes; the hashing
// of a patch resumes at the base's last mark before the first change and records the marks
// of the new tree on its way, for the commit after it.

const (
	// hashMarkStride is the least distance between two marks in a tree's content. One mark
	// costs about as much as hashing 100 bytes and takes sha1StateSize bytes.
	hashMarkStride = 1024
	// hashMarksMax bounds the marks of a tree: a larger tree has them further apart (every
	// 7 KiB for a directory of 10,000 objects), which adds at most 1/hashMarksMax of its size
	// to the hashing.
	hashMarksMax = 64
	// hashMarkMin is the smallest tree that keeps marks; smaller ones are hashed whole.
	hashMarkMin = 4 * hashMarkStride
)

// markStride is the distance between the marks of a tree of size bytes.
func markStride(size int) int {
	per := (size + hashMarksMax - 1) / hashMarksMax
	return max(hashMarkStride, (per+hashMarkStride-1)/hashMarkStride*hashMarkStride)
}

// sha1StateSize is the size of a marshalled SHA-1 state.
var sha1StateSize = func() int {
	b, err := sha1.New().(encoding.BinaryMarshaler).MarshalBinary() //nolint:gosec // see above
	if err != nil {
		panic(fmt.Sprintf("git: SHA-1 state does not marshal: %v", err))
	}
	return len(b)
}()

// objectHeader appends Git's object header ("<type> <size>\x00") to b.
func objectHeader(b []byte, t plumbing.ObjectType, size int) []byte {
	b = append(b, t.Bytes()...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(size), 10)
	return append(b, 0)
}

// hashObject returns the name of the object of type t with content c: the SHA-1 of its header
// and content.
func hashObject(t plumbing.ObjectType, c objectContent) plumbing.Hash {
	d := sha1.New() //nolint:gosec // Git object names are SHA-1.
	var hdr [32]byte
	d.Write(objectHeader(hdr[:0], t, c.len()))
	c.writeTo(d, 0, c.len())
	var h plumbing.Hash
	d.Sum(h[:0])
	return h
}

// hashTree returns the object name of tree content c and, for a large tree, its marks: mark i
// is the SHA-1 state after the header and the first i*markStride(c.len()) bytes of c.
//
// base, when it has marks for content of c's length, is the tree c was patched from: the
// caller guarantees that the first lo bytes of c are base's. Hashing then resumes at base's
// last mark at or before lo.
func hashTree(c objectContent, base *parsedTree, lo int) (plumbing.Hash, []byte) {
	size := c.len()
	if size < hashMarkMin {
		return hashObject(plumbing.TreeObject, c), nil
	}
	d := sha1.New() //nolint:gosec // Git object names are SHA-1.
	var h plumbing.Hash
	stride := markStride(size)
	n := (size-1)/stride + 1 // marks at 0, stride, ..., (n-1)*stride < size
	marks := make([]byte, n*sha1StateSize)
	start := 0
	if base != nil && len(base.marks) == len(marks) && base.content.len() == size && lo >= 0 {
		start = min(lo/stride, n-1)
		copy(marks, base.marks[:(start+1)*sha1StateSize])
		if err := d.(encoding.BinaryUnmarshaler).UnmarshalBinary(marks[start*sha1StateSize : (start+1)*sha1StateSize]); err != nil {
			panic(fmt.Sprintf("git: SHA-1 state does not unmarshal: %v", err)) // marks are ours
		}
	} else {
		var hdr [32]byte
		d.Write(objectHeader(hdr[:0], plumbing.TreeObject, size))
		mark(d, marks, 0)
	}
	for i := start; i < n; i++ {
		c.writeTo(d, i*stride, min((i+1)*stride, size))
		if i+1 < n {
			mark(d, marks, i+1)
		}
	}
	d.Sum(h[:0])
	return h, marks
}

// mark stores the state of d as mark i of marks.
func mark(d any, marks []byte, i int) {
	at := marks[i*sha1StateSize : i*sha1StateSize : (i+1)*sha1StateSize]
	if _, err := d.(encoding.BinaryAppender).AppendBinary(at); err != nil {
		panic(fmt.Sprintf("git: SHA-1 state does not marshal: %v", err))
	}
}
