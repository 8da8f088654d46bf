package itest

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing the test with "timed out
// waiting for <what>" after within. It is the one way tests here wait for
// something asynchronous: no test sleeps a fixed time and then asserts.
//
// Wait for the state a user observes (a counter after the code that updates
// it, not a callback that runs before it), or the test races the code.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyNoError(t, within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// EventuallyNoError is Eventually for conditions that say why they do not
// hold yet: the last error is part of the failure message.
func EventuallyNoError(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := 5 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if err == errNotYet {
				t.Fatalf("timed out after %v waiting for %s", within, what)
			}
			t.Fatalf("timed out after %v waiting for %s: %v", within, what, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

type notYet struct{}

func (notYet) Error() string { return "condition not met" }

var errNotYet error = notYet{}
