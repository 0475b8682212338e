package attribution

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// The stored form of a fact, defined here and nowhere else. A fact key's value is the 20-byte
// rank (store.go) followed by one JSON object, the record:
//
//	{"v":1,"route":"local","resource":"configmaps","namespace":"team-a","name":"demo",
//	 "uid":"...","resourceVersion":"42","verb":"update","user":{"username":"alice",...},
//	 "auditID":"...","stageTimestamp":"2026-11-30T01:30:00.123456Z"}
//
// "v" is the record's version. Version 1 is the first; a record without "v" was written before
// records were versioned and has the same fields, so it is read as version 1. A reader meets a
// record of any other version only when a newer kubescribe shares the Redis (a rolling
// upgrade): it treats the record as no fact (see Store.Lookup). A change to the fields'
// meaning, or a field a reader must not ignore, needs a new version; a new optional field
// does not.

// recordVersion is the version of the records this build writes.
const recordVersion = 1

// recordV1 is version 1 of the record. Its field names are the record's own, not those of
// audit.Fact's JSON tags (which happen to be the same today).
type recordV1 struct {
	V               int        `json:"v"`
	Route           string     `json:"route"`
	Group           string     `json:"group,omitempty"`
	Resource        string     `json:"resource"`
	Subresource     string     `json:"subresource,omitempty"`
	Namespace       string     `json:"namespace,omitempty"`
	Name            string     `json:"name,omitempty"`
	UID             string     `json:"uid,omitempty"`
	ResourceVersion string     `json:"resourceVersion,omitempty"`
	Terminating     bool       `json:"terminating,omitempty"`
	Verb            string     `json:"verb"`
	User            recordUser `json:"user"`
	AuditID         string     `json:"auditID"`
	StageTimestamp  time.Time  `json:"stageTimestamp"`
	LabelSelector   string     `json:"labelSelector,omitempty"`
	DeletedUIDs     []string   `json:"deletedUIDs,omitempty"`
}

type recordUser struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

func recordOf(f *audit.Fact) recordV1 {
	return recordV1{
		V: recordVersion, Route: f.Route, Group: f.Group, Resource: f.Resource, Subresource: f.Subresource,
		Namespace: f.Namespace, Name: f.Name, UID: f.UID, ResourceVersion: f.ResourceVersion,
		Terminating: f.Terminating, Verb: f.Verb,
		User:    recordUser{Username: f.User.Username, UID: f.User.UID, Groups: f.User.Groups, Extra: f.User.Extra},
		AuditID: f.AuditID, StageTimestamp: f.StageTimestamp, LabelSelector: f.LabelSelector, DeletedUIDs: f.DeletedUIDs,
	}
}

func (r *recordV1) fact() *audit.Fact {
	return &audit.Fact{
		Route: r.Route, Group: r.Group, Resource: r.Resource, Subresource: r.Subresource,
		Namespace: r.Namespace, Name: r.Name, UID: r.UID, ResourceVersion: r.ResourceVersion,
		Terminating: r.Terminating, Verb: r.Verb,
		User:    audit.Identity{Username: r.User.Username, UID: r.User.UID, Groups: r.User.Groups, Extra: r.User.Extra},
		AuditID: r.AuditID, StageTimestamp: r.StageTimestamp, LabelSelector: r.LabelSelector, DeletedUIDs: r.DeletedUIDs,
	}
}

// UnknownRecordVersionError is a stored fact record of a version this build cannot read.
type UnknownRecordVersionError struct{ Version int }

func (e *UnknownRecordVersionError) Error() string {
	return fmt.Sprintf("fact record version %d is unknown to this kubescribe (it reads version %d); treated as no fact", e.Version, recordVersion)
}

// decodeRecord reads a record (without its rank).
func decodeRecord(b []byte) (*audit.Fact, error) {
	var r recordV1
	if err := json.Unmarshal(b, &r); err != nil {
		// The version decides how to read the rest: look at it alone before blaming the record.
		var v struct {
			V int `json:"v"`
		}
		if json.Unmarshal(b, &v) == nil && v.V != 0 && v.V != recordVersion {
			return nil, &UnknownRecordVersionError{Version: v.V}
		}
		return nil, fmt.Errorf("decoding fact record: %w", err)
	}
	switch r.V {
	case 0, recordVersion: // 0: written before records carried a version; same fields
		return r.fact(), nil
	}
	return nil, &UnknownRecordVersionError{Version: r.V}
}

// appendRecord appends the record of f, byte for byte what encoding/json makes of
// recordOf(f) (a test holds it to that), without reflection or allocation: a batch of
// hundreds of facts is encoded into one buffer.
func appendRecord(b []byte, f *audit.Fact) []byte {
	b = append(b, `{"v":`...)
	b = append(b, '0'+recordVersion)
	b = appendField(b, "route", f.Route, false)
	b = appendField(b, "group", f.Group, true)
	b = appendField(b, "resource", f.Resource, false)
	b = appendField(b, "subresource", f.Subresource, true)
	b = appendField(b, "namespace", f.Namespace, true)
	b = appendField(b, "name", f.Name, true)
	b = appendField(b, "uid", f.UID, true)
	b = appendField(b, "resourceVersion", f.ResourceVersion, true)
	if f.Terminating {
		b = append(b, `,"terminating":true`...)
	}
	b = appendField(b, "verb", f.Verb, false)
	b = append(b, `,"user":{"username":`...)
	b = appendString(b, f.User.Username)
	b = appendField(b, "uid", f.User.UID, true)
	if len(f.User.Groups) > 0 {
		b = append(b, `,"groups":`...)
		b = appendStrings(b, f.User.Groups)
	}
	if len(f.User.Extra) > 0 {
		b = append(b, `,"extra":{`...)
		var small [8]string
		keys := small[:0]
		for k := range f.User.Extra {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			if v := f.User.Extra[k]; v == nil {
				b = append(b, "null"...)
			} else {
				b = appendStrings(b, v)
			}
		}
		b = append(b, '}')
	}
	b = append(b, '}')
	b = appendField(b, "auditID", f.AuditID, false)
	b = append(b, `,"stageTimestamp":"`...)
	b = f.StageTimestamp.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = appendField(b, "labelSelector", f.LabelSelector, true)
	if len(f.DeletedUIDs) > 0 {
		b = append(b, `,"deletedUIDs":`...)
		b = appendStrings(b, f.DeletedUIDs)
	}
	return append(b, '}')
}

func appendField(b []byte, name, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, v)
}

func appendStrings(b []byte, vs []string) []byte {
	b = append(b, '[')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, v)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// safeASCII reports the ASCII bytes a JSON string holds as they are.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s as a JSON string, escaped as encoding/json escapes it: '"', '\\' and
// control characters, '<', '>' and '&' (HTML-safe), U+2028 and U+2029; invalid UTF-8 becomes
// U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safeASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
