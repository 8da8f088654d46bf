package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The faults a scriptFaults hook plays on calls of one script.
const (
	passThrough = iota
	// refuse fails the call before it reaches Redis: nothing is applied.
	refuse
	// loseReply sends the call, Redis applies it, and the caller is told
	// the call timed out: a reply that came after the bound.
	loseReply
)

// errFault is what a refused call fails with.
var errFault = errors.New("fault injected by the test: the call did not reach Redis")

// scriptFaults is a go-redis hook playing faults on the calls of one Lua
// script (EVALSHA or EVAL of it), and counting them. A fault is armed for
// the next n calls (arm), or for every call until disarmed (always).
type scriptFaults struct {
	sha, src string

	mu     sync.Mutex
	mode   int
	n      int // calls left to fault; < 0: every call
	calls  atomic.Int64
	faults atomic.Int64
}

func newScriptFaults(src string) *scriptFaults {
	return &scriptFaults{sha: redis.NewScript(src).Hash(), src: src}
}

// arm faults the next n calls of the script with mode (n < 0: all of them).
func (f *scriptFaults) arm(mode, n int) {
	f.mu.Lock()
	f.mode, f.n = mode, n
	f.mu.Unlock()
}

func (f *scriptFaults) ours(cmd redis.Cmder) bool {
	a := cmd.Args()
	if len(a) < 2 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return a[1] == f.sha
	case "eval":
		return a[1] == f.src
	}
	return false
}

// take reports the fault to play on one call of the script.
func (f *scriptFaults) take() int {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mode == passThrough || f.n == 0 {
		return passThrough
	}
	if f.n > 0 {
		f.n--
	}
	f.faults.Add(1)
	return f.mode
}

func (f *scriptFaults) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *scriptFaults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !f.ours(cmd) {
			return next(ctx, cmd)
		}
		switch f.take() {
		case refuse:
			cmd.SetErr(errFault)
			return errFault
		case loseReply:
			if err := next(ctx, cmd); err != nil {
				return err
			}
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return next(ctx, cmd)
	}
}

func (f *scriptFaults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		modes := make([]int, len(cmds))
		var refused bool
		for i, c := range cmds {
			if f.ours(c) {
				modes[i] = f.take()
				refused = refused || modes[i] == refuse
			}
		}
		if refused {
			// A pipeline reaches a node whole or not at all.
			for _, c := range cmds {
				c.SetErr(errFault)
			}
			return errFault
		}
		err := next(ctx, cmds)
		for i, c := range cmds {
			if modes[i] == loseReply && c.Err() == nil {
				c.SetErr(context.DeadlineExceeded)
				err = context.DeadlineExceeded
			}
		}
		return err
	}
}
