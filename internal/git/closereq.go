package git

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// CloseRequest asks a branch worker to close one author's open commit window on one target,
// with a message: what a CommitRequest becomes once the controller has decided who submitted it
// and whether its asserted author is honoured.
type CloseRequest struct {
	// ID identifies the request (the CommitRequest's UID); the result is reported under it.
	ID string
	// Target is the GitTarget whose window is closed.
	Target types.NamespacedName
	// Username is the submitter: only an open window of this resolved author is closed.
	Username string
	// Message replaces the generated subject line; the change lines and trailers follow it.
	Message string
	// Author, when set, is the commit's author instead of the attributed one.
	Author *Signature
	// Request names the CommitRequest ("<namespace>/<name>") in a trailer.
	Request string
}

// CloseOutcome is the state of a close request.
type CloseOutcome int

const (
	// ClosePending: the request is queued, or its commit is not pushed yet.
	ClosePending CloseOutcome = iota
	// CloseCommitted: the commit was pushed; CloseResult.SHA names it.
	CloseCommitted
	// CloseNoOpenWindow: the submitter had no open window on the target; nothing was closed.
	CloseNoOpenWindow
	// CloseNothingToCommit: the window was closed, but its changes left the tree unchanged.
	CloseNothingToCommit
	// CloseLost: the worker stopped before the request's commit was pushed.
	CloseLost
	// CloseUnknown: what became of the request cannot be read now (Redis does not answer);
	// ask again later.
	CloseUnknown
)

func (o CloseOutcome) String() string {
	switch o {
	case ClosePending:
		return "pending"
	case CloseCommitted:
		return "committed"
	case CloseNoOpenWindow:
		return "no open window"
	case CloseNothingToCommit:
		return "nothing to commit"
	case CloseLost:
		return "lost"
	case CloseUnknown:
		return "unknown"
	}
	return fmt.Sprintf("CloseOutcome(%d)", int(o))
}

// CloseResult is what the router knows of a close request.
type CloseResult struct {
	Outcome CloseOutcome
	// SHA and Branch of the pushed commit (CloseCommitted).
	SHA, Branch string
}

// RequestClose queues a close request behind the changes submitted so far. It never blocks.
// The worker reports the outcome through Options.OnClosed (no open window, nothing to commit)
// or, once the commit is pushed, through Options.OnPushed (CommitInfo.Request). It returns
// false, and queues nothing, once the worker is stopping: the request would miss its final
// commit.
func (w *Worker) RequestClose(req CloseRequest) bool {
	w.mu.Lock()
	stopping := w.stopping
	if !stopping {
		w.queue = append(w.queue, submission{close: &req})
	}
	w.mu.Unlock()
	if stopping {
		return false
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// acceptClose closes the open window when it holds the submitter's changes on the request's
// target, and reports that there is none otherwise. It never closes another author's window.
func (w *Worker) acceptClose(req CloseRequest) {
	win := w.win
	if win != nil && !w.windowOpen() {
		w.closeWindow() // its time was up anyway: committed without the request
		win = nil
	}
	if win == nil || win.key.snapshot || !win.key.resolved || win.key.target != req.Target || win.key.username != req.Username {
		w.log.Info("commit request: the submitter has no open window", "request", req.Request, "target", req.Target.String())
		w.reportClose(req.ID, CloseNoOpenWindow)
		return
	}
	win.request = &req
	if w.opts.OnCloseAccepted != nil {
		w.opts.OnCloseAccepted(req, win.changes)
	}
	w.closeWindow()
}

func (w *Worker) reportClose(id string, o CloseOutcome) {
	if w.opts.OnClosed != nil {
		w.opts.OnClosed(id, o)
	}
}

// applyRequest gives a plan the request's author; its message is made, from the generated
// one, each time the plan is materialized (commitMessage).
func (p *plan) applyRequest(req *CloseRequest) {
	p.request = req
	if req.Author != nil {
		p.author.Name, p.author.Email = sanitizeIdent(req.Author.Name), sanitizeIdent(req.Author.Email)
	}
}

// commitMessage is the message of a commit the request closed: the request's message instead
// of the generated subject, then the generated body and trailers, then the submitter's.
func (req *CloseRequest) commitMessage(generated string) string {
	var b strings.Builder
	b.WriteString(strings.TrimSpace(strings.ReplaceAll(req.Message, "\r", "")))
	if _, rest, ok := strings.Cut(generated, "\n\n"); ok {
		b.WriteString("\n\n")
		b.WriteString(strings.TrimRight(rest, "\n"))
	}
	fmt.Fprintf(&b, "\nKubescribe-Submitter: %s\n", oneLine(req.Username))
	fmt.Fprintf(&b, "Kubescribe-Commit-Request: %s\n", oneLine(req.Request))
	return b.String()
}
