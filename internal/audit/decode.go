package audit

import (
	"bytes"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unsafe"
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

// The decoder reads an EventList in one pass over the body (scanner, scan.go) and builds a fact
// from each event without materialising anything else: the bodies of requestObject and
// responseObject are skipped, except responseObject's kind, apiVersion and metadata, and the
// spans of a few values read only when the verb needs them.
//
// Rules, as the previous decoder built on sigs.k8s.io/json applied them:
//   - Keys match case-sensitively, after unescaping: "metadata" is metadata, "Metadata" is an
//     unknown field, and "meta\u0064ata" is metadata.
//   - Unknown fields, of any shape and size, are skipped (but validated).
//   - null leaves a field unset.
//   - A field read here whose JSON type is wrong makes its event malformed (DropMalformed), and
//     so does a field read here that appears twice in the same object: a duplicate is never
//     produced by the apiserver, and neither "first wins" nor "last wins" is a safe guess. The
//     rest of the event is still scanned (the body must stay valid JSON), never used.
//   - Any syntax error, anywhere in the body, fails the whole batch.

// event is what the decoder read of one audit event.
type event struct {
	auditID       string
	auditIDOK     bool // auditID was a string (names a malformed event)
	stageComplete bool
	verb          string
	uri           span
	user, imp     userAcc
	hasImp        bool
	ref           objectRef
	hasRef        bool
	code          int32
	hasStatus     bool
	details       statusDetails // responseStatus.details
	request       span          // requestObject, when not null
	resp          response
	hasResp       bool
	stageTime     time.Time
	// bad: a field read here had the wrong type or appeared twice.
	bad bool
}

// span is a value's extent in the body; set is false when the value was absent or null.
type span struct {
	start, end int
	escaped    bool // a string span holds an escape
	set        bool
}

type objectRef struct {
	resource, namespace, name, uid, apiGroup, resourceVersion, subresource string
}

type statusDetails struct{ name, uid string }

// response is responseObject: an object (create, update, patch, a delete held by finalizers,
// scale), a core v1 Status (an immediate delete) or a List (deletecollection). details and
// items are only located: a custom resource may have top-level fields of those names with any
// shape, which must not fail the event; they are read only for a Status or a deletecollection.
type response struct {
	kind, apiVersion   string
	uid, name          string
	namespace          string
	resourceVersion    string
	terminating        bool // metadata.deletionTimestamp is a non-empty string
	details, listItems span
}

// userAcc collects a user object; groups and extra are built into Identity only for the user a
// kept fact credits.
type userAcc struct {
	username, uid string
	groups        []string
	groupsSet     bool
	extraKeys     []string
	extraEnd      []int // extraVals[extraEnd[i-1]:extraEnd[i]] are the values of extraKeys[i]
	extraVals     []string
	extraNil      []bool // the values of extraKeys[i] were null
}

func (u *userAcc) reset() {
	u.username, u.uid = "", ""
	u.groups, u.groupsSet = u.groups[:0], false
	u.extraKeys, u.extraEnd, u.extraVals, u.extraNil = u.extraKeys[:0], u.extraEnd[:0], u.extraVals[:0], u.extraNil[:0]
}

// decoder holds the state of one decode; pooled, so that a batch allocates little beyond its
// facts.
type decoder struct {
	s     scanner
	route string
	ev    event
	facts []Fact
	stats DecodeStats
	// interned holds strings that repeat from event to event (users, groups, namespaces,
	// resources), so that each is allocated once; bounded by maxInterned.
	interned map[string]string
	// lastGroups and lastExtra are the groups and extra of the previous fact's user: facts of
	// one user share them rather than allocating them per event.
	lastGroups []string
	lastExtra  map[string][]string
	// arena holds the bytes of the facts' other strings (auditIDs, names, uids,
	// resourceVersions): one allocation for many. Through decodeBytes it is handed over with the
	// facts; in the handler it is reused by the next batch (see FactStore).
	arena []byte
}

// arenaChunk is the size of an arena allocation: the strings of a few hundred facts.
const arenaChunk = 32 << 10

const maxInterned = 4096

// decoders keeps a few decoders for reuse. Unlike a sync.Pool it is not emptied by every
// garbage collection, so a steady stream of batches reuses the same fact slices.
var decoders = make(chan *decoder, 4)

func getDecoder() *decoder {
	select {
	case d := <-decoders:
		return d
	default:
		return &decoder{interned: make(map[string]string, 64)}
	}
}

// putDecoder keeps d for reuse; facts handed out by d must no longer be used.
func putDecoder(d *decoder) {
	clear(d.facts)
	d.facts = d.facts[:0]
	d.s.data = nil
	d.stats = DecodeStats{}
	d.arena = d.arena[:0]
	select {
	case decoders <- d:
	default:
	}
}

// Decode reads one audit.k8s.io/v1 EventList, as the apiserver's audit webhook posts it, and
// returns a Fact for every event that can explain a write to an object, in the order of the
// list. route is the source cluster's route and is copied into every Fact. Facts may share
// their User.Groups and User.Extra with each other: treat them as read-only.
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

// decodeBytes is Decode for a body already in memory. The facts are the caller's.
func decodeBytes(data []byte, route string) ([]Fact, DecodeStats, error) {
	d := getDecoder()
	d.facts, d.arena = nil, nil // handed to the caller, not reused
	facts, stats, err := d.decode(data, route)
	d.facts, d.arena = nil, nil
	putDecoder(d)
	return facts, stats, err
}

// decode decodes data with d. The facts returned alias d.facts: valid until putDecoder(d).
func (d *decoder) decode(data []byte, route string) (facts []Fact, stats DecodeStats, err error) {
	d.s.data, d.s.pos = data, 0
	d.route = d.intern([]byte(route))
	d.stats = DecodeStats{}
	d.facts = d.facts[:0]
	if len(d.interned) > maxInterned {
		clear(d.interned)
	}
	defer func() {
		if r := recover(); r != nil {
			se, ok := r.(*syntaxError)
			if !ok {
				panic(r)
			}
			facts, stats = nil, DecodeStats{}
			err = fmt.Errorf("decoding audit event list: invalid JSON at offset %d: %s", se.off, truncateTo(se.msg, 160))
		}
	}()

	s := &d.s
	var kind, apiVersion string
	var typeErr [3]string // kind, apiVersion, items: the first wrong JSON type of each
	var seen uint8
	var dup, notObject string
	switch c := s.skipWS(); c {
	case '{':
		for first := true; ; {
			key, ok := s.object(&first)
			if !ok {
				break
			}
			field, bit := -1, uint8(0)
			switch string(key) {
			case "kind":
				field, bit = 0, 1
			case "apiVersion":
				field, bit = 1, 2
			case "items":
				field, bit = 2, 4
			}
			if field < 0 {
				s.skipValue()
				continue
			}
			if seen&bit != 0 && dup == "" {
				dup = string(key)
			}
			seen |= bit
			c := s.peek()
			switch {
			case c == 'n':
				s.literal("null")
			case field == 2 && c == '[':
				d.items()
			case field < 2 && c == '"':
				v := d.str()
				if field == 0 {
					kind = v
				} else {
					apiVersion = v
				}
			default:
				want := "string"
				if field == 2 {
					want = "array"
				}
				typeErr[field] = fmt.Sprintf("field %q: want a JSON %s, got a JSON %s", key, want, jsonType(s.data[s.pos:]))
				s.skipValue()
			}
		}
	case 'n':
		s.literal("null") // decodes as an empty list: its kind is wrong
	default:
		notObject = jsonType(data[s.pos:])
		s.skipValue()
	}
	if s.skipWS(); s.pos < len(data) {
		s.failChar("after top-level value")
	}

	if notObject != "" {
		return nil, DecodeStats{}, fmt.Errorf("decoding audit event list: the body is a JSON %s, not an object", notObject)
	}
	for _, e := range typeErr {
		if e != "" {
			return nil, DecodeStats{}, fmt.Errorf("decoding audit event list: %s", e)
		}
	}
	if dup != "" {
		return nil, DecodeStats{}, fmt.Errorf("decoding audit event list: duplicate field %q", dup)
	}
	if err := checkListKind(kind, apiVersion); err != nil {
		return nil, DecodeStats{}, err
	}
	d.stats.Kept = len(d.facts)
	return d.facts, d.stats, nil
}

func checkListKind(kind, apiVersion string) error {
	if kind != eventListKind || apiVersion != eventListAPIVersion {
		return fmt.Errorf("unsupported body: kind %q apiVersion %q, want kind %q apiVersion %q",
			truncate(kind), truncate(apiVersion), eventListKind, eventListAPIVersion)
	}
	return nil
}

// items decodes the events of the list's items array.
func (d *decoder) items() {
	s := &d.s
	for first := true; s.array(&first); {
		i := d.stats.Events
		d.stats.Events++
		if s.peek() != '{' {
			// Only an object is an event (null would be an empty one).
			s.skipValue()
			d.dropMalformed(i, "")
			continue
		}
		d.event()
		f, reason := d.extract()
		if reason != "" {
			if reason == DropMalformed {
				id := ""
				if d.ev.auditIDOK {
					id = truncate(d.ev.auditID)
				}
				d.dropMalformed(i, id)
			} else {
				d.stats.drop(reason)
			}
			continue
		}
		d.facts = append(d.facts, f)
	}
}

func (d *decoder) dropMalformed(i int, auditID string) {
	d.stats.drop(DropMalformed)
	d.stats.Malformed = append(d.stats.Malformed, MalformedEvent{Index: i, AuditID: auditID})
}

// Bits of the fields of an event read here, to find duplicates.
const (
	fAuditID = 1 << iota
	fStage
	fRequestURI
	fVerb
	fUser
	fImpersonatedUser
	fObjectRef
	fResponseStatus
	fRequestObject
	fResponseObject
	fStageTimestamp
)

// once marks bit in *seen; a bit already set makes the event malformed.
func (d *decoder) once(seen *uint32, bit uint32) {
	if *seen&bit != 0 {
		d.ev.bad = true
	}
	*seen |= bit
}

// event reads one event object; the position is at its '{'.
func (d *decoder) event() {
	s := &d.s
	ev := &d.ev
	user, imp := ev.user, ev.imp // keep their scratch slices
	user.reset()
	imp.reset()
	*ev = event{user: user, imp: imp}
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return
		}
		switch string(key) {
		case "auditID":
			d.once(&seen, fAuditID)
			ev.auditID, ev.auditIDOK = d.stringValue(false)
			ev.bad = ev.bad || !ev.auditIDOK
		case "stage":
			d.once(&seen, fStage)
			if sp, ok := d.stringSpan(); ok {
				ev.stageComplete = string(s.unescape(sp.start, sp.end, sp.escaped)) == "ResponseComplete"
			}
		case "requestURI":
			d.once(&seen, fRequestURI)
			ev.uri, _ = d.stringSpan()
		case "verb":
			d.once(&seen, fVerb)
			if sp, ok := d.stringSpan(); ok && sp.set {
				ev.verb = knownVerb(s.unescape(sp.start, sp.end, sp.escaped))
			}
		case "user":
			d.once(&seen, fUser)
			d.userObject(&ev.user)
		case "impersonatedUser":
			d.once(&seen, fImpersonatedUser)
			ev.hasImp = d.userObject(&ev.imp)
		case "objectRef":
			d.once(&seen, fObjectRef)
			ev.hasRef = d.objectRef(&ev.ref)
		case "responseStatus":
			d.once(&seen, fResponseStatus)
			ev.hasStatus = d.responseStatus()
		case "requestObject":
			d.once(&seen, fRequestObject)
			ev.request = d.valueSpan()
		case "responseObject":
			d.once(&seen, fResponseObject)
			ev.hasResp = d.responseObject(&ev.resp)
		case "stageTimestamp":
			d.once(&seen, fStageTimestamp)
			if sp, ok := d.stringSpan(); !ok {
				ev.bad = true
			} else if sp.set && ev.stageTime.UnmarshalJSON(s.data[sp.start-1:sp.end+1]) != nil {
				ev.bad = true
			}
		default:
			s.skipValue()
		}
	}
}

// knownVerb returns the verbs a fact may carry as constants (no allocation); "" for any other.
func knownVerb(b []byte) string {
	switch string(b) {
	case "create":
		return "create"
	case "update":
		return "update"
	case "patch":
		return "patch"
	case "delete":
		return "delete"
	case "deletecollection":
		return "deletecollection"
	}
	return ""
}

// str reads the string at the position (which holds '"'), unescaped, into a new string.
func (d *decoder) str() string {
	start, end, esc := d.s.str()
	return string(d.s.unescape(start, end, esc))
}

// intern returns b as a string, allocated once per distinct value.
func (d *decoder) intern(b []byte) string {
	if v, ok := d.interned[string(b)]; ok {
		return v
	}
	v := string(b)
	d.interned[v] = v
	return v
}

// arenaString copies b into the arena and returns it as a string.
func (d *decoder) arenaString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if cap(d.arena)-len(d.arena) < len(b) {
		// The full chunk stays alive as long as a string points into it. The next one is
		// larger, so that a reused arena soon holds a whole batch.
		d.arena = make([]byte, 0, max(arenaChunk, 2*cap(d.arena), len(b)))
	}
	start := len(d.arena)
	d.arena = append(d.arena, b...)
	return unsafe.String(&d.arena[start], len(b))
}

// stringValue reads a string field: ("", true) for null, ("", false) for another type (the
// value is skipped). intern chooses interning for values that repeat across events.
func (d *decoder) stringValue(intern bool) (string, bool) {
	s := &d.s
	switch s.peek() {
	case '"':
		start, end, esc := s.str()
		b := s.unescape(start, end, esc)
		if intern {
			return d.intern(b), true
		}
		return d.arenaString(b), true
	case 'n':
		s.literal("null")
		return "", true
	}
	s.skipValue()
	return "", false
}

// stringField reads a string field into *dst; another type makes the event malformed.
func (d *decoder) stringField(dst *string, intern bool) {
	v, ok := d.stringValue(intern)
	if !ok {
		d.ev.bad = true
	}
	*dst = v
}

// stringSpan locates a string field without copying it; another type makes the event
// malformed and returns false.
func (d *decoder) stringSpan() (span, bool) {
	s := &d.s
	switch s.peek() {
	case '"':
		start, end, esc := s.str()
		return span{start: start, end: end, escaped: esc, set: true}, true
	case 'n':
		s.literal("null")
		return span{}, true
	}
	s.skipValue()
	d.ev.bad = true
	return span{}, false
}

// valueSpan locates a value of any type; null is unset.
func (d *decoder) valueSpan() span {
	s := &d.s
	if s.peek() == 'n' {
		s.literal("null")
		return span{}
	}
	start := s.pos
	s.skipValue()
	return span{start: start, end: s.pos, set: true}
}

// objectStart reports whether the value at the position is an object to read; null is
// consumed (false), another type is skipped and makes the event malformed (false).
func (d *decoder) objectStart() bool {
	s := &d.s
	switch s.peek() {
	case '{':
		return true
	case 'n':
		s.literal("null")
		return false
	}
	s.skipValue()
	d.ev.bad = true
	return false
}

// userObject reads a user (authentication/v1 UserInfo); false when null.
func (d *decoder) userObject(u *userAcc) bool {
	if !d.objectStart() {
		return false
	}
	s := &d.s
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return true
		}
		switch string(key) {
		case "username":
			d.once(&seen, 1)
			d.stringField(&u.username, true)
		case "uid":
			d.once(&seen, 2)
			d.stringField(&u.uid, true)
		case "groups":
			d.once(&seen, 4)
			u.groups, u.groupsSet = d.stringList(u.groups[:0])
		case "extra":
			d.once(&seen, 8)
			d.extra(u)
		default:
			s.skipValue()
		}
	}
}

// stringList reads a list of strings (interned) into dst; set is false for null. Another type,
// of the list or an element, makes the event malformed.
func (d *decoder) stringList(dst []string) (_ []string, set bool) {
	s := &d.s
	switch s.peek() {
	case 'n':
		s.literal("null")
		return dst, false
	case '[':
	default:
		s.skipValue()
		d.ev.bad = true
		return dst, false
	}
	for first := true; s.array(&first); {
		v, ok := d.stringValue(true)
		if !ok {
			d.ev.bad = true
		}
		dst = append(dst, v)
	}
	return dst, true
}

// extra reads a user's extra (map of string lists).
func (d *decoder) extra(u *userAcc) {
	if !d.objectStart() {
		return
	}
	s := &d.s
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return
		}
		u.extraKeys = append(u.extraKeys, d.intern(key))
		var set bool
		u.extraVals, set = d.stringList(u.extraVals)
		u.extraEnd = append(u.extraEnd, len(u.extraVals))
		u.extraNil = append(u.extraNil, !set)
	}
}

// identity builds the Identity of a user, sharing groups and extra with the previous fact's
// when they are equal.
func (d *decoder) identity(u *userAcc) Identity {
	id := Identity{Username: u.username, UID: u.uid}
	if u.groupsSet {
		if d.lastGroups != nil && slices.Equal(d.lastGroups, u.groups) {
			id.Groups = d.lastGroups
		} else {
			id.Groups = slices.Clone(u.groups)
			if id.Groups == nil {
				id.Groups = []string{}
			}
			d.lastGroups = id.Groups
		}
	}
	if len(u.extraKeys) > 0 {
		if !d.sameExtra(u) {
			m := make(map[string][]string, len(u.extraKeys))
			begin := 0
			for i, k := range u.extraKeys {
				end := u.extraEnd[i]
				var vals []string
				if !u.extraNil[i] {
					vals = slices.Clone(u.extraVals[begin:end])
					if vals == nil {
						vals = []string{}
					}
				}
				m[k] = vals
				begin = end
			}
			d.lastExtra = m
		}
		id.Extra = d.lastExtra
	}
	return id
}

func (d *decoder) sameExtra(u *userAcc) bool {
	if d.lastExtra == nil || len(d.lastExtra) != len(u.extraKeys) {
		return false
	}
	begin := 0
	for i, k := range u.extraKeys {
		end := u.extraEnd[i]
		vals, ok := d.lastExtra[k]
		if !ok || (vals == nil) != u.extraNil[i] || !slices.Equal(vals, u.extraVals[begin:end]) {
			return false
		}
		begin = end
	}
	return true
}

// objectRef reads an event's objectRef; false when null.
func (d *decoder) objectRef(r *objectRef) bool {
	if !d.objectStart() {
		return false
	}
	s := &d.s
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return true
		}
		switch string(key) {
		case "resource":
			d.once(&seen, 1)
			d.stringField(&r.resource, true)
		case "namespace":
			d.once(&seen, 2)
			d.stringField(&r.namespace, true)
		case "name":
			d.once(&seen, 4)
			d.stringField(&r.name, false)
		case "uid":
			d.once(&seen, 8)
			d.stringField(&r.uid, false)
		case "apiGroup":
			d.once(&seen, 16)
			d.stringField(&r.apiGroup, true)
		case "resourceVersion":
			d.once(&seen, 32)
			d.stringField(&r.resourceVersion, false)
		case "subresource":
			d.once(&seen, 64)
			d.stringField(&r.subresource, true)
		default:
			s.skipValue()
		}
	}
}

// responseStatus reads an event's responseStatus (a metav1.Status the apiserver builds
// itself): its code and details; false when null.
func (d *decoder) responseStatus() bool {
	if !d.objectStart() {
		return false
	}
	s := &d.s
	ev := &d.ev
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return true
		}
		switch string(key) {
		case "code":
			d.once(&seen, 1)
			d.int32Field(&ev.code)
		case "details":
			d.once(&seen, 2)
			if !d.objectStart() {
				continue
			}
			var dseen uint32
			for first := true; ; {
				key, ok := s.object(&first)
				if !ok {
					break
				}
				switch string(key) {
				case "name":
					d.once(&dseen, 1)
					d.stringField(&ev.details.name, false)
				case "uid":
					d.once(&dseen, 2)
					d.stringField(&ev.details.uid, false)
				default:
					s.skipValue()
				}
			}
		default:
			s.skipValue()
		}
	}
}

// int32Field reads an integer that fits int32, as encoding/json decodes into an int32: no
// fraction, no exponent. Anything else makes the event malformed.
func (d *decoder) int32Field(dst *int32) {
	s := &d.s
	c := s.peek()
	if c == 'n' {
		s.literal("null")
		return
	}
	if c != '-' && (c < '0' || c > '9') {
		s.skipValue()
		d.ev.bad = true
		return
	}
	start, end := s.number()
	v, err := strconv.ParseInt(unsafeString(s.data[start:end]), 10, 32)
	if err != nil {
		d.ev.bad = true
		return
	}
	*dst = int32(v)
}

// responseObject reads what a fact needs of responseObject; false when null.
func (d *decoder) responseObject(r *response) bool {
	if !d.objectStart() {
		return false
	}
	s := &d.s
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return true
		}
		switch string(key) {
		case "kind":
			d.once(&seen, 1)
			d.stringField(&r.kind, true)
		case "apiVersion":
			d.once(&seen, 2)
			d.stringField(&r.apiVersion, true)
		case "metadata":
			d.once(&seen, 4)
			d.metadata(r)
		case "details":
			d.once(&seen, 8)
			r.details = d.valueSpan()
		case "items":
			d.once(&seen, 16)
			r.listItems = d.valueSpan()
		default:
			s.skipValue()
		}
	}
}

// metadata reads the ObjectMeta fields a fact needs.
func (d *decoder) metadata(r *response) {
	if !d.objectStart() {
		return
	}
	s := &d.s
	var seen uint32
	for first := true; ; {
		key, ok := s.object(&first)
		if !ok {
			return
		}
		switch string(key) {
		case "uid":
			d.once(&seen, 1)
			d.stringField(&r.uid, false)
		case "name":
			d.once(&seen, 2)
			d.stringField(&r.name, false)
		case "namespace":
			d.once(&seen, 4)
			d.stringField(&r.namespace, true)
		case "resourceVersion":
			d.once(&seen, 8)
			d.stringField(&r.resourceVersion, false)
		case "deletionTimestamp":
			d.once(&seen, 16)
			if sp, ok := d.stringSpan(); ok {
				r.terminating = sp.set && sp.end > sp.start
			}
		default:
			s.skipValue()
		}
	}
}

// at runs fn with the scanner at offset pos of the body (a value located earlier, hence
// already validated), then restores the position.
func (d *decoder) at(pos int, fn func()) {
	saved := d.s.pos
	d.s.pos = pos
	fn()
	d.s.pos = saved
}

// extract applies the filter to the event just read and builds its Fact; reason is "" when the
// event is kept.
func (d *decoder) extract() (Fact, DropReason) {
	ev := &d.ev
	if ev.bad {
		return Fact{}, DropMalformed
	}
	if !ev.stageComplete {
		return Fact{}, DropStage
	}
	if ev.verb == "" {
		return Fact{}, DropVerb
	}
	ref := &ev.ref
	if !ev.hasRef || ref.resource == "" {
		return Fact{}, DropNoObject
	}
	if ref.subresource != "" && ref.subresource != "scale" {
		return Fact{}, DropSubresource
	}
	// The apiserver always records a code at ResponseComplete (200 when the handler wrote
	// none); an event without one proves nothing, so it is treated as failed.
	if !ev.hasStatus || ev.code < 200 || ev.code >= 300 {
		return Fact{}, DropFailed
	}
	// A dry-run answers exactly like the real write. For a delete or deletecollection the
	// recorded DeleteOptions are the effective options: the apiserver takes them from the body
	// when there is one (ignoring the URI) and from the query otherwise. Other verbs, and a
	// delete audited without its request (Metadata level: secrets), have only the URI.
	if isDelete(ev.verb) && ev.request.set {
		dry, ok := d.deleteDryRun()
		if !ok {
			return Fact{}, DropMalformed
		}
		if dry {
			return Fact{}, DropDryRun
		}
	} else if d.queryHasDryRun() {
		return Fact{}, DropDryRun
	}

	user := &ev.user
	if ev.hasImp {
		user = &ev.imp
	}
	f := Fact{
		Route:          d.route,
		Group:          ref.apiGroup,
		Resource:       ref.resource,
		Subresource:    ref.subresource,
		Namespace:      ref.namespace,
		Name:           ref.name,
		UID:            ref.uid,
		Verb:           ev.verb,
		User:           d.identity(user),
		AuditID:        ev.auditID,
		StageTimestamp: ev.stageTime,
	}

	if ev.verb == "deletecollection" {
		f.LabelSelector = d.labelSelector()
	}
	if ev.verb == "delete" {
		f.UID = firstNonEmpty(ev.details.uid, f.UID)
		f.Name = firstNonEmpty(f.Name, ev.details.name)
	}
	resp := &ev.resp
	switch {
	case !ev.hasResp:
		// Metadata-level event (secrets): no response object, so no post-write
		// resourceVersion, and no uid for a create.
	case ev.verb == "deletecollection":
		// The response is a List of the deleted objects; its resourceVersion is the list's,
		// not a deletion's.
		f.DeletedUIDs = d.listItemUIDs(resp.listItems)
	case isDelete(ev.verb) && resp.kind == "Status" && resp.apiVersion == "v1":
		// An immediate delete answers with the core v1 Status: details name the object, no
		// resourceVersion. (A deletecollection answers a List, handled above.) Any other
		// response whose kind is "Status" is an object like any other: a custom resource may
		// be of kind Status in its own group.
		if det, ok := d.statusDetails(resp.details); ok {
			f.UID = firstNonEmpty(det.uid, f.UID)
			f.Name = firstNonEmpty(f.Name, det.name)
		}
	default:
		f.UID = firstNonEmpty(resp.uid, f.UID)
		f.Name = firstNonEmpty(f.Name, resp.name)
		f.Namespace = firstNonEmpty(f.Namespace, resp.namespace)
		f.ResourceVersion = resp.resourceVersion
		f.Terminating = resp.terminating
		// objectRef.resourceVersion of an update is the one the request sent; the apiserver
		// answers a write that changes nothing with that same resourceVersion.
		if ev.verb == "update" && ref.resourceVersion != "" && ref.resourceVersion == resp.resourceVersion {
			return Fact{}, DropNoop
		}
	}
	return f, ""
}

// deleteDryRun reads requestObject as DeleteOptions and reports whether its dryRun is a
// non-empty list; ok is false when it is not an object or dryRun is not a list of strings.
func (d *decoder) deleteDryRun() (dry, ok bool) {
	ok = true
	d.at(d.ev.request.start, func() {
		s := &d.s
		if s.peek() != '{' {
			ok = false
			return
		}
		var seen uint32
		for first := true; ; {
			key, more := s.object(&first)
			if !more {
				return
			}
			if string(key) != "dryRun" {
				s.skipValue()
				continue
			}
			if seen != 0 {
				ok = false
			}
			seen = 1
			bad := d.ev.bad
			list, _ := d.stringList(nil)
			if d.ev.bad {
				ok = false
			}
			d.ev.bad = bad
			dry = len(list) > 0
		}
	})
	return dry && ok, ok
}

// statusDetails reads the details of a core v1 Status response; ok is false when they are
// absent or of the wrong shape (then they are ignored, not the event).
func (d *decoder) statusDetails(sp span) (det statusDetails, ok bool) {
	if !sp.set {
		return statusDetails{}, false
	}
	bad := d.ev.bad
	d.at(sp.start, func() {
		s := &d.s
		if !d.objectStart() {
			return
		}
		for first := true; ; {
			key, more := s.object(&first)
			if !more {
				return
			}
			switch string(key) {
			case "name":
				d.stringField(&det.name, false)
			case "uid":
				d.stringField(&det.uid, false)
			default:
				s.skipValue()
			}
		}
	})
	ok = !d.ev.bad
	d.ev.bad = bad
	return det, ok
}

// listItemUIDs returns the metadata.uid of every item of a List response. A value that is not a
// list of objects yields nil: the UIDs are a hint, never a reason to fail the batch.
func (d *decoder) listItemUIDs(sp span) []string {
	if !sp.set {
		return nil
	}
	bad := d.ev.bad
	var uids []string
	d.at(sp.start, func() {
		s := &d.s
		if s.peek() != '[' {
			s.skipValue()
			d.ev.bad = true
			return
		}
		for first := true; s.array(&first); {
			if !d.objectStart() {
				continue
			}
			for first := true; ; {
				key, more := s.object(&first)
				if !more {
					break
				}
				if string(key) != "metadata" || !d.objectStart() {
					if string(key) != "metadata" {
						s.skipValue()
					}
					continue
				}
				for first := true; ; {
					key, more := s.object(&first)
					if !more {
						break
					}
					if string(key) != "uid" {
						s.skipValue()
						continue
					}
					var uid string
					d.stringField(&uid, false)
					if uid != "" {
						uids = append(uids, uid)
					}
				}
			}
		}
	})
	if d.ev.bad {
		uids = nil
	}
	d.ev.bad = bad
	return uids
}

// query returns the query of the event's requestURI, unescaped from JSON; it aliases the
// scanner's scratch buffer.
func (d *decoder) query() []byte {
	ev := &d.ev
	if !ev.uri.set {
		return nil
	}
	uri := d.s.unescape(ev.uri.start, ev.uri.end, ev.uri.escaped)
	i := bytes.IndexByte(uri, '?')
	if i < 0 {
		return nil
	}
	return uri[i+1:]
}

// queryHasDryRun reports whether the event's requestURI has a dryRun query parameter (any
// value), exactly as url.ParseQuery would find it: pairs are split on '&', a pair holding ';'
// or an invalid escape (in its key or value) is skipped, keys are unescaped. It allocates only
// to unescape a key that holds an escape.
func (d *decoder) queryHasDryRun() bool {
	for q := d.query(); len(q) > 0; {
		var pair []byte
		if i := bytes.IndexByte(q, '&'); i >= 0 {
			pair, q = q[:i], q[i+1:]
		} else {
			pair, q = q, nil
		}
		if len(pair) == 0 || bytes.IndexByte(pair, ';') >= 0 {
			continue
		}
		key, value := pair, []byte(nil)
		if i := bytes.IndexByte(pair, '='); i >= 0 {
			key, value = pair[:i], pair[i+1:]
		}
		if !validEscapes(key) || !validEscapes(value) {
			continue
		}
		if string(key) == "dryRun" {
			return true
		}
		if bytes.IndexByte(key, '%') >= 0 || bytes.IndexByte(key, '+') >= 0 {
			if k, err := url.QueryUnescape(string(key)); err == nil && k == "dryRun" {
				return true
			}
		}
	}
	return false
}

// validEscapes reports whether every '%' of b starts an escape of two hex digits.
func validEscapes(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] == '%' {
			if i+2 >= len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) {
				return false
			}
			i += 2
		}
	}
	return true
}

// labelSelector returns the labelSelector query parameter of the event's requestURI. A
// malformed pair does not hide the others: url.ParseQuery keeps every pair it could parse.
func (d *decoder) labelSelector() string {
	q, _ := url.ParseQuery(string(d.query()))
	return q.Get("labelSelector")
}

// unsafeString views b as a string for a call that does not keep it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// isDelete reports whether verb deletes: its requestObject is a DeleteOptions.
func isDelete(verb string) bool {
	return verb == "delete" || verb == "deletecollection"
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// jsonType names the type of the JSON value at the start of v.
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
