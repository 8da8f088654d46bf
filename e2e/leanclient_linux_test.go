package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The lean load generator's sockets live outside Go's network poller:
// one OS thread waits on an epoll set of up to 64 connections and
// answers each readiness with one read and, once an answer is whole, one
// write. Per request that is two system calls and a share of an
// epoll_wait, where a goroutine per connection also paid the poller's
// wake-ups and the scheduler's hand-offs; what the client costs is CPU
// the server and the broker on the same cores do not get.

// leanDial connects a socket (blocking: the server is on loopback), then
// makes it non-blocking for leanLoop, with TCP_NODELAY as Go's net
// package sets it.
func leanDial(addr string) (int, error) {
	ta, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		return -1, err
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	sa := &syscall.SockaddrInet4{Port: ta.Port}
	copy(sa.Addr[:], ta.IP.To4())
	for _, step := range []func() error{
		func() error { return syscall.Connect(fd, sa) },
		func() error { return syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1) },
		func() error { return syscall.SetNonblock(fd, true) },
	} {
		if err := step(); err != nil {
			_ = syscall.Close(fd)
			return -1, fmt.Errorf("connect to %s: %w", addr, err)
		}
	}
	return fd, nil
}

// leanWrite writes a whole request. The socket's send buffer is empty
// (the previous request was answered), so one write takes it all.
func leanWrite(fd int, p []byte) error {
	n, err := syscall.Write(fd, p)
	if err != nil {
		return fmt.Errorf("lean client: write: %w", err)
	}
	if n < len(p) {
		return fmt.Errorf("lean client: wrote %d of the request's %d bytes", n, len(p))
	}
	return nil
}

func leanClose(fd int) { _ = syscall.Close(fd) }

// leanLoop keeps one request in flight on each of conns until stop is
// set, calling onAnswer with each whole answer's latency (from the
// request's write to the read that completed its answer). It runs on its
// own OS thread and returns the first error.
func leanLoop(conns []*leanConn, stop *atomic.Bool, onAnswer func(c *leanConn, took time.Duration)) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("lean client: epoll_create1: %w", err)
	}
	defer syscall.Close(ep)
	for i, c := range conns {
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}); err != nil {
			return fmt.Errorf("lean client: epoll_ctl: %w", err)
		}
		if err := c.send(); err != nil {
			return err
		}
	}
	events := make([]syscall.EpollEvent, len(conns))
	for !stop.Load() {
		n, err := syscall.EpollWait(ep, events, 50) // ms: how soon stop is seen when nothing is answered
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("lean client: epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			c := conns[ev.Fd]
			r, err := syscall.Read(c.fd, c.buf[len(c.buf):cap(c.buf)])
			if errors.Is(err, syscall.EAGAIN) {
				continue
			}
			if err != nil {
				return fmt.Errorf("lean client: read: %w", err)
			}
			if r == 0 {
				return errors.New("lean client: the server closed a connection")
			}
			c.buf = c.buf[:len(c.buf)+r]
			done, err := c.answered()
			if err != nil {
				return err
			}
			if done {
				onAnswer(c, time.Since(c.sent))
				if err := c.send(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// pinThreads sets the CPU affinity of every thread of process pid to
// cpus. A thread that ended meanwhile is skipped.
func pinThreads(pid int, cpus ...int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}

// affinityOf returns the CPUs process pid (its main thread) may run on.
func affinityOf(pid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil, err
	}
	cpus := make([]int, 0, set.Count())
	for c := 0; len(cpus) < cap(cpus); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
