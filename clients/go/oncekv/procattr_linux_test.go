package oncekv

import "syscall"

// The cluster dies with the test binary, even when a test timeout kills it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
