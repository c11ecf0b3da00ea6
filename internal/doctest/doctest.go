// Package doctest reads the project's Markdown documentation for the
// tests that keep it true: its pages, their fenced code blocks (with the
// runnable marker before a block), their headings' anchors and their
// links. Standard library only; it parses only the Markdown the pages
// use (ATX headings, ``` fences, inline links).
package doctest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Page is one Markdown file of the documentation.
type Page struct {
	// Path is the file's path relative to the repository root, with
	// forward slashes: "README.md", "docs/quotas.md".
	Path string
	Text string
}

// Pages reads README.md and every docs/*.md of the repository at root.
func Pages(root string) ([]Page, error) {
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	names = append([]string{filepath.Join(root, "README.md")}, names...)
	pages := make([]Page, 0, len(names))
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, name)
		if err != nil {
			return nil, err
		}
		pages = append(pages, Page{Path: filepath.ToSlash(rel), Text: string(b)})
	}
	return pages, nil
}

// Block is a fenced code block.
type Block struct {
	Lang string // the fence's info string: "yaml", "sh", "" ...
	Code string // the lines between the fences, each ending in "\n"
	Line int    // 1-based line of the opening fence
	// Runnable is set when the line before the fence is a runnable
	// marker: "<!-- runnable -->" gives "-", "<!-- runnable: TestX -->"
	// gives "TestX" (the test that runs it in its own way).
	Runnable string
	// Placeholders are set when the line before the fence is a template
	// marker, "<!-- template: $PASSWORD CREDS -->": the block is a
	// template, not run as written, and these words in it stand for the
	// reader's values (the prose after the block explains each).
	Placeholders []string
}

var (
	// runnableRE matches the marker line of a runnable block.
	runnableRE = regexp.MustCompile(`^<!-- runnable(?:: (\w+))? -->$`)
	// templateRE matches the marker line of a template block.
	templateRE = regexp.MustCompile(`^<!-- template: (.+?) -->$`)
)

// Blocks returns the page's fenced code blocks in order.
func (p Page) Blocks() []Block {
	var blocks []Block
	var cur *Block
	prev := ""
	for i, line := range strings.Split(p.Text, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &Block{Lang: strings.TrimSpace(line[3:]), Line: i + 1}
			if m := runnableRE.FindStringSubmatch(prev); m != nil {
				cur.Runnable = "-"
				if m[1] != "" {
					cur.Runnable = m[1]
				}
			}
			if m := templateRE.FindStringSubmatch(prev); m != nil {
				cur.Placeholders = strings.Fields(m[1])
			}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.Code += line + "\n"
		}
		prev = line
	}
	return blocks
}

// Prose returns the page's lines outside fenced code blocks, each with
// its 1-based line number.
func (p Page) Prose() map[int]string {
	out := make(map[int]string)
	in := false
	for i, line := range strings.Split(p.Text, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in {
			out[i+1] = line
		}
	}
	return out
}

// headingRE matches an ATX heading.
var headingRE = regexp.MustCompile(`^#{1,6} (.+?)\s*#*$`)

// Anchors returns the anchors GitHub gives the page's headings: lower
// case, punctuation but '-' and '_' removed, spaces made '-', a repeated
// anchor numbered "-1", "-2"...
func (p Page) Anchors() map[string]bool {
	out := make(map[string]bool)
	count := make(map[string]int)
	in := false
	for line := range strings.SplitSeq(p.Text, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if in || m == nil {
			continue
		}
		a := Slug(m[1])
		if n := count[a]; n > 0 {
			a += "-" + strconv.Itoa(n)
		}
		count[Slug(m[1])]++
		out[a] = true
	}
	return out
}

// Slug is GitHub's anchor of a heading's text.
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetter(r rune) bool { return strings.ToLower(string(r)) != strings.ToUpper(string(r)) }

// Link is an inline link of the page's prose.
type Link struct {
	Target string // as written: "quotas.md#the-window", "#sizing", "https://..."
	Line   int
}

// linkRE matches an inline Markdown link's target; code spans are
// removed before it runs.
var (
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE = regexp.MustCompile("`[^`]*`")
)

// Links returns the inline links of the page's prose (not those inside
// code blocks or code spans).
func (p Page) Links() []Link {
	var links []Link
	prose := p.Prose()
	lines := make([]int, 0, len(prose))
	for n := range prose {
		lines = append(lines, n)
	}
	slices.Sort(lines)
	for _, n := range lines {
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(prose[n], ""), -1) {
			links = append(links, Link{Target: m[1], Line: n})
		}
	}
	return links
}

// CodeSpans returns the inline code spans of the page's prose, each
// with its line.
func (p Page) CodeSpans() map[int][]string {
	out := make(map[int][]string)
	for n, line := range p.Prose() {
		for _, s := range codeSpanRE.FindAllString(line, -1) {
			out[n] = append(out[n], strings.Trim(s, "`"))
		}
	}
	return out
}
