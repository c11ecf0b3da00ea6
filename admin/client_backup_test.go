package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestBackupFile: the copy lands at path whole; a refused or cut-short
// copy is an error that leaves neither path nor a partial file behind.
func TestBackupFile(t *testing.T) {
	const data = "bolt-file-bytes"
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer ok":
			w.Write([]byte(data))
		case "Bearer short":
			w.Header().Set("Content-Length", "100")
			w.Write([]byte(data)) // fewer bytes than promised
		default:
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		}
	}))
	defer ts.Close()
	client := func(token string) *Client {
		return &Client{Addr: strings.TrimPrefix(ts.URL, "http://"), Token: token, HTTP: &http.Client{}}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "copy.db")
	n, err := client("ok").BackupFile(context.Background(), path)
	if b, rerr := os.ReadFile(path); err != nil || n != int64(len(data)) || rerr != nil || string(b) != data {
		t.Fatalf("BackupFile = %d, %v; file %q %v", n, err, b, rerr)
	}
	os.Remove(path)

	_, err = client("bad").BackupFile(context.Background(), path)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || ae.Message != "unauthorized" {
		t.Errorf("refused: %v", err)
	}
	_, err = client("short").BackupFile(context.Background(), path)
	var te *TransportError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "backup cut short") {
		t.Errorf("cut short: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("failed copies left %v in the directory", left)
	}
	if _, err := client("ok").BackupFile(context.Background(), filepath.Join(dir, "no", "dir", "x.db")); err == nil {
		t.Error("BackupFile into a missing directory: no error")
	}
}

// TestHealth: the status and body of /healthz, healthy or not; an
// address that makes no URL is an *AddrError naming it; no answer is an
// error.
func TestHealth(t *testing.T) {
	var sick atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || r.Header.Get("Authorization") != "" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if sick.Load() {
			http.Error(w, "data file unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	}))
	addr := strings.TrimPrefix(ts.URL, "http://")
	ctx := context.Background()
	if st, body, err := Health(ctx, addr); err != nil || st != 200 || body != "ok\n" {
		t.Fatalf("healthy: %d %q %v", st, body, err)
	}
	sick.Store(true)
	if st, body, err := Health(ctx, addr); err != nil || st != 503 || body != "data file unavailable\n" {
		t.Fatalf("unhealthy: %d %q %v", st, body, err)
	}
	var ae *AddrError
	if _, _, err := Health(ctx, "127.0.0.1:80/%zz"); !errors.As(err, &ae) || !strings.Contains(err.Error(), `admin address "127.0.0.1:80/%zz"`) {
		t.Fatalf("bad address: %v", err)
	}
	ts.Close()
	if _, _, err := Health(ctx, addr); err == nil || errors.As(err, &ae) {
		t.Fatalf("closed server: %v", err)
	}
}
