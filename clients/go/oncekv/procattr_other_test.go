//go:build !linux
// +build !linux

package oncekv

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
