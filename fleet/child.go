package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/server"
)

// childLogLines is how much of a child gateway's log is kept for error
// messages.
const childLogLines = 40

var (
	childMQTTRE  = regexp.MustCompile(`msg="mqtt listening" addr=(\S+)`)
	childAdminRE = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
)

// child is a gateway the simulator runs as a child process (`gateway
// serve`), on a fixed MQTT port so that a restarted one is found at the
// same address.
type child struct {
	bin     string
	args    []string // serve flags
	dataDir string
	tmps    []string // removed at close ("" entries are skipped)
	kill    bool     // restart with SIGKILL instead of SIGTERM

	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	addr  string
	admin *admin.Client
	mu    sync.Mutex
	tail  []string
}

// startChild starts `bin serve args...` and waits until it listens.
func startChild(bin string, args []string, dataDir string, tmps []string, kill bool) (*child, error) {
	c := &child{bin: bin, args: args, dataDir: dataDir, tmps: tmps, kill: kill}
	if err := c.start(); err != nil {
		c.removeTemps()
		return nil, err
	}
	return c, nil
}

// removeTemps removes the child's temporary directories.
func (c *child) removeTemps() {
	for _, d := range c.tmps {
		if d != "" {
			os.RemoveAll(d)
		}
	}
}

func (c *child) start() error {
	cmd := exec.Command(c.bin, append([]string{"serve"}, c.args...)...)
	cmd.SysProcAttr = childAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start gateway %s: %w", c.bin, err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	mqttc, adminc := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.tail = append(c.tail, line)
			if len(c.tail) > childLogLines {
				c.tail = c.tail[1:]
			}
			c.mu.Unlock()
			if m := childMQTTRE.FindStringSubmatch(line); m != nil {
				mqttc <- m[1]
			}
			if m := childAdminRE.FindStringSubmatch(line); m != nil {
				adminc <- m[1]
			}
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	timeout := time.After(15 * time.Second)
	for got := 0; got < 2; got++ {
		select {
		case c.addr = <-mqttc:
		case a := <-adminc:
			token, err := os.ReadFile(filepath.Join(c.dataDir, admin.TokenFile))
			if err != nil {
				c.stop(true)
				return fmt.Errorf("child gateway: admin token: %w", err)
			}
			c.admin = adminClient(a, strings.TrimSpace(string(token)))
		case <-c.done:
			return fmt.Errorf("child gateway exited at start:\n%s", c.log())
		case <-timeout:
			c.stop(true)
			return fmt.Errorf("child gateway did not listen within 15s:\n%s", c.log())
		}
	}
	return nil
}

// log returns the last lines the child logged.
func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tail, "\n")
}

// stop signals the child (SIGKILL when kill, else SIGTERM) and waits
// for it to exit.
func (c *child) stop(kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-c.done:
	case <-time.After(2 * server.ShutdownTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("child gateway did not stop on %v within %s; killed", sig, 2*server.ShutdownTimeout)
	}
	if !kill && !c.cmd.ProcessState.Success() {
		return fmt.Errorf("child gateway exited with %v:\n%s", c.cmd.ProcessState, c.log())
	}
	return nil
}

func (c *child) mqttAddr() string { return c.addr }

func (c *child) setQuota(ctx context.Context, device string, q devicelimit.Quota) error {
	return putQuota(ctx, c.admin, device, q)
}

func (c *child) restarter() func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := c.stop(c.kill); err != nil {
			return err
		}
		return c.start()
	}
}

func (c *child) close(context.Context) error {
	err := c.stop(false)
	c.removeTemps()
	return err
}
