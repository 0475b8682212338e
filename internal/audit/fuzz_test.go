package audit

import (
	"bytes"
	"os"
	"path/filepath"
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
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		facts, stats, err := Decode(bytes.NewReader(body), "fuzz")
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
