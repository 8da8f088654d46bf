//go:build !linux

package e2e

import (
	"errors"
	"sync/atomic"
	"time"
)

var errLeanLinuxOnly = errors.New("the one-event benchmark's load generator drives its sockets with epoll: Linux only")

func leanDial(string) (int, error)  { return -1, errLeanLinuxOnly }
func leanWrite(int, []byte) error   { return errLeanLinuxOnly }
func leanClose(int)                 {}
func pinThreads(int, ...int) error  { return errLeanLinuxOnly }
func affinityOf(int) ([]int, error) { return nil, errLeanLinuxOnly }
func leanLoop([]*leanConn, *atomic.Bool, func(*leanConn, time.Duration)) error {
	return errLeanLinuxOnly
}
