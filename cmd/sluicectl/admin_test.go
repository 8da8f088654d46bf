package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAdminSendsAuthenticatedActionAndPrintsAnswer(t *testing.T) {
	var got map[string]any
	var path, auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, auth = r.URL.Path, r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &got)
		w.Write([]byte(`{"request_id":"r1","changed":true}`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runAdminTo(context.Background(), []string{"override", "-url", srv.URL, "-token", "tok", "-tenant", "acme",
		"-model", "gpt-4o", "-quota", "daily_tokens", "-limit", "0", "-expires", "2h", "-reason", "leaked key"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if path != "/admin/v1/overrides/set" || auth != "Bearer tok" {
		t.Fatalf("path %q auth %q", path, auth)
	}
	want := map[string]any{"tenant": "acme", "model": "gpt-4o", "quota": "daily_tokens", "limit": 0.0, "expires_in": "2h", "reason": "leaked key"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (request %v)", k, got[k], v, got)
		}
	}
	if !strings.Contains(out.String(), `"request_id": "r1"`) {
		t.Fatalf("output %q", out.String())
	}
}

func TestAdminRefusesIncompleteChangesBeforeCalling(t *testing.T) {
	called := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true }))
	defer srv.Close()
	err := runAdminTo(context.Background(), []string{"blacklist", "-url", srv.URL, "-token", "tok", "-tenant", "acme"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-reason") || !strings.Contains(err.Error(), "-expires") {
		t.Fatalf("error %v", err)
	}
	if called {
		t.Fatal("incomplete request was sent")
	}
}

func TestAdminReportsTheServersError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":{"message":"expires_at: beyond the limit of 90 days ahead"}}`))
	}))
	defer srv.Close()
	err := runAdminTo(context.Background(), []string{"trip", "-url", srv.URL, "-token", "tok", "-tenant", "acme", "-reason", "x", "-expires", "9999h"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "90 days") {
		t.Fatalf("error %v", err)
	}
}
