package main

import (
	"bytes"
	"os"
	"testing"
)

// TestConfigurationReferenceIsCurrent keeps docs/configuration.md equal to
// what the loader registers. After changing a setting run
// `go run ./cmd/sluice config-reference > docs/configuration.md`.
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	var b bytes.Buffer
	if err := writeReference(&b); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b.Bytes()) {
		t.Fatal("docs/configuration.md is out of date: run `go run ./cmd/sluice config-reference > docs/configuration.md`")
	}
}
