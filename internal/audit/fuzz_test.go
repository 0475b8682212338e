package audit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzDecode checks that no body makes Decode panic, and that a body it accepts is accounted
// for: every event is either kept as a fact or dropped with a reason.
func FuzzDecode(f *testing.F) {
	for _, dir := range []string{"testdata", filepath.Join("testdata", "handmade")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","verb":"deletecollection","requestURI":"/x?labelSelector=%zz","objectRef":{"resource":"r"},"responseStatus":{"code":200},"responseObject":{"items":7,"details":"x"}}]}`))
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","verb":"delete","objectRef":{"resource":"r"},"responseStatus":{"code":200},"responseObject":{"kind":"Status","details":[1]}}]}`))
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","verb":"delete","objectRef":{"resource":"r"},"responseStatus":{"code":200},"requestObject":{"dryRun":["All"]},"responseObject":{"kind":"Status","apiVersion":"v1"}},null,7]}`))
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","verb":"create","objectRef":{"resource":"r"},"responseStatus":{"code":201},"responseObject":{"kind":"Status","apiVersion":"example.com/v1","Metadata":"x","metadata":{"uid":"u"},"METADATA":{"uid":"v"}}}]}`))
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","v\u0065rb":"create","objectRef":{"resource":"r","resource":"s"},"responseStatus":{"code":2e2},"responseObject":{"metadata":{"uid":"\ud800\udc00"}}}]}`))
	f.Add([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stage":"ResponseComplete","verb":"deletecollection","requestURI":"/x?dry%52un\u0026labelSelector=a","objectRef":{"resource":"r"},"responseStatus":{"code":200},"requestObject":{"dryRun":[]},"responseObject":{"items":[null,{"metadata":{"uid":"u"}},{"metadata":null}]}}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		facts, stats, err := Decode(bytes.NewReader(body), "fuzz")
		// The tokenizer accepts exactly what encoding/json accepts.
		if valid := json.Valid(body); valid != (err == nil || !strings.Contains(err.Error(), "invalid JSON")) {
			t.Fatalf("json.Valid says %v, Decode says %v", valid, err)
		}
		if err != nil {
			if facts != nil {
				t.Fatalf("facts returned with error %v", err)
			}
			return
		}
		dropped := 0
		for _, n := range stats.Dropped {
			dropped += n
		}
		if stats.Kept != len(facts) || stats.Kept+dropped != stats.Events {
			t.Fatalf("stats %+v do not account for %d facts", stats, len(facts))
		}
		if len(stats.Malformed) != stats.Dropped[DropMalformed] {
			t.Fatalf("stats %+v: %d malformed events named, %d counted", stats, len(stats.Malformed), stats.Dropped[DropMalformed])
		}
		for _, fact := range facts {
			if fact.Route != "fuzz" || fact.Resource == "" {
				t.Fatalf("incomplete fact %+v", fact)
			}
		}
	})
}
