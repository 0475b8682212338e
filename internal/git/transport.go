package git

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/memory"
)

// The worker speaks the Git protocol through go-git's transports (https, ssh, file) itself,
// rather than through go-git's Remote: a fetch asks for exactly the branch tip, shallow and
// without blobs, and a push sends a pack of exactly the objects its commits created. go-git's
// Remote.Push would walk every tree reachable from the remote tip to compute that set.

// errRemoteMoved means the remote branch is not where the worker last saw it: the push is not
// attempted, and a fetch follows.
var errRemoteMoved = errors.New("remote branch moved")

// errHistoryLost means the server refused to create the branch again after it was deleted
// because objects the new commits build on are missing: the old history was garbage-collected.
// The worker starts the branch over (Worker.startOver).
var errHistoryLost = errors.New("the server refused the branch back on its old history")

// missingObjects reports whether a report-status refusal says that the pushed tip does not
// connect to what the server holds: git receive-pack's connectivity check answers a ref it
// refuses for that reason with "missing necessary objects" (receive-pack.c). Any other refusal
// (a hook, a lock held by a concurrent update, a policy) is an ordinary failure, retried.
func missingObjects(rs *packp.ReportStatus) bool {
	for _, cs := range rs.CommandStatuses {
		if strings.Contains(cs.Status, "missing necessary objects") {
			return true
		}
	}
	return false
}

// dial returns the transport and endpoint for the next remote operation, with the current
// credentials.
func (w *Worker) dial() (transport.Transport, *transport.Endpoint, transport.AuthMethod, error) {
	ep, err := transport.NewEndpoint(w.opts.URL)
	if err != nil {
		return nil, nil, nil, errors.New("invalid repository URL")
	}
	auth, ca := w.remoteAuth()
	if ep.Protocol == "https" || ep.Protocol == "http" {
		cl, err := w.webClient(ca)
		if err != nil {
			return nil, nil, nil, err
		}
		return cl, ep, auth, nil
	}
	cl, err := client.NewClient(ep)
	if err != nil {
		return nil, nil, nil, err
	}
	return cl, ep, auth, nil
}

// webClient is a go-git HTTP client of one worker, for one CA bundle. go-git's default client,
// given the CA bundle on the endpoint, builds a new http.Transport for every session (and a
// copy of the system's certificate pool with it): every push made a TLS handshake of its own,
// and left an idle connection behind until its timeout. The worker's own keeps its
// connections alive from one operation to the next.
type webClient struct {
	ca        []byte
	transport *http.Transport
	client    transport.Transport
}

// webClient returns the worker's HTTP client for ca, built on first use and again when the
// CA bundle changes (the old one's idle connections are closed).
func (w *Worker) webClient(ca []byte) (transport.Transport, error) {
	w.webMu.Lock()
	defer w.webMu.Unlock()
	if w.web != nil && bytes.Equal(w.web.ca, ca) {
		return w.web.client, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(ca) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(ca) {
			return nil, errors.New("the CA bundle holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if w.web != nil {
		w.web.transport.CloseIdleConnections()
	}
	w.web = &webClient{ca: bytes.Clone(ca), transport: tr, client: githttp.NewClient(&http.Client{Transport: tr})}
	return w.web.client, nil
}

// closeWeb closes the idle connections of the worker's HTTP client.
func (w *Worker) closeWeb() {
	w.webMu.Lock()
	defer w.webMu.Unlock()
	if w.web != nil {
		w.web.transport.CloseIdleConnections()
	}
}

// branchIn returns the hash the advertisement gives the worker's branch.
func (w *Worker) branchIn(ar *packp.AdvRefs) (plumbing.Hash, bool) {
	if ar == nil {
		return plumbing.ZeroHash, false
	}
	h, ok := ar.References[w.branch.String()]
	return h, ok
}

// fetchInto downloads the branch tip into store: the commits down to depth (or to have, the
// tip last seen, whose trees store holds) and their trees, and their blobs only when the server
// cannot filter them out, or when blobs is set. It returns the tip, or errNoBranch.
func (w *Worker) fetchInto(ctx context.Context, store *memory.Storage, have plumbing.Hash, depth int, blobs bool) (plumbing.Hash, error) {
	filter := packp.FilterBlobNone()
	if blobs {
		filter = ""
	}
	return w.fetchFiltered(ctx, store, have, depth, filter)
}

// fetchHistory fetches the commits of the branch's tip, depth deep, without their trees or
// blobs when the server can filter them (filter tree:0), into store. It returns the tip, which
// must be tip: a branch that moved meanwhile fails it.
func (w *Worker) fetchHistory(ctx context.Context, store *memory.Storage, tip plumbing.Hash, depth int) (plumbing.Hash, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	got, err := w.fetchFiltered(ctx, store, plumbing.ZeroHash, depth, packp.FilterTreeDepth(0))
	if err == nil && got != tip {
		err = fmt.Errorf("%w: it is at %s, the worker opened it at %s", errRemoteMoved, got, tip)
	}
	return got, err
}

// fetchFiltered is fetchInto with the object filter to ask for ("" for none).
func (w *Worker) fetchFiltered(ctx context.Context, store *memory.Storage, have plumbing.Hash, depth int, filter packp.Filter) (plumbing.Hash, error) {
	blobs := filter == ""
	cl, ep, auth, err := w.dial()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sess, err := cl.NewUploadPackSession(ep, auth)
	if err != nil {
		return plumbing.ZeroHash, fromRemote(err, w.redact)
	}
	defer func() { _ = sess.Close() }()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return plumbing.ZeroHash, errNoBranch
	}
	if err != nil {
		return plumbing.ZeroHash, fromRemote(err, w.redact)
	}
	tip, ok := w.branchIn(ar)
	if !ok {
		return plumbing.ZeroHash, errNoBranch
	}
	if !blobs && (tip == have || w.planCommit(tip)) {
		return tip, nil // store holds it with its trees
	}
	req := packp.NewUploadPackRequest()
	caps := ar.Capabilities
	band := packRequest(req, caps)
	if caps.Supports(capability.Shallow) {
		_ = req.Capabilities.Set(capability.Shallow)
		req.Depth = packp.DepthCommits(depth)
	}
	if caps.Supports(capability.Filter) && !blobs {
		_ = req.Capabilities.Set(capability.Filter)
		req.Filter = filter
	}
	req.Wants = []plumbing.Hash{tip}
	if !have.IsZero() {
		if _, err := store.EncodedObject(plumbing.CommitObject, have); err == nil {
			// The store holds have's commit and trees, not its parents: declaring it shallow
			// keeps the server from assuming we hold its history's trees.
			req.Haves = []plumbing.Hash{have}
			if caps.Supports(capability.Shallow) {
				req.Shallows = []plumbing.Hash{have}
			}
		}
	}
	if err := readPack(ctx, sess, req, band, store); err != nil {
		return plumbing.ZeroHash, fromRemote(err, w.redact)
	}
	if _, err := object.GetCommit(store, tip); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("fetched pack lacks the branch tip %s: %w", tip, err)
	}
	return tip, nil
}

// packRequest sets the capabilities every fetch asks for and returns the sideband to read.
func packRequest(req *packp.UploadPackRequest, caps *capability.List) sideband.Type {
	for _, c := range []capability.Capability{capability.OFSDelta, capability.NoProgress} {
		if caps.Supports(c) {
			_ = req.Capabilities.Set(c)
		}
	}
	switch {
	case caps.Supports(capability.Sideband64k):
		_ = req.Capabilities.Set(capability.Sideband64k)
		return sideband.Sideband64k
	case caps.Supports(capability.Sideband):
		_ = req.Capabilities.Set(capability.Sideband)
		return sideband.Sideband
	}
	return 0
}

// readPack sends req and stores the pack the server answers with.
func readPack(ctx context.Context, sess transport.UploadPackSession, req *packp.UploadPackRequest, band sideband.Type, store *memory.Storage) error {
	resp, err := sess.UploadPack(ctx, req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Close() }()
	var r io.Reader = resp
	if band != 0 {
		r = sideband.NewDemuxer(band, resp)
	}
	if err := packfile.UpdateObjectStorage(store, r); err != nil {
		return fmt.Errorf("read pack: %w", err)
	}
	return nil
}

// fetchBlobs downloads objects by id into store, as a partial clone's lazy fetch does: one
// request whose wants are the ids, without filter or depth. The server must allow wants of
// objects it did not advertise (git: uploadpack.allowAnySHA1InWant; servers that support
// partial clone do).
func (w *Worker) fetchBlobs(ctx context.Context, store *memory.Storage, ids []plumbing.Hash) error {
	cl, ep, auth, err := w.dial()
	if err != nil {
		return err
	}
	sess, err := cl.NewUploadPackSession(ep, auth)
	if err != nil {
		return fromRemote(err, w.redact)
	}
	defer func() { _ = sess.Close() }()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return fromRemote(err, w.redact)
	}
	req := packp.NewUploadPackRequest()
	band := packRequest(req, ar.Capabilities)
	req.Wants = ids
	return fromRemote(readPack(ctx, sess, req, band, store), w.redact)
}

// planCommit reports whether h is one of the unpushed commits.
func (w *Worker) planCommit(h plumbing.Hash) bool {
	for _, p := range w.plans {
		if p.sha == h {
			return true
		}
	}
	return false
}

// pushPlans pushes the first n unpushed commits: one receive-pack request updating the branch
// from remoteTip to the n-th commit, with a pack of the objects those commits created, trees as
// deltas against the trees they replace (pushCommits).
func (w *Worker) pushPlans(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	var objs []packObject
	for _, p := range w.plans[:n] {
		objs = append(objs, p.objects...)
	}
	return w.pushCommits(ctx, w.plans[n-1].sha, objs)
}

// pushCommits updates the branch from remoteTip to newTip in one receive-pack request, sending
// objs (the objects of the commits in between). It is never forced: unless the branch is to be
// created, the command names remoteTip as the old value, so the server refuses it if the branch
// moved (in any direction) after the advertisement. A branch that is not at remoteTip already in
// the advertisement is refused before anything is sent.
func (w *Worker) pushCommits(ctx context.Context, newTip plumbing.Hash, objs []packObject) error {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	cl, ep, auth, err := w.dial()
	if err != nil {
		return err
	}
	sess, err := cl.NewReceivePackSession(ep, auth)
	if err != nil {
		return fromRemote(err, w.redact)
	}
	defer func() { _ = sess.Close() }()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil && !errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return fromRemote(err, w.redact)
	}
	cur, exists := w.branchIn(ar)
	create := w.remoteTip.IsZero() || w.remoteGone
	old := w.remoteTip
	switch {
	case create && exists:
		return fmt.Errorf("%w: it exists at %s, the worker expected to create it", errRemoteMoved, cur)
	case create:
		old = plumbing.ZeroHash
	case !exists:
		return fmt.Errorf("%w: it no longer exists, the worker expected it at %s", errRemoteMoved, old)
	case cur != old:
		return fmt.Errorf("%w: it is at %s, the worker expected it at %s", errRemoteMoved, cur, old)
	}
	// A branch being created gets no deltas: its bases might be gone from the remote.
	pack, err := buildPack(w.store, objs, !create)
	if err != nil {
		return err
	}
	req := packp.NewReferenceUpdateRequestFromCapabilities(ar.Capabilities)
	req.Commands = []*packp.Command{{Name: w.branch, Old: old, New: newTip}}
	req.Packfile = io.NopCloser(bytes.NewReader(pack))
	rs, err := sess.ReceivePack(ctx, req)
	w.opts.Metrics.pushBytes(len(pack))
	if rs != nil && rs.Error() != nil && create && w.remoteGone && missingObjects(rs) {
		// The server answered, and refused: the pack holds only the new commits' objects,
		// which build on what it held of the deleted branch and no longer does.
		return fmt.Errorf("%w: %w", errHistoryLost, fromRemoteAs(errPushRefused, rs.Error(), w.redact))
	}
	if rs != nil && rs.Error() != nil {
		return fromRemoteAs(errPushRefused, rs.Error(), w.redact)
	}
	return fromRemote(err, w.redact)
}

// setStore replaces the working store, whose tip has the tree path counts refs (nil: unknown)
// and the history walked (newest first), and resets the compaction threshold.
func (w *Worker) setStore(s *memory.Storage, refs map[plumbing.Hash]int32, walked []plumbing.Hash) {
	w.store = s
	w.gc.reset(refs, walked)
	w.compactAt = len(s.Objects) + w.compactEvery
	w.storeGrowth = 0
}

// compactIfDue drops from the working store what the next commits and the next push do not
// need, once enough objects accumulated: under a steady stream of changes there is always
// something unpushed, so waiting for nothing to be would let every superseded tree stay (one
// commit into a directory of 10,000 entries writes a 410 KB tree). It prunes (storeGC) when it
// can, and compacts in full otherwise.
func (w *Worker) compactIfDue() {
	if w.stale || w.store == nil ||
		(len(w.store.Objects) < w.compactAt && w.storeGrowth < w.compactBytes) {
		return
	}
	w.compact()
}

// compact cuts the working store back to what the next commits and the next push need: it
// prunes it in place (storeGC) when it can, and replaces it by a compacted copy
// (compactStore) otherwise.
func (w *Worker) compact() {
	var keep []plumbing.Hash
	// The next commit reads the local tip's commit, a rebuild the remote tip's.
	needed := map[plumbing.Hash]bool{w.localTip: true, w.remoteTip: true}
	for _, p := range w.plans {
		for _, o := range p.objects {
			keep = append(keep, o.hash)
			needed[o.hash] = true
			if !o.base.IsZero() {
				needed[o.base] = true // the remote tip's, which the push's deltas and a rebuild need
			}
		}
	}
	before := len(w.store.Objects)
	if w.gc.prune(w.store, needed) {
		w.log.Debug("working store pruned", "objects_before", before, "objects_after", len(w.store.Objects))
		w.opts.Metrics.storeCompacted(compactionPrune)
		w.compactAt = len(w.store.Objects) + w.compactEvery
		w.storeGrowth = 0
		return
	}
	s, refs, walked, err := compactStore(w.store, w.localTip, w.remoteTip, keep...)
	if err != nil {
		w.log.Error("compacting the working store failed; keeping it", "err", err)
		w.gc.invalidate()
		w.compactAt = len(w.store.Objects) + w.compactEvery
		w.storeGrowth = 0
		return
	}
	w.log.Debug("working store compacted", "objects_before", before, "objects_after", len(s.Objects))
	w.opts.Metrics.storeCompacted(compactionFull)
	w.setStore(s, refs, walked)
	w.setLocalTip(w.localTip)
}

// compactStore copies out of s what building commits on tip needs: tip's commit and all its
// trees (never a blob: commits do not read them). Its size depends on the size of the tip's
// tree, not on the history. When commits on tip are not pushed yet, remote is the remote tip
// they were built on, whose commit and trees a rebuild and the next fetch start from, and keep
// the objects those commits created, which their push sends. It also returns, for pruning
// (storeGC), at how many paths of tip's tree each of its trees sits, and the hashes of tip's
// history as far as s holds it (newest first, at most rewindScanLimit; a parent whose commit s
// lacks ends its path), which the worker remembers without their objects to recognise a
// rewound branch.
func compactStore(s *memory.Storage, tip, remote plumbing.Hash, keep ...plumbing.Hash) (*memory.Storage, map[plumbing.Hash]int32, []plumbing.Hash, error) {
	out := memory.NewStorage()
	refs := map[plumbing.Hash]int32{}
	if tip.IsZero() {
		return out, refs, nil, nil
	}
	seen := map[plumbing.Hash]bool{}
	if err := copyTrees(s, out, tip, seen, refs); err != nil {
		return nil, nil, nil, err
	}
	if !remote.IsZero() && remote != tip {
		if err := copyTrees(s, out, remote, seen, nil); err != nil {
			return nil, nil, nil, err
		}
	}
	for _, h := range append([]plumbing.Hash{tip, remote}, keep...) {
		if h.IsZero() || seen[h] {
			continue
		}
		seen[h] = true
		obj, err := s.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read object %s of an unpushed commit: %w", h, err)
		}
		if _, err := out.SetEncodedObject(obj); err != nil {
			return nil, nil, nil, err
		}
	}
	// History: the hashes of tip's ancestors, breadth first, as far as s holds their commits.
	var walked []plumbing.Hash
	walkCommits(s, tip, rewindScanLimit, func(h plumbing.Hash) bool {
		walked = append(walked, h)
		return true
	})
	return out, refs, walked, nil
}

// copyTrees copies the trees of commit tip from s to out, skipping those in seen (and adding
// the ones it copies). A tree is kept as a rawObject, whose content later reads (tree, the next
// compaction) use without copying it. refs, when set, counts every path of tip's tree at which
// each tree sits: a tree at two paths is copied once and counted, with what is below it, twice.
func copyTrees(s, out *memory.Storage, tip plumbing.Hash, seen map[plumbing.Hash]bool, refs map[plumbing.Hash]int32) error {
	c, err := object.GetCommit(s, tip)
	if err != nil {
		return fmt.Errorf("read commit %s: %w", tip, err)
	}
	if seen[c.TreeHash] && refs == nil {
		return nil
	}
	stack := []plumbing.Hash{c.TreeHash}
	for len(stack) > 0 {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if refs != nil {
			refs[h]++
		}
		var raw []byte
		if seen[h] {
			if refs == nil {
				continue
			}
			// Copied already: counted again, below too.
			raw, err = readObject(out.Trees[h])
		} else {
			seen[h] = true
			obj, err := s.EncodedObject(plumbing.TreeObject, h)
			if err != nil {
				return fmt.Errorf("read tree %s: %w", h, err)
			}
			if raw, err = readObject(obj); err != nil {
				return err
			}
			if _, err := out.SetEncodedObject(&rawObject{t: plumbing.TreeObject, c: flatContent(raw), h: h}); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		if err := eachSubtree(h, raw, func(sub plumbing.Hash) {
			if refs != nil || !seen[sub] {
				stack = append(stack, sub)
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// eachSubtree calls fn with the hash of every directory entry of tree content raw, without
// parsing the rest of the entries.
func eachSubtree(tree plumbing.Hash, raw []byte, fn func(plumbing.Hash)) error {
	for pos := 0; pos < len(raw); {
		rest := raw[pos:]
		nul := bytes.IndexByte(rest, 0)
		if nul < 0 || len(rest) < nul+1+hashSize {
			return fmt.Errorf("tree %s is malformed", tree)
		}
		// Git writes a directory's mode as "40000"; some old writers wrote "040000".
		if bytes.HasPrefix(rest, []byte("40000 ")) || bytes.HasPrefix(rest, []byte("040000 ")) {
			fn(plumbing.Hash(rest[nul+1 : nul+1+hashSize]))
		}
		pos += nul + 1 + hashSize
	}
	return nil
}
