package sidebyside

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// PeerBinary builds a peer's command, pkg at version, once into the
// user's cache folder (sluice-bench/<name>-<version>, outside the
// checkout) and returns the binary's path. It is built with go install,
// so with the peer's own go.mod: in a peer module its dependencies would
// be raised to Sluice's, which is not what the peer was released with
// (gubernator's daemon then fails at start).
func PeerBinary(b *testing.B, name, pkg, version string) string {
	b.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(cache, "sluice-bench", name+"-"+version)
	bin := filepath.Join(dir, filepath.Base(pkg))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", pkg+"@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building %s %s: %v\n%s", pkg, version, err, out)
	}
	return bin
}
