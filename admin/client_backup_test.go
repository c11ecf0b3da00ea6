package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
