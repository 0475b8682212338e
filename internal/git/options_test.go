package git

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/gittest"
)

func TestNewWorkerValidation(t *testing.T) {
	key, _ := gittest.NewSSHKey(t)
	_, host := gittest.NewSSHKey(t)
	sshCreds := Credentials{SSHKey: key, KnownHosts: gittest.KnownHostsLine("example.com:22", host)}
	valid := func() Options { return testOptions("file:///tmp/remote.git") }
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "valid", mutate: func(*Options) {}},
		{name: "https", mutate: func(o *Options) { o.URL = "https://git.example.com/org/repo.git" }},
		{name: "no URL", mutate: func(o *Options) { o.URL = "" }, wantErr: "git: Options.URL is required"},
		{name: "ssh URL", mutate: func(o *Options) { o.URL = "ssh://git@example.com/repo.git"; o.Credentials = sshCreds }},
		{name: "scp-like URL", mutate: func(o *Options) { o.URL = "git@example.com:org/repo.git"; o.Credentials = sshCreds }},
		{name: "ssh URL without key", mutate: func(o *Options) { o.URL = "ssh://example.com/repo.git" }, wantErr: "git: an ssh remote needs Credentials.SSHKey"},
		{name: "ssh URL without known_hosts", mutate: func(o *Options) {
			o.URL = "git@example.com:repo.git"
			o.Credentials = Credentials{SSHKey: sshCreds.SSHKey}
		}, wantErr: "git: an ssh remote needs Credentials.KnownHosts"},
		{name: "ssh key that does not parse", mutate: func(o *Options) {
			o.URL = "git@example.com:repo.git"
			o.Credentials = Credentials{SSHKey: []byte("hunter2"), KnownHosts: sshCreds.KnownHosts}
		}, wantErr: "git: the SSH private key does not parse"},
		{name: "known_hosts that does not parse", mutate: func(o *Options) {
			o.URL = "git@example.com:repo.git"
			o.Credentials = Credentials{SSHKey: sshCreds.SSHKey, KnownHosts: []byte("example.com ssh-ed25519 hunter2")}
		}, wantErr: "git: known_hosts does not parse"},
		{name: "ssh URL with password", mutate: func(o *Options) { o.URL = "ssh://git:hunter2@example.com/repo.git" }, wantErr: "must not carry a password"},
		{name: "URL with password", mutate: func(o *Options) { o.URL = "https://u:hunter2@example.com/r.git" }, wantErr: "git: Options.URL must not contain user info; use Options.Credentials"},
		{name: "https without host", mutate: func(o *Options) { o.URL = "https:///r.git" }, wantErr: "git: Options.URL has no host"},
		{name: "no branch", mutate: func(o *Options) { o.Branch = "" }, wantErr: "git: Options.Branch is required"},
		{name: "full ref", mutate: func(o *Options) { o.Branch = "refs/heads/main" }, wantErr: "git: Options.Branch \"refs/heads/main\" must be a short branch name"},
		{name: "bad branch", mutate: func(o *Options) { o.Branch = "a..b" }, wantErr: "git: Options.Branch \"a..b\" is not a valid branch name"},
		{name: "no committer name", mutate: func(o *Options) { o.Committer.Name = "" }, wantErr: "git: Options.Committer.Name is required"},
		{name: "bad committer email", mutate: func(o *Options) { o.Committer.Email = "a<b" }, wantErr: "git: Options.Committer.Email"},
		{name: "zero window", mutate: func(o *Options) { o.CommitWindow = 0 }, wantErr: "git: Options.CommitWindow must be > 0"},
		{name: "negative window", mutate: func(o *Options) { o.CommitWindow = -time.Second }, wantErr: "git: Options.CommitWindow must be > 0"},
		{name: "no email domain", mutate: func(o *Options) { o.AuthorEmailDomain = "" }, wantErr: "git: Options.AuthorEmailDomain is required"},
		{name: "email as domain", mutate: func(o *Options) { o.AuthorEmailDomain = "a@b" }, wantErr: "git: Options.AuthorEmailDomain \"a@b\" must be a bare domain"},
		{name: "bad CA bundle", mutate: func(o *Options) { o.Credentials.CABundle = []byte("nope") }, wantErr: "git: Options.Credentials.CABundle holds no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.mutate(&o)
			w, err := NewWorker(o)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), "hunter2")
				require.Nil(t, w)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, w)
		})
	}
}

func TestCredentialsAreRedacted(t *testing.T) {
	creds := Credentials{Username: "robot-user-name", Password: "s3cr3t-token-value", CABundle: []byte("x"),
		SSHKey: []byte("ssh-private-key-material"), KnownHosts: []byte("host ssh-ed25519 AAAA")}
	opts := Options{URL: "https://example.com/r.git", Credentials: creds}

	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("creds", "credentials", creds, "options", opts)
	text := slog.New(slog.NewTextHandler(&logs, nil))
	text.Info("creds", "credentials", creds)

	for _, s := range []string{
		creds.String(),
		fmt.Sprintf("%v", creds),
		fmt.Sprintf("%+v", creds),
		fmt.Sprintf("%#v", creds),
		fmt.Sprintf("%v", opts),
		fmt.Sprintf("%+v", opts),
		logs.String(),
	} {
		require.NotContains(t, s, creds.Password)
		require.NotContains(t, s, creds.Username)
		require.NotContains(t, s, string(creds.SSHKey))
	}
	require.Contains(t, creds.String(), "Password:<redacted>")
	require.Contains(t, logs.String(), `"password_set":true`)
	require.True(t, strings.Contains(Credentials{}.String(), "Password:<empty>"))
}

func TestDefaultBackoff(t *testing.T) {
	got := []time.Duration{}
	for attempt := 1; attempt <= 9; attempt++ {
		got = append(got, defaultBackoff(attempt))
	}
	require.Equal(t, []time.Duration{
		time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute,
	}, got)
}
