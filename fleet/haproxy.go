package fleet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// HAProxy is an haproxy process in TCP mode in front of the gateways.
type HAProxy struct {
	// Addr is where devices connect.
	Addr string
	*Proc
}

var (
	bindRE   = regexp.MustCompile(`(?m)^(\s*bind\s+)(\S+)`)
	serverRE = regexp.MustCompile(`(?m)^(\s*server\s+\S+\s+)(\S+)`)
)

// HAProxyConfig returns the configuration doc (as docs/operations.md
// gives it) with its bind address replaced by listen and its server
// lines' addresses by the gateways', in order. More gateways than server
// lines get lines like the last one, named gwN (as the documented ones
// are); it fails when doc has not one bind line, or more server lines
// than gateways.
func HAProxyConfig(doc, listen string, gateways []string) (string, error) {
	if n := len(bindRE.FindAllString(doc, -1)); n != 1 {
		return "", fmt.Errorf("haproxy configuration: %d bind lines, want 1", n)
	}
	lines := serverRE.FindAllStringIndex(doc, -1)
	if len(lines) == 0 || len(lines) > len(gateways) {
		return "", fmt.Errorf("haproxy configuration: %d server lines for %d gateways", len(lines), len(gateways))
	}
	last := lines[len(lines)-1]
	end := last[1] + strings.IndexByte(doc[last[1]:]+"\n", '\n')
	lastLine := doc[last[0]:end]
	var more strings.Builder
	for k := len(lines); k < len(gateways); k++ {
		more.WriteString("\n" + regexp.MustCompile(`server\s+\S+`).ReplaceAllString(lastLine, fmt.Sprintf("server gw%d", k+1)))
	}
	doc = doc[:end] + more.String() + doc[end:]
	out := bindRE.ReplaceAllString(doc, "${1}"+listen)
	i := 0
	out = serverRE.ReplaceAllStringFunc(out, func(line string) string {
		m := serverRE.FindStringSubmatch(line)
		i++
		return m[1] + gateways[i-1]
	})
	return out, nil
}

// StartHAProxy writes cfg (bound to listen, see HAProxyConfig) to dir
// and runs haproxy in the foreground until it accepts connections at
// listen.
func StartHAProxy(dir, listen, cfg string) (*HAProxy, error) {
	file := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	check, err := Tool("haproxy")
	if err != nil {
		return nil, err
	}
	if out, err := exec.Command(check, "-c", "-q", "-f", file).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: the configuration is refused: %v\n%s", err, out)
	}
	p, err := StartProc("haproxy", "-db", "-f", file)
	if err != nil {
		return nil, err
	}
	err = p.waitReady(15*time.Second, func() error {
		c, err := net.DialTimeout("tcp", listen, 200*time.Millisecond)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		return nil, err
	}
	return &HAProxy{Addr: listen, Proc: p}, nil
}

// DocHAProxyConfigs returns the fenced ```haproxy blocks of a Markdown
// document, in order.
func DocHAProxyConfigs(markdown string) []string {
	var out []string
	rest := markdown
	for {
		_, after, ok := strings.Cut(rest, "```haproxy\n")
		if !ok {
			return out
		}
		block, tail, ok := strings.Cut(after, "```")
		if !ok {
			return out
		}
		out = append(out, block)
		rest = tail
	}
}
