package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
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
	// DropDryRun: the request carried a dryRun query parameter; nothing was persisted.
	DropDryRun DropReason = "dry_run"
	// DropNoop: an update whose response resourceVersion equals the one it sent: nothing changed.
	DropNoop DropReason = "noop"
)

// ResultKept is the result label of kubescribe_audit_events_total for events that became facts.
const ResultKept = "kept"

// DropReasons lists every DropReason, for pre-initialising metrics and for tests.
var DropReasons = []DropReason{DropStage, DropVerb, DropNoObject, DropSubresource, DropFailed, DropDryRun, DropNoop}

// DecodeStats counts what Decode did with one EventList.
type DecodeStats struct {
	// Events is the number of events in the list.
	Events int
	// Kept is the number of events that became facts.
	Kept int
	// Dropped counts the other events by reason; nil when none was dropped.
	Dropped map[DropReason]int
}

func (s *DecodeStats) drop(r DropReason) {
	if s.Dropped == nil {
		s.Dropped = make(map[DropReason]int, len(DropReasons))
	}
	s.Dropped[r]++
}

// The wire types below name only the fields a Fact needs; encoding/json skips every other field
// (requestObject, the objects' spec and status, annotations, ...) without materialising it.

type wireEventList struct {
	Kind       string      `json:"kind"`
	APIVersion string      `json:"apiVersion"`
	Items      []wireEvent `json:"items"`
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
	ResponseObject   *wireResponse  `json:"responseObject"`
	StageTimestamp   time.Time      `json:"stageTimestamp"`
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
// finalizers, scale), a Status (an immediate delete) or a List (deletecollection).
// details and items are kept raw: a custom resource may have top-level fields of those names
// with any shape, which must not fail the batch; they are only read for a Status or a
// deletecollection.
type wireResponse struct {
	Kind     string          `json:"kind"`
	Metadata wireMeta        `json:"metadata"`
	Details  json.RawMessage `json:"details"`
	Items    json.RawMessage `json:"items"`
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

// Decode reads one audit.k8s.io/v1 EventList, as the apiserver's audit webhook posts it, and
// returns a Fact for every event that can explain a write to an object, in the order of the
// list. route is the source cluster's route and is copied into every Fact.
//
// Events that cannot explain a write are dropped silently and counted in stats by reason (see
// DropReason). A body that is not JSON, or not an audit.k8s.io/v1 EventList, is an error; then
// no facts are returned.
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
	var list wireEventList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, DecodeStats{}, fmt.Errorf("decoding audit event list: %w", shortJSONError(err))
	}
	return extractAll(&list, route)
}

func extractAll(list *wireEventList, route string) ([]Fact, DecodeStats, error) {
	if list.Kind != eventListKind || list.APIVersion != eventListAPIVersion {
		return nil, DecodeStats{}, fmt.Errorf("unsupported body: kind %q apiVersion %q, want kind %q apiVersion %q",
			truncate(list.Kind), truncate(list.APIVersion), eventListKind, eventListAPIVersion)
	}
	stats := DecodeStats{Events: len(list.Items)}
	facts := make([]Fact, 0, len(list.Items))
	for i := range list.Items {
		f, reason, ok := extract(&list.Items[i], route)
		if !ok {
			stats.drop(reason)
			continue
		}
		facts = append(facts, f)
	}
	stats.Kept = len(facts)
	return facts, stats, nil
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
	query := requestQuery(ev.RequestURI)
	if _, dry := query["dryRun"]; dry {
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
	case resp.Kind == "Status":
		// An immediate delete answers with a Status: details name the object, no resourceVersion.
		var d wireStatusDetails
		if len(resp.Details) > 0 && json.Unmarshal(resp.Details, &d) == nil {
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
	if json.Unmarshal(raw, &items) != nil {
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

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// shortJSONError keeps the useful part of an encoding/json error: the client sees it in a 400,
// so it names the offset or field but never echoes the body.
func shortJSONError(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("invalid JSON at offset %d: %s", syn.Offset, syn.Error())
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		return fmt.Errorf("field %q: cannot use a JSON %s (offset %d)", typ.Field, typ.Value, typ.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("truncated JSON")
	}
	return err
}

func truncate(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
