package selftls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/util/cert"
)

var (
	t0          = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	testNames   = ServiceDNSNames("kubescribe", "kubescribe-audit", "kubescribe-admission", "kubescribe-metrics")
	testIPs     = []net.IP{net.ParseIP("10.96.0.50")}
	testPolicy  = Policy{DNSNames: testNames, IPs: testIPs, Validity: DefaultValidity, CAValidity: DefaultCAValidity}
	shortPolicy = Policy{DNSNames: testNames, Validity: time.Hour, CAValidity: 6 * time.Hour}
)

func plan(t *testing.T, p Policy, now time.Time, data map[string][]byte) (map[string][]byte, State, Changes, time.Time) {
	t.Helper()
	out, s, did, next, err := p.Plan(now, data)
	require.NoError(t, err)
	require.True(t, next.After(now), "the next look is in the future: %s", next)
	verifies(t, out, now)
	return out, s, did, next
}

// verifies checks that data's serving certificate is a pair with its key and verifies, at now,
// against its CA bundle for every name, as a TLS client dialling kubescribe would.
func verifies(t *testing.T, data map[string][]byte, now time.Time) {
	t.Helper()
	pair, err := tls.X509KeyPair(data[KeyCert], data[KeyKey])
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(data[KeyCABundle]))
	for _, name := range append([]string{}, leaf.DNSNames...) {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		require.NoError(t, err, name)
	}
}

func certOf(t *testing.T, pem []byte) *x509.Certificate {
	t.Helper()
	certs, err := cert.ParseCertsPEM(pem)
	require.NoError(t, err)
	return certs[0]
}

// TestPlanMints: from nothing, a CA (10 years) and a serving certificate (a year) for exactly
// the policy's names, both ECDSA P-256, the serving one for server authentication only; an
// unchanged Secret is left as it is until its serving certificate is due, at 2/3 of its life.
func TestPlanMints(t *testing.T) {
	out, s, did, next := plan(t, testPolicy, t0, nil)
	require.Equal(t, Changes{CA: true, Serving: true}, did)
	require.Equal(t, []string{KeyCABundle, KeyCAKey, KeyCert, KeyKey}, keys(out))

	require.True(t, s.Signer.IsCA)
	require.True(t, s.Signer.MaxPathLenZero)
	require.Equal(t, t0.Add(DefaultCAValidity), s.Signer.NotAfter)
	require.Contains(t, s.Signer.Subject.CommonName, "kubescribe-ca@")
	require.Equal(t, []*x509.Certificate{s.Signer}, s.Bundle)
	require.Equal(t, testNames, s.Serving.DNSNames)
	require.Equal(t, "kubescribe-audit.kubescribe.svc", s.Serving.Subject.CommonName)
	require.True(t, s.Serving.IPAddresses[0].Equal(testIPs[0]))
	require.Equal(t, t0.Add(DefaultValidity), s.Serving.NotAfter)
	require.Equal(t, t0.Add(-5*time.Minute), s.Serving.NotBefore, "back-dated for clocks a little behind")
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, s.Serving.ExtKeyUsage)
	require.False(t, s.Serving.IsCA)
	for _, c := range []*x509.Certificate{s.Signer, s.Serving} {
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		require.True(t, ok)
		require.Equal(t, elliptic.P256(), pub.Curve)
	}
	require.Equal(t, RenewAt(s.Serving), next)
	require.WithinDuration(t, t0.Add(DefaultValidity*2/3), next, 5*time.Minute)

	again, _, did, _ := plan(t, testPolicy, next.Add(-time.Second), out)
	require.False(t, did.Any())
	require.True(t, sameData(out, again), "nothing due: the Secret's content is kept byte for byte")

	renewed, s2, did, _ := plan(t, testPolicy, next, out)
	require.Equal(t, Changes{Serving: true}, did)
	require.Equal(t, out[KeyCABundle], renewed[KeyCABundle], "the CA stays")
	require.Equal(t, out[KeyCAKey], renewed[KeyCAKey])
	require.NotEqual(t, s.Serving.SerialNumber, s2.Serving.SerialNumber)
	require.NotEqual(t, out[KeyKey], renewed[KeyKey], "a new key too")
}

func keys(m map[string][]byte) []string {
	var ks []string
	for _, k := range []string{KeyCABundle, KeyCAKey, KeyNextCAKey, KeyCert, KeyKey} {
		if _, ok := m[k]; ok {
			ks = append(ks, k)
		}
	}
	return ks
}

// TestPlanReissues: a serving certificate that is missing, unreadable, not a pair with its key,
// of another CA or for other names is issued anew by the same CA; a CA that is missing or
// whose key is gone is minted anew.
func TestPlanReissues(t *testing.T) {
	out, _, _, _ := plan(t, testPolicy, t0, nil)
	other, _, _, _ := plan(t, testPolicy, t0, nil)
	edit := func(f func(map[string][]byte)) map[string][]byte {
		d := map[string][]byte{}
		for k, v := range out {
			d[k] = v
		}
		f(d)
		return d
	}
	for name, data := range map[string]map[string][]byte{
		"no tls.crt":        edit(func(d map[string][]byte) { delete(d, KeyCert) }),
		"no tls.key":        edit(func(d map[string][]byte) { delete(d, KeyKey) }),
		"garbage":           edit(func(d map[string][]byte) { d[KeyCert] = []byte("not a certificate") }),
		"another key":       edit(func(d map[string][]byte) { d[KeyKey] = other[KeyKey] }),
		"another CA's pair": edit(func(d map[string][]byte) { d[KeyCert], d[KeyKey] = other[KeyCert], other[KeyKey] }),
	} {
		t.Run(name, func(t *testing.T) {
			got, _, did, _ := plan(t, testPolicy, t0.Add(time.Hour), data)
			require.Equal(t, Changes{Serving: true}, did)
			require.Equal(t, out[KeyCABundle], got[KeyCABundle])
		})
	}
	t.Run("other names", func(t *testing.T) {
		p := testPolicy
		p.IPs = append(p.IPs, net.ParseIP("127.0.0.1"))
		_, s, did, _ := plan(t, p, t0.Add(time.Hour), out)
		require.Equal(t, Changes{Serving: true}, did)
		require.Len(t, s.Serving.IPAddresses, 2)
		p.IPs = nil
		_, s, did, _ = plan(t, p, t0.Add(time.Hour), out)
		require.Equal(t, Changes{Serving: true}, did, "a name no longer wanted is not kept")
		require.Empty(t, s.Serving.IPAddresses)
	})
	for name, data := range map[string]map[string][]byte{
		"no ca.key":      edit(func(d map[string][]byte) { delete(d, KeyCAKey) }),
		"no ca.crt":      edit(func(d map[string][]byte) { delete(d, KeyCABundle) }),
		"another ca.key": edit(func(d map[string][]byte) { d[KeyCAKey] = other[KeyCAKey] }),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, did, _ := plan(t, testPolicy, t0.Add(time.Hour), data)
			require.Equal(t, Changes{CA: true, Serving: true}, did)
		})
	}
}

// TestPlanRotatesTheCA: at 2/3 of its life the CA gets a successor, which joins the bundle at
// once while the old CA keeps signing; it signs once a serving certificate of the old one
// would be cut short, and the old CA leaves the bundle when it expires. At every step the
// serving certificate verifies against the bundle.
func TestPlanRotatesTheCA(t *testing.T) {
	p := shortPolicy // serving 1h, CA 6h
	data, first, _, _ := plan(t, p, t0, nil)
	caRenew, promote := RenewAt(first.Signer), first.Signer.NotAfter.Add(-p.Validity)
	require.True(t, caRenew.Before(promote))

	data, s, did, next := plan(t, p, caRenew, data)
	require.Equal(t, Changes{NextCA: true, Serving: true}, did, "the serving certificate (1h) was due too")
	require.Len(t, s.Bundle, 2)
	require.True(t, s.Signer.Equal(first.Signer), "the old CA still signs")
	require.NoError(t, s.Serving.CheckSignatureFrom(first.Signer))
	require.Contains(t, keys(data), KeyNextCAKey)
	successor := s.Next
	require.True(t, successor.IsCA)

	for now := next; now.Before(promote); now = next {
		data, s, did, next = plan(t, p, now, data)
		require.False(t, did.Promoted || did.NextCA || did.CA, "nothing but serving renewals before %s (at %s)", promote, now)
		require.True(t, next.Before(promote) || next.Equal(promote))
	}
	data, s, did, _ = plan(t, p, promote, data)
	require.True(t, did.Promoted)
	require.True(t, did.Serving, "a certificate of the new CA")
	require.True(t, s.Signer.Equal(successor))
	require.NoError(t, s.Serving.CheckSignatureFrom(successor))
	require.Nil(t, s.Next)
	require.NotContains(t, keys(data), KeyNextCAKey)
	require.Len(t, s.Bundle, 2, "the old CA is trusted until it expires")
	require.True(t, s.Bundle[0].Equal(successor), "the signing CA first")

	_, s, _, _ = plan(t, p, first.Signer.NotAfter, data)
	require.Len(t, s.Bundle, 1, "the expired CA is gone")
	require.True(t, s.Bundle[0].Equal(successor))
}

// TestPlanAfterADowntime: a Secret last written long ago. Past the point a successor should
// have been introduced, one is introduced but does not sign at once (the bundle naming it must
// reach the clients first): the serving certificate is cut short by the old CA's expiry. Past
// the old CA's expiry, a successor already introduced signs; without one a new CA is minted.
func TestPlanAfterADowntime(t *testing.T) {
	p := shortPolicy
	data, first, _, _ := plan(t, p, t0, nil)
	late := first.Signer.NotAfter.Add(-30 * time.Minute) // past promotion, no successor yet
	got, s, did, next := plan(t, p, late, data)
	require.Equal(t, Changes{NextCA: true, Serving: true}, did)
	require.True(t, s.Signer.Equal(first.Signer))
	require.Equal(t, first.Signer.NotAfter, s.Serving.NotAfter, "cut short by the signing CA's expiry")
	_, s2, did, _ := plan(t, p, next, got)
	require.True(t, did.Promoted, "its next look promotes the successor")
	require.NoError(t, s2.Serving.CheckSignatureFrom(s.Next))

	expired := first.Signer.NotAfter.Add(time.Minute)
	_, s3, did, _ := plan(t, p, expired, got)
	require.Equal(t, Changes{Promoted: true, Serving: true}, did, "the introduced successor signs")
	require.True(t, s3.Signer.Equal(s.Next))
	_, _, did, _ = plan(t, p, expired, data)
	require.Equal(t, Changes{CA: true, Serving: true}, did, "no successor: a new CA")
}

func TestPolicyValidate(t *testing.T) {
	require.NoError(t, testPolicy.Validate())
	require.ErrorContains(t, Policy{Validity: time.Hour, CAValidity: 3 * time.Hour}.Validate(), "at least one DNS name or IP")
	require.ErrorContains(t, Policy{DNSNames: testNames, Validity: time.Second, CAValidity: time.Hour}.Validate(), "shorter than 10s")
	require.ErrorContains(t, Policy{DNSNames: testNames, Validity: time.Hour, CAValidity: 2 * time.Hour}.Validate(), "at least three times")
}
