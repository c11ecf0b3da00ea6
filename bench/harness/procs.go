package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/devicegate/devicegate/internal/freeport"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a server process the harness started; it stops it by PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // file with its stdout and stderr
	done chan struct{}
}

// start starts a server with its output in dir/name.log.
func start(dir, name string, env []string, prog string, args ...string) (*proc, error) {
	log := dir + "/" + name + ".log"
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command(prog, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Should the harness itself be killed, the kernel sends the server
	// SIGTERM: no server outlives the run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM to the process, and SIGKILL if it has not exited
// within 10 s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(os.Stderr, "harness: %s (pid %d) ignored SIGTERM, killing it\n", p.name, p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu returns the CPU time the process has used, user and system, all
// threads (/proc/PID/stat, in clock ticks of 10 ms).
func (p *proc) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.name, err)
	}
	// The command name (field 2) may hold spaces; fields count from
	// after its closing parenthesis: utime and stime are fields 14, 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: short /proc stat", p.name)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("%s: /proc stat: %w", p.name, err)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// clockTick is the unit of /proc/PID/stat times: USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// waitLog polls the process's log until re matches a line, and returns
// the first submatch.
func (p *proc) waitLog(re *regexp.Regexp, timeout time.Duration) (string, error) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		select {
		case <-p.done:
			return "", fmt.Errorf("%s exited at start; see %s", p.name, p.log)
		default:
		}
		f, err := os.Open(p.log)
		if err != nil {
			return "", err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				f.Close()
				return m[1], nil
			}
		}
		f.Close()
	}
	return "", fmt.Errorf("%s: no line matching %s within %s; see %s", p.name, re, timeout, p.log)
}

// waitDial polls addr until it accepts a TCP connection.
func waitDial(addr string, timeout time.Duration) error {
	var err error
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			return c.Close()
		}
	}
	return fmt.Errorf("%s not accepting connections: %w", addr, err)
}

// freePort returns a loopback address with a port free now.
func freePort() (string, error) { return freeport.Addr() }

// run runs a program to completion and returns its stdout.
func run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// findProgram finds a program on PATH or in /usr/sbin (mosquitto).
func findProgram(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if p := "/usr/sbin/" + name; isExec(p) {
		return p, nil
	}
	return "", errors.New(name + " not found (run scripts/ensure-tools.sh)")
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&0o111 != 0
}
