package app

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServerAdvertisesSmallHTTP2Frames: the listeners tell HTTP/2 clients to send frames of
// at most 16 KiB, so a connection's read buffer stays that small, and a body far larger than
// a frame still arrives whole.
func TestServerAdvertisesSmallHTTP2Frames(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got.Store(int64(len(b)))
	}), slog.New(slog.DiscardHandler))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	// The server's first frame is its SETTINGS (RFC 9113, 3.4): read SETTINGS_MAX_FRAME_SIZE.
	conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "h2", conn.ConnectionState().NegotiatedProtocol)
	_, err = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	require.NoError(t, err)
	header := make([]byte, 9)
	_, err = io.ReadFull(conn, header)
	require.NoError(t, err)
	require.Equal(t, byte(0x4), header[3], "the first frame is SETTINGS")
	payload := make([]byte, int(header[0])<<16|int(header[1])<<8|int(header[2]))
	_, err = io.ReadFull(conn, payload)
	require.NoError(t, err)
	maxFrame := uint32(16384) // the protocol's default when the setting is absent
	for s := payload; len(s) >= 6; s = s[6:] {
		if binary.BigEndian.Uint16(s) == 0x5 { // SETTINGS_MAX_FRAME_SIZE
			maxFrame = binary.BigEndian.Uint32(s[2:])
		}
	}
	require.EqualValues(t, http2ReadFrameSize, maxFrame)

	client := srv.Client()
	body := bytes.Repeat([]byte("x"), 1<<20)
	resp, err := client.Post(srv.URL, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 2, resp.ProtoMajor)
	require.EqualValues(t, len(body), got.Load())
}
