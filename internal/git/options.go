package git

import (
	"crypto/x509"
	"errors"
	"fmt"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
)

// Signature is a Git identity: the name and email recorded in a commit.
type Signature struct {
	Name  string
	Email string
}

// Credentials authenticate against an HTTPS remote with basic auth (a token is sent as the
// password). They are held in memory only and never logged: String, GoString and LogValue
// redact them.
type Credentials struct {
	Username string
	Password string
	// CABundle holds extra PEM certificates trusted for the remote, on top of the system pool.
	CABundle []byte
}

// String reports which parts are set, never their values.
func (c Credentials) String() string {
	return fmt.Sprintf("Credentials{Username:%s, Password:%s, CABundle:%d bytes}",
		redactedMarker(c.Username), redactedMarker(c.Password), len(c.CABundle))
}

// GoString keeps %#v from printing the secret fields.
func (c Credentials) GoString() string { return c.String() }

// LogValue keeps slog from printing the secret fields.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Bool("username_set", c.Username != ""),
		slog.Bool("password_set", c.Password != ""),
		slog.Int("ca_bundle_bytes", len(c.CABundle)),
	)
}

func redactedMarker(s string) string {
	if s == "" {
		return "<empty>"
	}
	return "<redacted>"
}

func (c Credentials) empty() bool { return c.Username == "" && c.Password == "" }

// basicAuth is the HTTP basic authentication (a token works as the password).
func (c Credentials) basicAuth() *githttp.BasicAuth {
	return &githttp.BasicAuth{Username: c.Username, Password: c.Password}
}

// Options configure a Worker. One Worker is the single writer of one (URL, Branch).
type Options struct {
	// URL of the remote repository: https://, http:// or file://. It must not carry user info;
	// use Credentials.
	URL string
	// Branch is the short branch name, for example "main".
	Branch string
	// Credentials for an http(s) URL; ignored for file:// URLs.
	Credentials Credentials
	// Committer is kubescribe's own identity, recorded as committer of every commit and as the
	// author of snapshot commits.
	Committer Signature
	// CommitWindow is how long consecutive changes of one author on one target are gathered
	// into one commit, measured from the window's first change. Must be > 0.
	CommitWindow time.Duration
	// AuthorEmailDomain completes the email of usernames without '@': <username>@<domain>.
	AuthorEmailDomain string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// OnPushed is called after each successful push, from the worker goroutine.
	OnPushed func(PushResult)
	// OnFailed is called with the (redacted) error after each failed clone, fetch or push,
	// from the worker goroutine; a retry follows with backoff. It must not block.
	OnFailed func(error)
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
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// validateURL never quotes the URL in its errors: a rejected URL may embed a password.
func validateURL(raw string) error {
	if raw == "" {
		return errors.New("git: Options.URL is required")
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
		return fmt.Errorf("git: Options.URL scheme %q is not supported (use https, http or file)", u.Scheme)
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
