package git

import (
	"errors"

	"github.com/kubescribe/kubescribe/internal/remoteerr"
)

// remoteError is the failure of a conversation with the Git server. Its text says only what kind
// of failure it was (remoteerr.Describe), never what the server sent: a response body, an "ERR"
// line, a hook's output or an SSH server's stderr may carry anything, terminal escape sequences
// included, and the text reaches status conditions (Worker.Status().LastError, Probe). The
// server's words stay in the wrapped error, for the log only (RemoteDetail); errors.Is and
// errors.As see through it.
type remoteError struct {
	class string
	// is is a sentinel the error also matches (ErrAuthentication, ErrHostKey), or nil: the
	// wrapped error may have lost it to redaction.
	is  error
	err error
}

func (e *remoteError) Error() string        { return e.class }
func (e *remoteError) Unwrap() error        { return e.err }
func (e *remoteError) Is(target error) bool { return e.is != nil && target == e.is }

// errPushRefused classifies the server's refusal of a push (its report-status), whose reason
// is the server's text.
const errPushRefused = "the server refused the push (its reason is in kubescribe's log)"

// fromRemote wraps err, returned by a conversation with the Git server, as a remoteError; the
// wrapped error is redact(err), so that the log never sees a password the server echoed. A
// host key refusal keeps its text: kubescribe's own (the host and the key's fingerprint).
func fromRemote(err error, redact func(error) error) error {
	return fromRemoteAs("", err, redact)
}

// fromRemoteAs is fromRemote with the class given (when not "").
func fromRemoteAs(class string, err error, redact func(error) error) error {
	if err == nil {
		return nil
	}
	var re *remoteError
	if errors.As(err, &re) {
		return err // classified already
	}
	var hk *hostKeyError
	var is error
	switch {
	case class != "":
	case errors.As(err, &hk):
		class, is = hk.Error(), ErrHostKey
	default:
		class = remoteerr.Describe(err)
		if class == remoteerr.AuthenticationFailed || class == remoteerr.AccessDenied {
			is = ErrAuthentication
		}
	}
	if redact != nil {
		err = redact(err)
	}
	return &remoteError{class: class, is: is, err: err}
}

// RemoteDetail returns what the Git server said in err, for the log: the text of the error a
// remoteError classified, or "" when err holds none. It is never for a condition or a message
// to users.
func RemoteDetail(err error) string {
	var re *remoteError
	if !errors.As(err, &re) || re.err == nil {
		return ""
	}
	return re.err.Error()
}
