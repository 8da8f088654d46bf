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

// StartPeer starts the peer's binary bin with env added to this process's
// environment, its output in a log file of the benchmark's, and stops it
// when the benchmark ends (the log is shown if the benchmark failed). It
// returns the process, whose pid charges the peer's CPU.
func StartPeer(b *testing.B, bin string, env ...string) *os.Process {
	b.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	log, err := os.Create(filepath.Join(b.TempDir(), filepath.Base(bin)+".log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if b.Failed() {
			out, _ := os.ReadFile(log.Name())
			b.Logf("%s's log:\n%s", filepath.Base(bin), out)
		}
	})
	return cmd.Process
}
