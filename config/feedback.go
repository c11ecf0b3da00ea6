package config

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/devicegate/devicegate/devicelimit"
)

// Feedback is a quota's feedback key (docs/device-feedback.md): off,
// refusals, always, or {below: 25%}.
type Feedback struct{ devicelimit.Feedback }

// parseFeedback reads a feedback node; the message says what is wrong,
// "" when nothing is.
func parseFeedback(n *yaml.Node) (devicelimit.Feedback, string) {
	bad := fmt.Sprintf("must be off, refusals, always or {below: N%%} with N from 1 to 100 (got %s)", describe(n))
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() != "!!str" {
			return devicelimit.Feedback{}, bad
		}
		f, err := devicelimit.ParseFeedbackMode(n.Value)
		if err != nil {
			return f, bad
		}
		return f, ""
	case yaml.MappingNode:
		if len(n.Content) != 2 || n.Content[0].Value != "below" || n.Content[1].Kind != yaml.ScalarNode {
			return devicelimit.Feedback{}, bad
		}
		f, err := devicelimit.ParseFeedbackBelow(n.Content[1].Value)
		if err != nil {
			return f, bad
		}
		return f, ""
	}
	return devicelimit.Feedback{}, bad
}

// UnmarshalYAML reads the feedback key.
func (f *Feedback) UnmarshalYAML(n *yaml.Node) error {
	v, msg := parseFeedback(n)
	if msg != "" {
		return fmt.Errorf("line %d: %s", n.Line, msg)
	}
	f.Feedback = v
	return nil
}

// MarshalYAML writes the feedback as the key reads it.
func (f Feedback) MarshalYAML() (any, error) {
	if f.Mode == devicelimit.FeedbackBelow {
		return map[string]string{"below": fmt.Sprintf("%d%%", f.Below)}, nil
	}
	return f.String(), nil
}
