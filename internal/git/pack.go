package git

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1" //nolint:gosec // Git object and pack checksums are SHA-1.
	"encoding/binary"
	"fmt"
	"io"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// Pack object types (gitformat-pack).
const (
	packTypeCommit   = 1
	packTypeTree     = 2
	packTypeBlob     = 3
	packTypeRefDelta = 7
)

// maxDeltaRatio is how small a delta must be, relative to the whole object, to be sent instead.
const maxDeltaRatio = 0.75

// buildPack encodes objs, deduplicated, as a packfile version 2. With thin set, an object whose
// base is in s is sent as a REF_DELTA against it: the base is on the remote (or earlier in
// this pack), and receive-pack completes such a thin pack (index-pack --fix-thin), as it does
// for git push. The pack holds only these objects, so its size depends on what the commits
// changed, not on the size or history of the repository.
func buildPack(s storer.EncodedObjectStorer, objs []packObject, thin bool) ([]byte, error) {
	seen := make(map[plumbing.Hash]bool, len(objs))
	// An object can come back: a commit that undoes an earlier one of the same push writes the
	// trees that commit replaced, and records the earlier commit's trees as their bases. A delta
	// against an object that comes later in the pack would then close a cycle (X against Y, Y
	// against X), which git's index-pack, completing the thin pack from the repository, may
	// refuse: "REF_DELTA at offset N already resolved (duplicate base Y?)". So an object whose
	// base comes later in the pack is sent whole.
	held := make(map[plumbing.Hash]bool, len(objs))
	for _, o := range objs {
		held[o.hash] = true
	}
	// The header's object count is known at the end: it is written in place then, so that the
	// pack is built in one buffer (a snapshot's pack is megabytes).
	var body bytes.Buffer
	body.Write([]byte{'P', 'A', 'C', 'K', 0, 0, 0, 2, 0, 0, 0, 0})
	n := 0
	zw := zlib.NewWriter(io.Discard)
	for _, o := range objs {
		if seen[o.hash] {
			continue
		}
		seen[o.hash] = true
		obj, err := s.EncodedObject(plumbing.AnyObject, o.hash)
		if err != nil {
			return nil, fmt.Errorf("read object %s for the pack: %w", o.hash, err)
		}
		typ, err := packType(obj.Type())
		if err != nil {
			return nil, err
		}
		var data []byte
		base := plumbing.ZeroHash
		if thin && !o.base.IsZero() && o.base != o.hash && (seen[o.base] || !held[o.base]) {
			if o.patched != nil {
				if raw, ok := obj.(*rawObject); ok && s.HasEncodedObject(o.base) == nil {
					data, base, typ = patchDelta(raw.c, o.patched), o.base, packTypeRefDelta
				}
			} else if d, ok := deltaAgainst(s, o.base, obj, int(obj.Size())); ok {
				data, base, typ = d, o.base, packTypeRefDelta
			}
		}
		if data == nil {
			if data, err = readObject(obj); err != nil {
				return nil, err
			}
		}
		writeEntryHeader(&body, typ, len(data))
		if typ == packTypeRefDelta {
			body.Write(base[:])
		}
		zw.Reset(&body)
		if _, err := zw.Write(data); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
		n++
	}
	out := body.Bytes()
	binary.BigEndian.PutUint32(out[8:12], uint32(n)) //nolint:gosec // a pack of a few commits
	sum := sha1.Sum(out)                             //nolint:gosec // the pack trailer is SHA-1
	return append(out, sum[:]...), nil
}

// deltaAgainst returns obj as a delta against base when base is in s and the delta is worth it.
func deltaAgainst(s storer.EncodedObjectStorer, base plumbing.Hash, obj plumbing.EncodedObject, size int) ([]byte, bool) {
	b, err := s.EncodedObject(plumbing.AnyObject, base)
	if err != nil || b.Type() != obj.Type() {
		return nil, false
	}
	d, err := packfile.GetDelta(b, obj)
	if err != nil {
		return nil, false
	}
	data, err := readObject(d)
	if err != nil || float64(len(data)) > maxDeltaRatio*float64(size) {
		return nil, false
	}
	return data, true
}

// patchDelta is the delta (gitformat-pack, "Deltified representation") that turns the base of a
// patched tree into content, which has the base's length and differs from it only in the
// 20-byte entry hashes at the sorted offsets patched: copies of the unchanged runs, and the
// new hashes inserted. It never reads the base, unlike a general delta, which indexes it
// (for a tree of 10,000 entries, megabytes per push).
func patchDelta(content objectContent, patched []int) []byte {
	d := binary.AppendUvarint(nil, uint64(content.len())) // the base's size: the same
	d = binary.AppendUvarint(d, uint64(content.len()))
	at := 0
	for _, off := range patched {
		d = appendDeltaCopy(d, at, off-at)
		d = append(d, hashSize)
		var h plumbing.Hash
		content.readAt(h[:], off)
		d = append(d, h[:]...)
		at = off + hashSize
	}
	return appendDeltaCopy(d, at, content.len()-at)
}

// maxDeltaCopy is the longest copy instruction written, as git writes them (its readers accept
// up to 2^24-1 bytes; 64 KiB keeps to what every reader handles).
const maxDeltaCopy = 1 << 16

// appendDeltaCopy appends instructions copying n bytes of the base from offset off.
func appendDeltaCopy(d []byte, off, n int) []byte {
	for n > 0 {
		size := min(n, maxDeltaCopy)
		op, args := byte(0x80), make([]byte, 0, 7)
		for i := range 4 {
			if b := byte(off >> (8 * i)); b != 0 {
				op |= 1 << i
				args = append(args, b)
			}
		}
		if size != maxDeltaCopy { // a size of 0x10000 is written as no size bytes
			for i := range 3 {
				if b := byte(size >> (8 * i)); b != 0 {
					op |= 0x10 << i
					args = append(args, b)
				}
			}
		}
		d = append(append(d, op), args...)
		off += size
		n -= size
	}
	return d
}

// readObject returns obj's content. For the objects commits write it is their content itself,
// not a copy, unless it is a patched tree's pages: callers must not modify it.
func readObject(obj plumbing.EncodedObject) ([]byte, error) {
	if o, ok := obj.(*rawObject); ok {
		return o.c.bytes(), nil
	}
	r, err := obj.Reader()
	if err != nil {
		return nil, fmt.Errorf("read object %s: %w", obj.Hash(), err)
	}
	defer func() { _ = r.Close() }()
	buf := make([]byte, 0, obj.Size())
	out := bytes.NewBuffer(buf)
	if _, err := io.Copy(out, r); err != nil {
		return nil, fmt.Errorf("read object %s: %w", obj.Hash(), err)
	}
	return out.Bytes(), nil
}

func packType(t plumbing.ObjectType) (int, error) {
	switch t {
	case plumbing.CommitObject:
		return packTypeCommit, nil
	case plumbing.TreeObject:
		return packTypeTree, nil
	case plumbing.BlobObject:
		return packTypeBlob, nil
	default:
		return 0, fmt.Errorf("object type %s is not written by the worker", t)
	}
}

// writeEntryHeader writes the type and size of a pack entry: 3 type bits and 4 size bits in the
// first byte, then 7 size bits per byte, the high bit marking continuation.
func writeEntryHeader(w *bytes.Buffer, typ, size int) {
	b := byte(typ<<4) | byte(size&0x0f)
	size >>= 4
	for size > 0 {
		w.WriteByte(b | 0x80)
		b = byte(size & 0x7f)
		size >>= 7
	}
	w.WriteByte(b)
}
