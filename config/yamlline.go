package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// yamlParserProblems are the problems gopkg.in/yaml.v3 (v3.0.1,
// parserc.go) reports as parser errors. Its decode.go prints a parser
// error's line 0-based (it adds one for scanner errors only), and no
// line at all for one on the first line: "line 1" for an error on line
// 2.
var yamlParserProblems = []string{
	"did not find expected <stream-start>",
	"did not find expected <document start>",
	"found undefined tag handle",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// yamlSyntaxError returns err, a syntax error of yaml.v3, with the line
// of a parser error counted from 1 as an editor counts it.
func yamlSyntaxError(err error) error {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	for _, p := range yamlParserProblems {
		if strings.HasPrefix(m[2], p) {
			line := 0
			if m[1] != "" {
				line, _ = strconv.Atoi(m[1])
			}
			return fmt.Errorf("yaml: line %d: %s", line+1, m[2])
		}
	}
	return err
}
