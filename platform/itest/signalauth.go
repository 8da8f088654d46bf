package itest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/sluicehq/sluice/platform/signalauth"
)

// SignalAuth returns a signal_auth setting with a fresh random key, for
// the signal producers and consumers of one test to share (Env.SignalAuth),
// so that tests run signed like a deployment.
func SignalAuth(t testing.TB) signalauth.Config {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return signalauth.Config{Keys: []string{"test:" + hex.EncodeToString(b[:])}}
}

// Signer opens c for a test that produces signal records itself.
func Signer(t testing.TB, c signalauth.Config) *signalauth.Auth {
	t.Helper()
	a, err := signalauth.Open(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
