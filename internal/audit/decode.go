package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	sigsjson "sigs.k8s.io/json"
)

// The only list kind and version Decode accepts: what the apiserver's audit webhook backend sends.
const (
	eventListKind       = "EventList"
	eventListAPIVersion = "audit.k8s.io/v1"
)

// DropReason says why Decode did not turn an audit event into a Fact. The values are the
// result label of kubescribe_audit_events_total.
type DropReason string

// The reasons an event is dropped, in the order Decode checks them.
const (
	// DropMalformed: the event cannot be decoded (it is not an object, or a field Decode reads
	// has the wrong type, such as an unparsable stageTimestamp or a requestObject.dryRun of a
	// delete that is not a list of strings). Only that event is dropped, not its batch.
	DropMalformed DropReason = "malformed"
	// DropStage: the event is not at stage ResponseComplete (RequestReceived, ResponseStarted
	// and Panic events prove no completed write).
	DropStage DropReason = "stage"
	// DropVerb: the verb is not create, update, patch, delete or deletecollection.
	DropVerb DropReason = "verb"
	// DropNoObject: the event names no resource (no objectRef, or objectRef.resource is empty).
	DropNoObject DropReason = "no_object"
	// DropSubresource: the write went to a subresource other than scale (status, eviction, ...).
	DropSubresource DropReason = "subresource"
	// DropFailed: responseStatus.code is 300 or more, or absent.
	DropFailed DropReason = "failed"
	// DropDryRun: nothing was persisted. The request carried a dryRun query parameter (any
	// verb), or a delete or deletecollection carried a non-empty dryRun in its DeleteOptions
	// body (requestObject.dryRun).
	DropDryRun DropReason = "dry_run"
	// DropNoop: an update whose response resourceVersion equals the one it sent: nothing changed.
	DropNoop DropReason = "noop"
)

// ResultKept is the result label of kubescribe_audit_events_total for events that became facts.
const ResultKept = "kept"

// DropReasons lists every DropReason, for pre-initialising metrics and for tests.
var DropReasons = []DropReason{DropMalformed, DropStage, DropVerb, DropNoObject, DropSubresource, DropFailed, DropDryRun, DropNoop}

// DecodeStats counts what Decode did with one EventList.
type DecodeStats struct {
	// Events is the number of events in the list.
	Events int
	// Kept is the number of events that became facts.
	Kept int
	// Dropped counts the other events by reason; nil when none was dropped.
	Dropped map[DropReason]int
	// Malformed identifies the events dropped as DropMalformed, in list order; nil when none
	// was. It never holds an event's content.
	Malformed []MalformedEvent
}

// MalformedEvent identifies an event Decode could not decode, without its content.
type MalformedEvent struct {
	// Index is the event's position in the list's items.
	Index int
	// AuditID is the event's auditID when it could still be read, else "".
	AuditID string
}

func (s *DecodeStats) drop(r DropReason) {
	if s.Dropped == nil {
		s.Dropped = make(map[DropReason]int, len(DropReasons))
	}
	s.Dropped[r]++
}

// The wire types below name only the fields a Fact needs; the decoder skips every other field
// (the objects' spec and status, annotations, ...) without materialising it.
//
// They are decoded with sigs.k8s.io/json, case-sensitively: encoding/json would also match
// "Metadata" or "METADATA" to a `json:"metadata"` field, so a custom resource with such a
// top-level field (preserve-unknown-fields at the root) could fail its event or override the
// real metadata. Every event is decoded on its own (items are kept raw), so an event that still
// cannot be decoded is dropped as DropMalformed without failing the batch.

type wireEventList struct {
	Kind       string            `json:"kind"`
	APIVersion string            `json:"apiVersion"`
	Items      []json.RawMessage `json:"items"`
}

// wireEventListDecoded is the whole list decoded in one pass (the fast path).
type wireEventListDecoded struct {
	Kind       string       `json:"kind"`
	APIVersion string       `json:"apiVersion"`
	Items      []*wireEvent `json:"items"`
}

type wireEvent struct {
	AuditID          string         `json:"auditID"`
	Stage            string         `json:"stage"`
	RequestURI       string         `json:"requestURI"`
	Verb             string         `json:"verb"`
	User             wireUser       `json:"user"`
	ImpersonatedUser *wireUser      `json:"impersonatedUser"`
	ObjectRef        *wireObjectRef `json:"objectRef"`
	ResponseStatus   *wireStatus    `json:"responseStatus"`
	// RequestObject is kept raw and read only for a delete or deletecollection (its
	// DeleteOptions); for other verbs it is the written object or a patch, of any shape.
	RequestObject  json.RawMessage `json:"requestObject"`
	ResponseObject *wireResponse   `json:"responseObject"`
	StageTimestamp time.Time       `json:"stageTimestamp"`
}

type wireUser struct {
	Username string              `json:"username"`
	UID      string              `json:"uid"`
	Groups   []string            `json:"groups"`
	Extra    map[string][]string `json:"extra"`
}

type wireObjectRef struct {
	Resource        string `json:"resource"`
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	UID             string `json:"uid"`
	APIGroup        string `json:"apiGroup"`
	ResourceVersion string `json:"resourceVersion"`
	Subresource     string `json:"subresource"`
}

// wireStatus is responseStatus, a metav1.Status the apiserver builds itself, so its shape is
// fixed. For a delete answered with a Status, details repeat the object's name and uid; that
// is also the only place a Metadata-level event (secrets) names a deleted object's uid.
type wireStatus struct {
	Code    int32              `json:"code"`
	Details *wireStatusDetails `json:"details"`
}

// wireResponse is responseObject: an object (create, update, patch, a delete held by
// finalizers, scale), a core v1 Status (an immediate delete) or a List (deletecollection).
// details and items are kept raw: a custom resource may have top-level fields of those names
// with any shape, which must not fail the event; they are only read for a Status or a
// deletecollection.
type wireResponse struct {
	Kind       string          `json:"kind"`
	APIVersion string          `json:"apiVersion"`
	Metadata   wireMeta        `json:"metadata"`
	Details    json.RawMessage `json:"details"`
	Items      json.RawMessage `json:"items"`
}

type wireMeta struct {
	UID               string `json:"uid"`
	Name              string `json:"name"`
	Namespace         string `json:"namespace"`
	ResourceVersion   string `json:"resourceVersion"`
	DeletionTimestamp string `json:"deletionTimestamp"`
}

type wireStatusDetails struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type wireListItem struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
}

// wireDeleteOptions is the requestObject of a delete or deletecollection: the DeleteOptions,
// which the apiserver records re-encoded (apiVersion meta.k8s.io/__internal). Server-side
// dry-run of a delete (kubectl delete --dry-run=server, client-go DeleteOptions.DryRun) is
// usually only there, not in the URI.
type wireDeleteOptions struct {
	DryRun []string `json:"dryRun"`
}

// wireAuditID reads only the auditID of an event that failed to decode, to name it in logs.
type wireAuditID struct {
	AuditID string `json:"auditID"`
}

// unmarshal is the one JSON decoder of this package: encoding/json semantics, but object keys
// match field tags case-sensitively.
func unmarshal(data []byte, v any) error {
	return sigsjson.UnmarshalCaseSensitivePreserveInts(data, v)
}

// Decode reads one audit.k8s.io/v1 EventList, as the apiserver's audit webhook posts it, and
// returns a Fact for every event that can explain a write to an object, in the order of the
// list. route is the source cluster's route and is copied into every Fact.
//
// Events that cannot explain a write are dropped silently and counted in stats by reason (see
// DropReason); so is an event that cannot be decoded (DropMalformed, listed in
// stats.Malformed). A body that is not JSON, or not an audit.k8s.io/v1 EventList, is an error;
// then no facts are returned.
func Decode(r io.Reader, route string) (facts []Fact, stats DecodeStats, err error) {
	var buf bytes.Buffer
	if l, ok := r.(interface{ Len() int }); ok {
		buf.Grow(l.Len() + bytes.MinRead) // one allocation when the size is known
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, DecodeStats{}, fmt.Errorf("reading audit event list: %w", err)
	}
	return decodeBytes(buf.Bytes(), route)
}

// decodeBytes is Decode for a body already in memory.
func decodeBytes(data []byte, route string) ([]Fact, DecodeStats, error) {
	// Fast path: the whole list in one pass. It fails when any one event cannot be decoded;
	// then every event is decoded on its own, so that only that event is lost.
	var whole wireEventListDecoded
	if unmarshal(data, &whole) == nil && !slices.Contains(whole.Items, nil) {
		if err := checkListKind(whole.Kind, whole.APIVersion); err != nil {
			return nil, DecodeStats{}, err
		}
		return extractEach(len(whole.Items),
			func(i int) (Fact, DropReason, bool) { return extract(whole.Items[i], route) },
			func(i int) string { return whole.Items[i].AuditID })
	}
	var list wireEventList
	if err := unmarshal(data, &list); err != nil {
		return nil, DecodeStats{}, fmt.Errorf("decoding audit event list: %w", listError(data, err))
	}
	if err := checkListKind(list.Kind, list.APIVersion); err != nil {
		return nil, DecodeStats{}, err
	}
	return extractEach(len(list.Items),
		func(i int) (Fact, DropReason, bool) { return decodeEvent(list.Items[i], route) },
		func(i int) string { return malformedAuditID(list.Items[i]) })
}

func checkListKind(kind, apiVersion string) error {
	if kind != eventListKind || apiVersion != eventListAPIVersion {
		return fmt.Errorf("unsupported body: kind %q apiVersion %q, want kind %q apiVersion %q",
			truncate(kind), truncate(apiVersion), eventListKind, eventListAPIVersion)
	}
	return nil
}

// extractEach builds the facts of n events; event(i) decodes and filters the i-th, auditID(i)
// names it when it is malformed.
func extractEach(n int, event func(int) (Fact, DropReason, bool), auditID func(int) string) ([]Fact, DecodeStats, error) {
	stats := DecodeStats{Events: n}
	facts := make([]Fact, 0, n)
	for i := range n {
		f, reason, ok := event(i)
		if !ok {
			stats.drop(reason)
			if reason == DropMalformed {
				stats.Malformed = append(stats.Malformed, MalformedEvent{Index: i, AuditID: auditID(i)})
			}
			continue
		}
		facts = append(facts, f)
	}
	stats.Kept = len(facts)
	return facts, stats, nil
}

// decodeEvent decodes one item of the list and passes it to extract. An item that does not
// decode is DropMalformed: it costs that event, never the batch.
func decodeEvent(raw json.RawMessage, route string) (Fact, DropReason, bool) {
	// The list parsed, so raw is one valid JSON value, without leading space. Only an object is
	// an event: null would decode into an empty event without error.
	if len(raw) == 0 || raw[0] != '{' {
		return Fact{}, DropMalformed, false
	}
	var ev wireEvent
	if unmarshal(raw, &ev) != nil {
		return Fact{}, DropMalformed, false
	}
	return extract(&ev, route)
}

// extract applies the filter to one event and builds its Fact.
func extract(ev *wireEvent, route string) (Fact, DropReason, bool) {
	if ev.Stage != "ResponseComplete" {
		return Fact{}, DropStage, false
	}
	switch ev.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
	default:
		return Fact{}, DropVerb, false
	}
	ref := ev.ObjectRef
	if ref == nil || ref.Resource == "" {
		return Fact{}, DropNoObject, false
	}
	if ref.Subresource != "" && ref.Subresource != "scale" {
		return Fact{}, DropSubresource, false
	}
	// The apiserver always records a code at ResponseComplete (200 when the handler wrote
	// none); an event without one proves nothing, so it is treated as failed.
	if ev.ResponseStatus == nil || ev.ResponseStatus.Code < 200 || ev.ResponseStatus.Code >= 300 {
		return Fact{}, DropFailed, false
	}
	// A dry-run answers exactly like the real write. For a delete or deletecollection the
	// recorded DeleteOptions are the effective options: the apiserver takes them from the body
	// when there is one (ignoring the URI) and from the query otherwise. Other verbs, and a
	// delete audited without its request (Metadata level: secrets), have only the URI.
	query := requestQuery(ev.RequestURI)
	if isDelete(ev.Verb) && len(ev.RequestObject) > 0 && string(ev.RequestObject) != "null" {
		var opts wireDeleteOptions
		if unmarshal(ev.RequestObject, &opts) != nil {
			return Fact{}, DropMalformed, false
		}
		if len(opts.DryRun) > 0 {
			return Fact{}, DropDryRun, false
		}
	} else if _, dry := query["dryRun"]; dry {
		return Fact{}, DropDryRun, false
	}

	user := ev.User
	if ev.ImpersonatedUser != nil {
		user = *ev.ImpersonatedUser
	}
	f := Fact{
		Route:          route,
		Group:          ref.APIGroup,
		Resource:       ref.Resource,
		Subresource:    ref.Subresource,
		Namespace:      ref.Namespace,
		Name:           ref.Name,
		UID:            ref.UID,
		Verb:           ev.Verb,
		User:           Identity{Username: user.Username, UID: user.UID, Groups: user.Groups, Extra: user.Extra},
		AuditID:        ev.AuditID,
		StageTimestamp: ev.StageTimestamp,
	}

	if ev.Verb == "deletecollection" {
		f.LabelSelector = query.Get("labelSelector")
	}
	if d := ev.ResponseStatus.Details; d != nil && ev.Verb == "delete" {
		f.UID = firstNonEmpty(d.UID, f.UID)
		f.Name = firstNonEmpty(f.Name, d.Name)
	}
	resp := ev.ResponseObject
	switch {
	case resp == nil:
		// Metadata-level event (secrets): no response object, so no post-write
		// resourceVersion, and no uid for a create.
	case ev.Verb == "deletecollection":
		// The response is a List of the deleted objects; its resourceVersion is the list's,
		// not a deletion's.
		f.DeletedUIDs = listItemUIDs(resp.Items)
	case isDelete(ev.Verb) && resp.Kind == "Status" && resp.APIVersion == "v1":
		// An immediate delete answers with the core v1 Status: details name the object, no
		// resourceVersion. (A deletecollection answers a List, handled above.) Any other
		// response whose kind is "Status" is an object like any other: a custom resource may
		// be of kind Status in its own group.
		var d wireStatusDetails
		if len(resp.Details) > 0 && unmarshal(resp.Details, &d) == nil {
			f.UID = firstNonEmpty(d.UID, f.UID)
			f.Name = firstNonEmpty(f.Name, d.Name)
		}
	default:
		m := resp.Metadata
		f.UID = firstNonEmpty(m.UID, f.UID)
		f.Name = firstNonEmpty(f.Name, m.Name)
		f.Namespace = firstNonEmpty(f.Namespace, m.Namespace)
		f.ResourceVersion = m.ResourceVersion
		f.Terminating = m.DeletionTimestamp != ""
		// objectRef.resourceVersion of an update is the one the request sent; the apiserver
		// answers a write that changes nothing with that same resourceVersion.
		if ev.Verb == "update" && ref.ResourceVersion != "" && ref.ResourceVersion == m.ResourceVersion {
			return Fact{}, DropNoop, false
		}
	}
	return f, "", true
}

// requestQuery parses the query of an audit event's requestURI. A malformed pair does not hide
// the others: url.ParseQuery keeps every pair it could parse.
func requestQuery(requestURI string) url.Values {
	_, raw, ok := strings.Cut(requestURI, "?")
	if !ok || raw == "" {
		return nil
	}
	q, _ := url.ParseQuery(raw)
	return q
}

// listItemUIDs returns the metadata.uid of every item of a List response. A value that is not a
// list of objects yields nil: the UIDs are a hint, never a reason to fail the batch.
func listItemUIDs(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var items []wireListItem
	if unmarshal(raw, &items) != nil {
		return nil
	}
	var uids []string
	for _, it := range items {
		if it.Metadata.UID != "" {
			uids = append(uids, it.Metadata.UID)
		}
	}
	return uids
}

// isDelete reports whether verb deletes: its requestObject is a DeleteOptions.
func isDelete(verb string) bool {
	return verb == "delete" || verb == "deletecollection"
}

// malformedAuditID returns the auditID of an event that failed to decode, when that field alone
// still decodes; "" otherwise.
func malformedAuditID(raw json.RawMessage) string {
	var id wireAuditID
	if len(raw) == 0 || raw[0] != '{' || unmarshal(raw, &id) != nil {
		return ""
	}
	return truncate(id.AuditID)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// listError explains why data did not decode as an EventList: the client sees it in a 400, so
// it names the offset, or the field and the JSON type found, and never echoes the body (a
// syntax error quotes at most one character).
func listError(data []byte, err error) error {
	if syn, off := sigsjson.SyntaxErrorOffset(err); syn {
		return fmt.Errorf("invalid JSON at offset %d: %s", off, truncateTo(err.Error(), 160))
	}
	// Valid JSON of the wrong shape; look again, field by field (an error path, so the cost of
	// a second decode does not matter).
	var top map[string]json.RawMessage
	if unmarshal(data, &top) != nil {
		return fmt.Errorf("the body is a JSON %s, not an object", jsonType(data))
	}
	for _, f := range []struct {
		name string
		want string
	}{{"kind", "string"}, {"apiVersion", "string"}, {"items", "array"}} {
		if v, ok := top[f.name]; ok {
			if got := jsonType(v); got != f.want && got != "null" {
				return fmt.Errorf("field %q: want a JSON %s, got a JSON %s", f.name, f.want, got)
			}
		}
	}
	return errors.New("not an EventList") // not reached: those are the only fields decoded
}

// jsonType names the type of a valid JSON value.
func jsonType(v []byte) string {
	v = bytes.TrimLeft(v, " \t\r\n")
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func truncate(s string) string { return truncateTo(s, 64) }

func truncateTo(s string, max int) string {
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
