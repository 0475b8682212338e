package git

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"

	"github.com/kubescribe/kubescribe/internal/attribution"
)

// Signature is a Git identity: the name and email recorded in a commit.
type Signature struct {
	Name  string
	Email string
}

// Credentials authenticate against an HTTPS remote with basic auth (a token is sent as the
// password), or against an SSH remote with a private key, whose host key is checked against
// KnownHosts. They are held in memory only and never logged: String, GoString and LogValue
// redact them.
type Credentials struct {
	// Username is the basic-auth user; for SSH, the user when the URL names none (default "git").
	Username string
	Password string
	// CABundle holds extra PEM certificates trusted for the remote, on top of the system pool.
	CABundle []byte
	// SSHKey is the private key (PEM or OpenSSH format, no passphrase) for an SSH remote.
	SSHKey []byte
	// KnownHosts is known_hosts content: an SSH remote is trusted only with a host key listed
	// there for its host. Required for SSH; an unknown or changed host key is refused.
	KnownHosts []byte
}

// String reports which parts are set, never their values.
func (c Credentials) String() string {
	return fmt.Sprintf("Credentials{Username:%s, Password:%s, CABundle:%d bytes, SSHKey:%s, KnownHosts:%d bytes}",
		redactedMarker(c.Username), redactedMarker(c.Password), len(c.CABundle),
		redactedMarker(string(c.SSHKey)), len(c.KnownHosts))
}

// GoString keeps %#v from printing the secret fields.
func (c Credentials) GoString() string { return c.String() }

// LogValue keeps slog from printing the secret fields.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Bool("username_set", c.Username != ""),
		slog.Bool("password_set", c.Password != ""),
		slog.Int("ca_bundle_bytes", len(c.CABundle)),
		slog.Bool("ssh_key_set", len(c.SSHKey) > 0),
		slog.Int("known_hosts_bytes", len(c.KnownHosts)),
	)
}

func redactedMarker(s string) string {
	if s == "" {
		return "<empty>"
	}
	return "<redacted>"
}

func (c Credentials) empty() bool { return c.Username == "" && c.Password == "" }

// equal reports whether c and o are the same credentials.
func (c Credentials) equal(o Credentials) bool {
	return c.Username == o.Username && c.Password == o.Password && bytes.Equal(c.CABundle, o.CABundle) &&
		bytes.Equal(c.SSHKey, o.SSHKey) && bytes.Equal(c.KnownHosts, o.KnownHosts)
}

// basicAuth is the HTTP basic authentication (a token works as the password).
func (c Credentials) basicAuth() *githttp.BasicAuth {
	return &githttp.BasicAuth{Username: c.Username, Password: c.Password}
}

// authFor returns the authentication for rawURL: basic auth for http(s) with credentials, the
// SSH key with known_hosts checking for ssh, nothing for file:// and anonymous http(s).
func authFor(rawURL string, c Credentials) (transport.AuthMethod, error) {
	if len(c.CABundle) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.CABundle) {
		return nil, errors.New("git: Credentials.CABundle holds no PEM certificate")
	}
	if t, ok, err := parseSSHURL(rawURL); ok || err != nil {
		if err != nil {
			return nil, err
		}
		return sshAuthFor(t, c)
	}
	if isHTTP(rawURL) && !c.empty() {
		return c.basicAuth(), nil
	}
	return nil, nil
}

// Options configure a Worker. One Worker is the single writer of one (URL, Branch).
type Options struct {
	// URL of the remote repository: https://, http://, ssh://, scp-like user@host:path, or
	// file://. It must not carry a password (an ssh URL may name the user); use Credentials.
	URL string
	// Branch is the short branch name, for example "main".
	Branch string
	// Credentials for an http(s) or ssh URL; ignored for file:// URLs. An ssh URL needs
	// SSHKey and KnownHosts.
	Credentials Credentials
	// Committer is kubescribe's own identity, recorded as committer of every commit and as the
	// author of snapshot commits.
	Committer Signature
	// Signer, when set, signs every commit the worker makes (sign.go); nil: commits are
	// unsigned. SetSigner replaces it while the worker runs.
	Signer Signer
	// CommitWindow is how long consecutive changes of one author on one target are gathered
	// into one commit, measured from the window's first change. Must be > 0.
	CommitWindow time.Duration
	// AuthorEmailDomain completes the email of usernames without '@': <username>@<domain>.
	AuthorEmailDomain string
	// FetchInterval is how often the worker fetches the branch while it has nothing to push,
	// to find someone else's commits that changed its folders (reported through OnReplay).
	// 0 fetches only when a push needs it. Must be >= 0.
	FetchInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// OnPushed is called after each successful push, from the worker goroutine.
	OnPushed func(PushResult)
	// OnFailed is called with the (redacted) error after each failed clone, fetch or push,
	// from the worker goroutine; a retry follows with backoff. It must not block.
	OnFailed func(error)
	// OnClosed is called, from the worker goroutine, when a close request ends without a
	// commit (CloseNoOpenWindow, CloseNothingToCommit). A
	// request that closes a window is reported by OnPushed, through CommitInfo.Request.
	OnClosed func(id string, outcome CloseOutcome)
	// OnCloseAccepted is called, from the worker goroutine, when a close request closes a
	// window, with the window's changes, before its commit is made: the router keeps the close
	// so that a restart can make the commit again. It may block briefly (a Redis write).
	OnCloseAccepted func(req CloseRequest, changes []attribution.AttributedChange)
	// KnownFolder, when set, reports whether tree is the tree kubescribe's last push into
	// folder (cleaned, "" for the repository root) left there. Such a folder is not checked
	// again before the first commit into it (a restart does not fetch the files of a large
	// mirror). Called from the worker goroutine; it must not block.
	KnownFolder func(folder string, tree plumbing.Hash) bool
	// OnFolder is called, from the worker goroutine, when a folder was refused by the gate, or
	// passed it (FolderRefusal says which). It must not block.
	OnFolder func(folder string)
	// OnReplay is called, from the worker goroutine, when the branch no longer holds what the
	// worker pushed: the streams of the folders' GitTargets must hand their state over again.
	// It must not block.
	OnReplay func(ReplayRequest)
	// WriterEpoch, when set, hands the worker its writer epoch before its first clone
	// (WriterEpochs.Next): every commit it makes carries it, and it gives the branch up when it
	// finds a commit of a newer epoch there (writer.go). Nil: no epoch, no such check.
	WriterEpoch func(ctx context.Context) (int64, error)
	// WriterSlot names what the worker writes among the writers of its branch, in its commits'
	// writer trailer: its GitProvider ("<namespace>/<name>"). Required with WriterEpoch.
	WriterSlot string
	// Pushes, when set, keeps what each push delivers (pushdelivery.go): the worker records it
	// before every push, and reads the record of the writer whose commit is the tip when it
	// opens the branch and whenever a fetch finds it moved, so that a replayed change the
	// branch holds already, pushed by a writer killed before its cursors advanced, makes no
	// commit. Keyed by WriterSlot, Branch and writer epoch; used only with a WriterSlot.
	Pushes *Deliveries
	// EpochIssued, when set, tells whether a writer epoch a commit's trailer claims, above the
	// worker's, was handed out (WriterEpochs.Issued); one that was not supersedes nothing.
	EpochIssued func(ctx context.Context, epoch int64) (bool, error)
	// OnSuperseded is called, from the worker goroutine, when the worker gave its branch up to
	// a writer of a newer epoch; Run returns then. It must not block.
	OnSuperseded func(newer int64)
	// Now is the clock for commit and push timestamps; defaults to time.Now. Scheduling (the
	// commit window timer, backoff) always uses the real monotonic clock.
	Now func() time.Time
}

// validate checks o and fills defaults.
func (o *Options) validate() error {
	if err := validateURL(o.URL); err != nil {
		return err
	}
	if o.Branch == "" {
		return errors.New("git: Options.Branch is required")
	}
	if strings.HasPrefix(o.Branch, "refs/") {
		return fmt.Errorf("git: Options.Branch %q must be a short branch name, without refs/", o.Branch)
	}
	if err := plumbing.NewBranchReferenceName(o.Branch).Validate(); err != nil {
		return fmt.Errorf("git: Options.Branch %q is not a valid branch name", o.Branch)
	}
	if err := validateSignatureField("Options.Committer.Name", o.Committer.Name); err != nil {
		return err
	}
	if err := validateSignatureField("Options.Committer.Email", o.Committer.Email); err != nil {
		return err
	}
	if o.CommitWindow <= 0 {
		return fmt.Errorf("git: Options.CommitWindow must be > 0, got %s", o.CommitWindow)
	}
	if o.FetchInterval < 0 {
		return fmt.Errorf("git: Options.FetchInterval must be >= 0, got %s", o.FetchInterval)
	}
	if o.AuthorEmailDomain == "" {
		return errors.New("git: Options.AuthorEmailDomain is required")
	}
	if strings.ContainsAny(o.AuthorEmailDomain, "@<> \t\r\n\x00") {
		return fmt.Errorf("git: Options.AuthorEmailDomain %q must be a bare domain", o.AuthorEmailDomain)
	}
	if len(o.Credentials.CABundle) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(o.Credentials.CABundle) {
			return errors.New("git: Options.Credentials.CABundle holds no PEM certificate")
		}
	}
	if _, err := authFor(o.URL, o.Credentials); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// ValidateURL checks a repository URL as NewWorker does: https://, http://, ssh://, scp-like
// user@host:path or file://, without a password. Its errors never quote the URL.
func ValidateURL(raw string) error { return validateURL(raw) }

// IsSSHURL reports whether raw is an ssh:// or scp-like (user@host:path) URL.
func IsSSHURL(raw string) bool {
	_, ok, _ := parseSSHURL(raw)
	return ok
}

// CheckCredentials reports whether c can authenticate to rawURL as NewWorker would use them:
// for SSH, a private key that parses (without passphrase) and known_hosts that parse. Its errors
// never quote the credentials.
func CheckCredentials(rawURL string, c Credentials) error {
	_, err := authFor(rawURL, c)
	return err
}

// validateURL never quotes the URL in its errors: a rejected URL may embed a password.
func validateURL(raw string) error {
	if raw == "" {
		return errors.New("git: Options.URL is required")
	}
	if _, ok, err := parseSSHURL(raw); ok || err != nil {
		return err
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("git: Options.URL is not a valid URL")
	}
	if u.User != nil {
		return errors.New("git: Options.URL must not contain user info; use Options.Credentials")
	}
	switch u.Scheme {
	case "https", "http":
		if u.Host == "" {
			return errors.New("git: Options.URL has no host")
		}
	case "file":
		if u.Path == "" {
			return errors.New("git: Options.URL has no path")
		}
	default:
		return fmt.Errorf("git: Options.URL scheme %q is not supported (use https, http, ssh or file)", u.Scheme)
	}
	return nil
}

func validateSignatureField(field, v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("git: %s is required", field)
	}
	if strings.ContainsAny(v, "<>\r\n\x00") {
		return fmt.Errorf("git: %s %q must not contain '<', '>' or line breaks", field, v)
	}
	return nil
}

// isHTTP reports whether the remote is reached over HTTP(S), where credentials apply.
func isHTTP(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http")
}
