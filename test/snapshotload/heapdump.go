package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// With -heapdump the server's -pprof build also serves /debug/snapload/heapdump, which collects
// and writes the runtime's heap dump (runtime/debug.WriteHeapDump) to a file. The dump lists
// every allocated slot of every heap span, live objects only right after the collection. The
// harness reads the objects' addresses and sizes and reports, per size, how many heap pages
// (8 KiB) the live objects touch against what they would fill packed: fragmentation, which the
// heap profile cannot show (it names allocation sites, not pages).

// Record tags and field kinds of the dump (runtime/heapdump.go, format "go1.7 heap dump").
const (
	dumpTagEOF     = 0
	dumpTagObject  = 1
	dumpTagType    = 3
	dumpTagParams  = 6
	dumpTagItab    = 8
	dumpFieldEol   = 0
	heapPageBytes  = 8192
	heapDumpHeader = "go1.7 heap dump\n"
)

// sizeUse is what the live objects of one size occupy.
type sizeUse struct {
	size    uint64
	objects uint64
	pages   map[uint64]struct{}
}

func (u *sizeUse) liveBytes() uint64 { return u.size * u.objects }
func (u *sizeUse) pageBytes() uint64 { return uint64(len(u.pages)) * heapPageBytes }

// waste is the page bytes beyond what the live objects would fill packed.
func (u *sizeUse) waste() uint64 {
	packed := (u.liveBytes() + heapPageBytes - 1) / heapPageBytes * heapPageBytes
	if u.pageBytes() < packed {
		return 0
	}
	return u.pageBytes() - packed
}

// readHeapDump reads the objects of a heap dump, by size.
func readHeapDump(path string) (map[uint64]*sizeUse, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	hdr := make([]byte, len(heapDumpHeader))
	if _, err := io.ReadFull(r, hdr); err != nil || string(hdr) != heapDumpHeader {
		return nil, fmt.Errorf("%s: not a heap dump (%q)", path, hdr)
	}
	uv := func() (uint64, error) { return binary.ReadUvarint(r) }
	skipBytes := func() error {
		n, err := uv()
		if err != nil {
			return err
		}
		_, err = r.Discard(int(n))
		return err
	}
	skipInts := func(n int) error {
		for range n {
			if _, err := uv(); err != nil {
				return err
			}
		}
		return nil
	}
	uses := map[uint64]*sizeUse{}
	for {
		tag, err := uv()
		if err != nil {
			return nil, err
		}
		switch tag {
		case dumpTagParams: // big-endian, pointer size, arena start, arena end, GOARCH, version, CPUs
			if err := skipInts(4); err != nil {
				return nil, err
			}
			if err := skipBytes(); err != nil {
				return nil, err
			}
			if err := skipBytes(); err != nil {
				return nil, err
			}
			if err := skipInts(1); err != nil {
				return nil, err
			}
		case dumpTagType: // address, size, name, whether it holds pointers
			if err := skipInts(2); err != nil {
				return nil, err
			}
			if err := skipBytes(); err != nil {
				return nil, err
			}
			if err := skipInts(1); err != nil {
				return nil, err
			}
		case dumpTagItab: // address, type address
			if err := skipInts(2); err != nil {
				return nil, err
			}
		case dumpTagObject: // address, contents, then (kind, offset) pairs up to Eol
			addr, err := uv()
			if err != nil {
				return nil, err
			}
			size, err := uv()
			if err != nil {
				return nil, err
			}
			if _, err := r.Discard(int(size)); err != nil {
				return nil, err
			}
			for {
				kind, err := uv()
				if err != nil {
					return nil, err
				}
				if kind == dumpFieldEol {
					break
				}
				if _, err := uv(); err != nil {
					return nil, err
				}
			}
			u := uses[size]
			if u == nil {
				u = &sizeUse{size: size, pages: map[uint64]struct{}{}}
				uses[size] = u
			}
			u.objects++
			for p := addr / heapPageBytes; p <= (addr+size-1)/heapPageBytes; p++ {
				u.pages[p] = struct{}{}
			}
		case dumpTagEOF:
			return uses, nil
		default:
			// The objects come before goroutines, stacks and roots, which are not read.
			if len(uses) == 0 {
				return nil, fmt.Errorf("%s: record %d before any object", path, tag)
			}
			return uses, nil
		}
	}
}

// heapDumpReport summarises a heap dump: the sizes whose live objects waste the most pages.
func heapDumpReport(path string, top int) string {
	uses, err := readHeapDump(path)
	if err != nil {
		return fmt.Sprintf("heap dump %s: %v\n", path, err)
	}
	if len(uses) == 0 {
		return fmt.Sprintf("heap dump %s: no objects\n", path)
	}
	all := make([]*sizeUse, 0, len(uses))
	var live, pages, waste uint64
	for _, u := range uses {
		all = append(all, u)
		live += u.liveBytes()
		pages += u.pageBytes()
		waste += u.waste()
	}
	sort.Slice(all, func(i, j int) bool { return all[i].waste() > all[j].waste() })
	var b strings.Builder
	fmt.Fprintf(&b, "heap dump %s: live %.2f MiB on pages of %.2f MiB, %.2f MiB more than packed\n",
		path, float64(live)/(1<<20), float64(pages)/(1<<20), float64(waste)/(1<<20))
	fmt.Fprintf(&b, "%10s %10s %12s %12s %12s\n", "size", "objects", "live KiB", "pages KiB", "waste KiB")
	for _, u := range all[:min(top, len(all))] {
		fmt.Fprintf(&b, "%10d %10d %12.1f %12.1f %12.1f\n", u.size, u.objects,
			float64(u.liveBytes())/1024, float64(u.pageBytes())/1024, float64(u.waste())/1024)
	}
	return b.String()
}
